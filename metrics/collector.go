package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// collector exports a pool's figures. Every gauge and counter comes from one Stat snapshot per
// Collect, so the counters count from the pool's start, whenever the collector was made; only
// the histograms are fed by the observer between scrapes.
type collector struct {
	pool   *pgxlanes.Pool
	lanes  []pgxlanes.Lane
	config []pgxlanes.LaneConfig // per lane; the configuration does not change after New
	hist   *observer

	lane       []laneMetric     // per lane, from LaneStat
	violations *prometheus.Desc // per lane and action, from LaneStat
	// Per lane, from the configuration.
	acquireTimeout, budget, priorityAge *prometheus.Desc
	// Pool-wide, from Stat.Learning.
	slowThreshold, demoted, tracked, demotions, promotions *prometheus.Desc
	// Pool-wide, from pgxpool's Stat.
	open, acquired, idle, constructing, maxOpen      *prometheus.Desc
	newConns, maxLifetimeDestroyed, maxIdleDestroyed *prometheus.Desc
}

// laneMetric is a gauge or counter read from a LaneStat.
type laneMetric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(*pgxlanes.LaneStat) float64
}

// violation is a budget action as the label action names it, and the LaneStat count of it.
type violation struct {
	action string
	count  func(*pgxlanes.LaneStat) int64
}

var violations = [...]violation{
	{pgxlanes.ActionFlag.String(), func(s *pgxlanes.LaneStat) int64 { return s.BudgetFlags }},
	{pgxlanes.ActionCancel.String(), func(s *pgxlanes.LaneStat) int64 { return s.BudgetCancels }},
	{pgxlanes.ActionTerminate.String(), func(s *pgxlanes.LaneStat) int64 { return s.BudgetTerminates }},
}

// NewCollector returns a collector of pool's metrics. Its gauges and counters are read from one
// pool.Stat() per scrape, so they count from the pool's start; its two histograms (acquire
// wait, hold time) are fed by an observer that NewCollector adds to pool and that sees the
// events from now on. The observer stays on the pool for the pool's life, so call NewCollector
// once per pool.
//
// The metrics carry a constant label pool (see WithPoolName); those of a lane carry the label
// lane ("short", "tx", "long"); the histograms carry a tag label only with WithTags. The package
// documentation lists them.
func NewCollector(pool *pgxlanes.Pool, opts ...Option) prometheus.Collector {
	return newCollector(pool, opts...)
}

func newCollector(pool *pgxlanes.Pool, opts ...Option) *collector {
	o := options{poolName: "default"}
	for _, opt := range opts {
		opt(&o)
	}
	constLabels := prometheus.Labels{"pool": o.poolName}
	lane := []string{"lane"}
	desc := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, constLabels)
	}
	gauge := func(name, help string, v func(*pgxlanes.LaneStat) float64) laneMetric {
		return laneMetric{desc(name, help, lane), prometheus.GaugeValue, v}
	}
	counter := func(name, help string, v func(*pgxlanes.LaneStat) int64) laneMetric {
		return laneMetric{desc(name, help, lane), prometheus.CounterValue, func(s *pgxlanes.LaneStat) float64 { return float64(v(s)) }}
	}
	c := &collector{
		pool:  pool,
		lanes: pgxlanes.Lanes(),
		lane: []laneMetric{
			gauge("pgxlanes_lane_in_use_connections", "Connections the lane holds now: its slots in use, including a slot whose connection is being opened or cleaned.",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.InUse) }),
			gauge("pgxlanes_lane_borrowed_connections", "Of the connections the lane holds, those beyond its reserve.",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.Borrowed) }),
			gauge("pgxlanes_lane_cleaning_connections", "Of the connections the lane holds, those being cleaned after an interrupted request (cancel request sent, replies drained); each keeps its slot until it is clean.",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.Cleaning) }),
			gauge("pgxlanes_lane_reserved_connections", "Connections reserved for the lane, which no other lane's unbounded work may take.",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.Reserved) }),
			gauge("pgxlanes_lane_max_connections", "The lane's cap: the most connections it may hold at once.",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.MaxConns) }),
			gauge("pgxlanes_lane_waiters", "Callers queued for a connection of the lane now.",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.Waiting) }),
			gauge("pgxlanes_lane_max_waiters", "The lane's queue bound; a caller beyond it is refused at once. 0 means unbounded.",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.MaxWaiters) }),
			gauge("pgxlanes_lane_oldest_wait_seconds", "How long the first caller in the lane's queue has waited; 0 when nobody waits.",
				func(s *pgxlanes.LaneStat) float64 { return s.OldestWait.Seconds() }),
			gauge("pgxlanes_lane_fleet_waiters", "Callers of the lane waiting for a fleet slot (Long with lane_long_fleet_max_conns): they hold a lane slot, not a connection.",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.FleetWaiting) }),
			gauge("pgxlanes_lane_fleet_slots_held", "Fleet slots this pool's leases of the lane hold (Long with lane_long_fleet_max_conns).",
				func(s *pgxlanes.LaneStat) float64 { return float64(s.FleetHeld) }),

			gauge("pgxlanes_lane_hold_p99_seconds", "The 99th percentile of the lane's hold times (acquire to release) over the last one to two minutes; 0 when no lease ended.",
				func(s *pgxlanes.LaneStat) float64 { return s.HoldP99.Seconds() }),
			gauge("pgxlanes_lane_advised_timeout_seconds", "The timeout the design notes advise for the lane's work: 3 × its observed hold p99. Compare with pgxlanes_lane_budget_seconds.",
				func(s *pgxlanes.LaneStat) float64 { return s.AdvisedTimeout.Seconds() }),

			counter("pgxlanes_acquires_total", "Successful acquires.",
				func(s *pgxlanes.LaneStat) int64 { return s.Acquires }),
			counter("pgxlanes_acquires_queued_total", "Successful acquires that had to queue for a slot.",
				func(s *pgxlanes.LaneStat) int64 { return s.EmptyAcquires }),
			{desc("pgxlanes_acquires_wait_seconds_total", "Total time successful acquires waited, from the call to a ready connection.", lane),
				prometheus.CounterValue, func(s *pgxlanes.LaneStat) float64 { return s.AcquireWait.Seconds() }},
			counter("pgxlanes_acquire_timeouts_total", "Acquires that failed because the lane's acquire timeout ran out (ErrAcquireTimeout).",
				func(s *pgxlanes.LaneStat) int64 { return s.Timeouts }),
			counter("pgxlanes_acquire_rejections_total", "Acquires refused at once because the lane's wait queue was full (ErrLaneFull).",
				func(s *pgxlanes.LaneStat) int64 { return s.Rejections }),
			counter("pgxlanes_acquire_cancellations_total", "Acquires abandoned because the caller's context was cancelled or its deadline passed.",
				func(s *pgxlanes.LaneStat) int64 { return s.Canceled }),
			counter("pgxlanes_acquire_errors_total", "Acquires that failed for any other reason: pool closed, a connection that could not be opened.",
				func(s *pgxlanes.LaneStat) int64 { return s.Errors }),
			counter("pgxlanes_budget_warnings_total", "Leases of a cancel or terminate lane that passed half their budget: the warning before the action.",
				func(s *pgxlanes.LaneStat) int64 { return s.BudgetWarnings }),
			counter("pgxlanes_budget_terminate_failures_total", "Terminations of leases over budget that could not be verified; the pool closed its own socket to the session instead.",
				func(s *pgxlanes.LaneStat) int64 { return s.BudgetTerminateFailures }),
			counter("pgxlanes_aged_grants_total", "Connections granted by ageing: to a caller that had waited the lane's priority age, ahead of a caller of higher priority.",
				func(s *pgxlanes.LaneStat) int64 { return s.AgedGrants }),
			counter("pgxlanes_tag_share_refusals_total", "Grants that passed over a caller whose tag held the lane's tag share while another tag waited (Tx with lane_tx_max_tag_share; in dry run, that would have).",
				func(s *pgxlanes.LaneStat) int64 { return s.TagShareRefusals }),
		},
		violations: desc("pgxlanes_budget_violations_total", "Leases that exceeded their budget, by the action taken (flag, cancel, terminate; terminate counts verified terminations only)."+
			" A lease that is cancelled and later terminated counts once for each.", []string{"lane", "action"}),

		acquireTimeout: desc("pgxlanes_lane_acquire_timeout_seconds", "The lane's acquire timeout; 0 means none.", lane),
		budget:         desc("pgxlanes_lane_budget_seconds", "The lane's default budget for a transaction or held connection; 0 means none.", lane),
		priorityAge:    desc("pgxlanes_lane_priority_age_seconds", "How long a caller may be overtaken by callers of higher priority before it is served in arrival order; 0 means the lane is FIFO.", lane),

		slowThreshold: desc("pgxlanes_learning_slow_threshold_seconds", "The run time past which an unannotated Short statement counts as slow; 0 means learning is off.", nil),
		demoted:       desc("pgxlanes_learning_demoted_statements", "Statements learned as slow now: they take Long's capacity under Short's timeouts.", nil),
		tracked:       desc("pgxlanes_learning_tracked_statements", "Statements the pool keeps figures for (bounded): proven fast ones and those with a slow history; texts that differ only in literals count once.", nil),
		demotions:     desc("pgxlanes_learning_demotions_total", "Statements learned as slow.", nil),
		promotions:    desc("pgxlanes_learning_promotions_total", "Demoted statements learned as fast again.", nil),

		open:                 desc("pgxlanes_pool_open_connections", "Open connections: acquired, idle and being opened.", nil),
		acquired:             desc("pgxlanes_pool_acquired_connections", "Connections acquired from pgxpool now.", nil),
		idle:                 desc("pgxlanes_pool_idle_connections", "Idle connections.", nil),
		constructing:         desc("pgxlanes_pool_constructing_connections", "Connections being opened.", nil),
		maxOpen:              desc("pgxlanes_pool_max_connections", "The pool's size, shared by the lanes.", nil),
		newConns:             desc("pgxlanes_pool_new_connections_total", "Connections opened.", nil),
		maxLifetimeDestroyed: desc("pgxlanes_pool_max_lifetime_destroyed_total", "Connections closed for exceeding the maximum connection lifetime.", nil),
		maxIdleDestroyed:     desc("pgxlanes_pool_max_idle_destroyed_total", "Connections closed for exceeding the maximum idle time.", nil),
	}
	cfg := pool.Config()
	for _, l := range c.lanes {
		c.config = append(c.config, *cfg.Lane(l))
	}
	c.hist = newObserver(c.lanes, &o, constLabels)
	pool.AddObserver(c.hist)
	return c
}

// descs are the collector's own descriptors, the histograms' aside.
func (c *collector) descs() []*prometheus.Desc {
	ds := []*prometheus.Desc{
		c.violations, c.acquireTimeout, c.budget, c.priorityAge,
		c.slowThreshold, c.demoted, c.tracked, c.demotions, c.promotions,
		c.open, c.acquired, c.idle, c.constructing, c.maxOpen, c.newConns, c.maxLifetimeDestroyed, c.maxIdleDestroyed,
	}
	for _, m := range c.lane {
		ds = append(ds, m.desc)
	}
	return ds
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
	c.hist.wait.Describe(ch)
	c.hist.hold.Describe(ch)
	c.hist.retry.describe(ch)
	c.hist.prio.Describe(ch)
}

// Collect implements prometheus.Collector. Every gauge and counter comes from one snapshot of the
// pool, so that they agree with each other and with pool.Stat().
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	emit := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) { emit(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v int64) { emit(d, prometheus.CounterValue, float64(v)) }

	for i, l := range c.lanes {
		ls, name := s.Lane(l), l.String()
		for _, m := range c.lane {
			emit(m.desc, m.typ, m.value(&ls), name)
		}
		for _, v := range violations {
			emit(c.violations, prometheus.CounterValue, float64(v.count(&ls)), name, v.action)
		}
		emit(c.acquireTimeout, prometheus.GaugeValue, max(c.config[i].AcquireTimeout, 0).Seconds(), name)
		emit(c.budget, prometheus.GaugeValue, max(c.config[i].Budget, 0).Seconds(), name)
		emit(c.priorityAge, prometheus.GaugeValue, max(c.config[i].PriorityAge, 0).Seconds(), name)
	}

	learn := s.Learning()
	gauge(c.slowThreshold, max(learn.Threshold, 0).Seconds())
	gauge(c.demoted, float64(learn.Demoted))
	gauge(c.tracked, float64(learn.Tracked))
	counter(c.demotions, learn.Demotions)
	counter(c.promotions, learn.Promotions)

	gauge(c.open, float64(s.TotalConns()))
	gauge(c.acquired, float64(s.AcquiredConns()))
	gauge(c.idle, float64(s.IdleConns()))
	gauge(c.constructing, float64(s.ConstructingConns()))
	gauge(c.maxOpen, float64(s.MaxConns()))
	counter(c.newConns, s.NewConnsCount())
	counter(c.maxLifetimeDestroyed, s.MaxLifetimeDestroyCount())
	counter(c.maxIdleDestroyed, s.MaxIdleDestroyCount())

	c.hist.wait.Collect(ch)
	c.hist.hold.Collect(ch)
	c.hist.retry.collect(ch)
	c.hist.prio.Collect(ch)
}
