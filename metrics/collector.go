package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// collector exports a pool's figures. The gauges and pgxpool's counters come from one Stat
// snapshot per Collect; the histograms and event counters are fed by the observer between
// scrapes.
type collector struct {
	pool  *pgxlanes.Pool
	lanes []pgxlanes.Lane
	obs   *observer

	// Per lane, from LaneStat.
	inUse, borrowed, reserved, maxConns, waiters, maxWaiters, oldestWait *prometheus.Desc
	// Per lane, from the configuration, which does not change after New.
	acquireTimeout, budget *prometheus.Desc
	config                 []pgxlanes.LaneConfig

	// Pool-wide, from pgxpool's Stat.
	open, acquired, idle, constructing, maxOpen      *prometheus.Desc
	newConns, maxLifetimeDestroyed, maxIdleDestroyed *prometheus.Desc
}

// NewCollector returns a collector of pool's metrics, and adds to pool an observer that feeds
// its histograms and counters from every acquire, release and budget violation from now on. The
// observer stays on the pool for the pool's life, so call NewCollector once per pool.
//
// The metrics carry a constant label pool (see WithPoolName); those of a lane carry the label
// lane ("short", "tx", "long"); those fed by events carry a tag label only with WithTags. The
// package documentation lists them.
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
	c := &collector{
		pool:  pool,
		lanes: pgxlanes.Lanes(),

		inUse:      desc("pgxlanes_lane_in_use_connections", "Connections the lane holds now (its slots in use, including a slot whose connection is being opened).", lane),
		borrowed:   desc("pgxlanes_lane_borrowed_connections", "Connections the lane holds beyond its reserve.", lane),
		reserved:   desc("pgxlanes_lane_reserved_connections", "Connections reserved for the lane, which no other lane's unbounded work may take.", lane),
		maxConns:   desc("pgxlanes_lane_max_connections", "The lane's cap: the most connections it may hold at once.", lane),
		waiters:    desc("pgxlanes_lane_waiters", "Callers queued for a connection of the lane now.", lane),
		maxWaiters: desc("pgxlanes_lane_max_waiters", "The lane's queue bound; a caller beyond it is refused at once. 0 means unbounded.", lane),
		oldestWait: desc("pgxlanes_lane_oldest_wait_seconds", "How long the first caller in the lane's queue has waited; 0 when nobody waits.", lane),

		acquireTimeout: desc("pgxlanes_lane_acquire_timeout_seconds", "The lane's acquire timeout; 0 means none.", lane),
		budget:         desc("pgxlanes_lane_budget_seconds", "The lane's default budget for a transaction or held connection; 0 means none.", lane),

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
	c.obs = newObserver(c.lanes, &o, constLabels)
	pool.AddObserver(c.obs)
	return c
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.inUse, c.borrowed, c.reserved, c.maxConns, c.waiters, c.maxWaiters, c.oldestWait,
		c.acquireTimeout, c.budget,
		c.open, c.acquired, c.idle, c.constructing, c.maxOpen, c.newConns, c.maxLifetimeDestroyed, c.maxIdleDestroyed,
	} {
		ch <- d
	}
	for _, v := range c.obs.collectors() {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector. It takes one snapshot of the pool.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	for i, l := range c.lanes {
		ls, name := s.Lane(l), l.String()
		gauge(c.inUse, float64(ls.InUse), name)
		gauge(c.borrowed, float64(ls.Borrowed), name)
		gauge(c.reserved, float64(ls.Reserved), name)
		gauge(c.maxConns, float64(ls.MaxConns), name)
		gauge(c.waiters, float64(ls.Waiting), name)
		gauge(c.maxWaiters, float64(ls.MaxWaiters), name)
		gauge(c.oldestWait, ls.OldestWait.Seconds(), name)
		gauge(c.acquireTimeout, c.config[i].AcquireTimeout.Seconds(), name)
		gauge(c.budget, c.config[i].Budget.Seconds(), name)
	}
	gauge(c.open, float64(s.TotalConns()))
	gauge(c.acquired, float64(s.AcquiredConns()))
	gauge(c.idle, float64(s.IdleConns()))
	gauge(c.constructing, float64(s.ConstructingConns()))
	gauge(c.maxOpen, float64(s.MaxConns()))
	counter(c.newConns, s.NewConnsCount())
	counter(c.maxLifetimeDestroyed, s.MaxLifetimeDestroyCount())
	counter(c.maxIdleDestroyed, s.MaxIdleDestroyCount())
	for _, v := range c.obs.collectors() {
		v.Collect(ch)
	}
}
