// Package metrics exports a pgxlanes pool's figures as Prometheus metrics, so that operators see
// starvation coming: per-lane in-use connections, queue depth, the oldest waiter's age,
// acquire-wait and hold-time histograms, timeouts, rejections and budget violations, plus
// pgxpool's connection figures. The pgxlanes package itself does not depend on Prometheus.
//
//	pool, err := pgxlanes.New(ctx, dsn)
//	...
//	prometheus.MustRegister(metrics.NewCollector(pool, metrics.WithPoolName("orders")))
//
// Every metric carries the constant label pool. Per lane (label lane: short, tx, long), read from
// one snapshot of the pool at each scrape:
//
//	pgxlanes_lane_in_use_connections         gauge    connections the lane holds
//	pgxlanes_lane_borrowed_connections       gauge    of those, beyond the lane's reserve
//	pgxlanes_lane_reserved_connections       gauge    the lane's reserve
//	pgxlanes_lane_max_connections            gauge    the lane's cap
//	pgxlanes_lane_waiters                    gauge    callers queued
//	pgxlanes_lane_max_waiters                gauge    the queue's bound (0: unbounded)
//	pgxlanes_lane_oldest_wait_seconds        gauge    the first queued caller's wait so far
//	pgxlanes_lane_acquire_timeout_seconds    gauge    the lane's acquire timeout (0: none)
//	pgxlanes_lane_budget_seconds             gauge    the lane's budget (0: none)
//
// Per lane, fed by the pool's events (with a tag label too when WithTags is used):
//
//	pgxlanes_acquire_wait_seconds            histogram  wait of every acquire attempt, failed ones too
//	pgxlanes_hold_seconds                    histogram  how long each lease held its connection
//	pgxlanes_acquires_total                  counter    successful acquires
//	pgxlanes_acquire_timeouts_total          counter    ErrAcquireTimeout
//	pgxlanes_acquire_rejections_total        counter    ErrLaneFull
//	pgxlanes_acquire_cancellations_total     counter    the caller's ctx was cancelled or expired
//	pgxlanes_acquire_errors_total            counter    any other failure
//	pgxlanes_budget_warnings_total           counter    leases past half their budget (cancel, terminate lanes)
//	pgxlanes_budget_violations_total         counter    budget violations, label action
//
// Pool-wide, pgxpool's figures:
//
//	pgxlanes_pool_max_connections            gauge
//	pgxlanes_pool_open_connections           gauge
//	pgxlanes_pool_acquired_connections       gauge
//	pgxlanes_pool_idle_connections           gauge
//	pgxlanes_pool_constructing_connections   gauge
//	pgxlanes_pool_new_connections_total      counter
//	pgxlanes_pool_max_lifetime_destroyed_total counter
//	pgxlanes_pool_max_idle_destroyed_total   counter
//
// The histograms have classic buckets from 100 µs to 30 s (hold time to 15 min) and native
// histograms. Recording an event does not allocate: every series the observer touches is resolved
// when the collector is created. The docs directory of the repository has the operations guide
// (what each metric means, sizing with Little's law, tuning timeouts), alert rules and a Grafana
// dashboard.
package metrics
