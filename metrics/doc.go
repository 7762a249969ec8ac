// Package metrics exports a pgxlanes pool's figures as Prometheus metrics, so that operators see
// starvation coming: per-lane in-use connections, queue depth, the oldest waiter's age,
// acquire-wait and hold-time histograms, acquire outcomes, budget actions, what the pool learned
// about slow statements, and pgxpool's connection figures. The pgxlanes package itself does not
// depend on Prometheus. The sibling package otelmetrics exports the same pool through
// OpenTelemetry.
//
//	pool, err := pgxlanes.New(ctx, dsn)
//	...
//	prometheus.MustRegister(metrics.NewCollector(pool, metrics.WithPoolName("orders")))
//
// Every gauge and counter is read from one pool.Stat() at each scrape (the pattern of
// client_golang's database/sql collector), so the counters equal Stat's figures and count from
// the pool's start, whenever the collector was made. Only the histograms are fed by the pool's
// events, from NewCollector on.
//
// Every metric carries the constant label pool. Per lane (label lane: short, tx, long):
//
//	pgxlanes_lane_in_use_connections          gauge      connections the lane holds
//	pgxlanes_lane_borrowed_connections        gauge      of those, beyond the lane's reserve
//	pgxlanes_lane_cleaning_connections        gauge      of those, being cleaned after an interrupted request
//	pgxlanes_lane_reserved_connections        gauge      the lane's reserve
//	pgxlanes_lane_max_connections             gauge      the lane's cap
//	pgxlanes_lane_waiters                     gauge      callers queued
//	pgxlanes_lane_max_waiters                 gauge      the queue's bound (0: unbounded)
//	pgxlanes_lane_oldest_wait_seconds         gauge      the first queued caller's wait so far
//	pgxlanes_lane_fleet_waiters               gauge      callers waiting for a fleet slot (Long)
//	pgxlanes_lane_fleet_slots_held            gauge      fleet slots this pool holds (Long)
//	pgxlanes_lane_acquire_timeout_seconds     gauge      the lane's acquire timeout (0: none)
//	pgxlanes_lane_budget_seconds              gauge      the lane's budget (0: none)
//	pgxlanes_acquires_total                   counter    successful acquires
//	pgxlanes_acquires_queued_total            counter    of those, the ones that queued for a slot
//	pgxlanes_acquires_wait_seconds_total      counter    their total wait
//	pgxlanes_acquire_timeouts_total           counter    ErrAcquireTimeout
//	pgxlanes_acquire_rejections_total         counter    ErrLaneFull
//	pgxlanes_acquire_cancellations_total      counter    the caller's ctx was cancelled or expired
//	pgxlanes_acquire_errors_total             counter    any other failure
//	pgxlanes_budget_warnings_total            counter    leases past half their budget (cancel, terminate lanes)
//	pgxlanes_budget_violations_total          counter    leases over budget, label action (flag, cancel, terminate)
//	pgxlanes_budget_terminate_failures_total  counter    terminations that failed
//	pgxlanes_lane_priority_age_seconds        gauge      the lane's priority age (0: FIFO)
//	pgxlanes_aged_grants_total                counter    grants by ageing, ahead of a higher priority
//	pgxlanes_tag_share_refusals_total         counter    grants that passed over a tag at its share (Tx)
//
// Per lane, fed by the pool's events (with a tag label too when WithTags is used):
//
//	pgxlanes_acquire_wait_seconds             histogram  wait of every acquire attempt, failed ones too
//	pgxlanes_hold_seconds                     histogram  how long each lease held its connection
//
// Per lane (and tag with WithTags), fed by pgxlanes.RetryTx's attempts:
//
//	pgxlanes_retry_attempts_total             counter    transactions run, every attempt counted
//	pgxlanes_retry_retries_total              counter    attempts run again, label code (SQLSTATE, conn, ...)
//	pgxlanes_retry_gave_up_total              counter    calls stopped by a cap, label reason
//	pgxlanes_retry_commit_unknown_total       counter    calls whose COMMIT had an unknown outcome
//
// Per lane and priority level (label priority: low, normal, high, critical; see
// pgxlanes.Priority.Level), fed by the pool's events:
//
//	pgxlanes_acquire_wait_by_priority_seconds histogram  wait of every acquire attempt, by priority
//
// Pool-wide, what the pool learned about unannotated statements sent to Short:
//
//	pgxlanes_learning_slow_threshold_seconds  gauge      the threshold (0: learning off)
//	pgxlanes_learning_demoted_statements      gauge      statements routed to Long's capacity now
//	pgxlanes_learning_tracked_statements      gauge      statements the pool keeps figures for
//	pgxlanes_learning_demotions_total         counter    statements learned as slow
//	pgxlanes_learning_promotions_total        counter    statements learned as fast again
//
// Pool-wide, pgxpool's figures:
//
//	pgxlanes_pool_max_connections             gauge
//	pgxlanes_pool_open_connections            gauge
//	pgxlanes_pool_acquired_connections        gauge
//	pgxlanes_pool_idle_connections            gauge
//	pgxlanes_pool_constructing_connections    gauge
//	pgxlanes_pool_new_connections_total       counter
//	pgxlanes_pool_max_lifetime_destroyed_total counter
//	pgxlanes_pool_max_idle_destroyed_total    counter
//
// The histograms have classic buckets from 100 µs to 30 s (hold time to 15 min) and native
// histograms. Recording an event does not allocate: every series the observer touches is resolved
// when the collector is created. The docs directory of the repository has the operations guide
// (what each metric means, sizing with Little's law, tuning timeouts), alert rules and a Grafana
// dashboard.
package metrics
