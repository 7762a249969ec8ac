package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Registration is what Register set up for a pool.
type Registration struct {
	obs      *observer
	callback metric.Registration
	remove   func() // removes obs from the pool

	once sync.Once
	err  error
}

// Unregister stops the pool's figures from being reported: the callback of the asynchronous
// instruments is unregistered and the observer removed from the pool. It is safe to call more
// than once; later calls return the first one's error.
func (r *Registration) Unregister() error {
	r.once.Do(func() {
		r.remove()
		r.err = r.callback.Unregister()
	})
	return r.err
}

// Register exports pool's figures through the db.client.connection.* instruments (see the
// package documentation). The asynchronous instruments are read from one pool.Stat() per
// collection; the histograms wait_time and use_time are fed by an observer that Register adds to
// pool, from now on. create_time needs a ConnectTracer on the pool's configuration.
func Register(pool *pgxlanes.Pool, opts ...Option) (*Registration, error) {
	if pool == nil {
		return nil, errors.New("otelmetrics: Register: pool is nil")
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	cfg := pool.Config()
	if o.poolName == "" {
		cc := cfg.ConnConfig
		o.poolName = defaultPoolName(cc.Host, cc.Port, cc.Database)
	}
	m := o.provider.Meter(ScopeName)

	c := &collector{pool: pool, lanes: pgxlanes.Lanes(), maxConns: int64(cfg.MaxConns), minIdle: int64(cfg.MinIdleConns)}
	var errs []error
	upDown := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		i, err := m.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return i
	}
	c.count = upDown(countName, countUnit, countDesc)
	c.max = upDown(maxName, countUnit, maxDesc)
	c.idleMax = upDown(idleMaxName, countUnit, idleMaxDesc)
	c.idleMin = upDown(idleMinName, countUnit, idleMinDesc)
	c.pending = upDown(pendingName, pendingUnit, pendingDesc)
	c.timeouts, err = m.Int64ObservableCounter(timeoutsName, metric.WithUnit(timeoutsUnit), metric.WithDescription(timeoutsDesc))
	errs = append(errs, err)
	c.holdP99, err = m.Float64ObservableGauge(holdP99Name, metric.WithUnit(seconds), metric.WithDescription(holdP99Desc))
	errs = append(errs, err)
	c.advised, err = m.Float64ObservableGauge(advisedName, metric.WithUnit(seconds), metric.WithDescription(advisedDesc))
	errs = append(errs, err)
	ob := &observer{}
	ob.wait, err = histogram(m, waitName, waitDesc, waitBuckets)
	errs = append(errs, err)
	ob.use, err = histogram(m, useName, useDesc, useBuckets)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otelmetrics: making the instruments: %w", err)
	}

	name := PoolNameKey.String(o.poolName)
	c.poolOnly = metric.WithAttributeSet(attribute.NewSet(name))
	c.idle = metric.WithAttributeSet(attribute.NewSet(name, StateKey.String("idle")))
	for _, l := range c.lanes {
		lane := LaneKey.String(l.String())
		c.used = append(c.used, metric.WithAttributeSet(attribute.NewSet(name, lane, StateKey.String("used"))))
		c.lane = append(c.lane, metric.WithAttributeSet(attribute.NewSet(name, lane)))
		var wait [len(errorTypes)][]metric.RecordOption
		for i, et := range errorTypes {
			kvs := []attribute.KeyValue{name, lane}
			if et != "" {
				kvs = append(kvs, ErrorTypeKey.String(et))
			}
			wait[i] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
		}
		ob.waitOpts = append(ob.waitOpts, wait)
		ob.useOpts = append(ob.useOpts, []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(name, lane))})
	}

	if ob.retry, err = newRetryCounters(m, name, c.lanes); err != nil {
		return nil, err
	}

	reg, err := m.RegisterCallback(c.observe, c.count, c.max, c.idleMax, c.idleMin, c.pending, c.timeouts, c.holdP99, c.advised)
	if err != nil {
		return nil, fmt.Errorf("otelmetrics: registering the callback: %w", err)
	}
	return &Registration{obs: ob, callback: reg, remove: pool.AddObserver(ob)}, nil
}

// collector reads the asynchronous instruments from the pool. Every option with attributes is
// made in Register, so a collection allocates no attribute set.
type collector struct {
	pool              *pgxlanes.Pool
	lanes             []pgxlanes.Lane
	maxConns, minIdle int64 // from the configuration, which does not change after New

	count, max, idleMax, idleMin, pending metric.Int64ObservableUpDownCounter
	timeouts                              metric.Int64ObservableCounter
	holdP99, advised                      metric.Float64ObservableGauge // per lane, pgxlanes' own

	poolOnly, idle metric.ObserveOption   // the pool name; the pool name and state=idle
	used, lane     []metric.ObserveOption // per lane: with state=used; without state
}

// observe reports one Stat snapshot.
func (c *collector) observe(_ context.Context, o metric.Observer) error {
	s := c.pool.Stat()
	o.ObserveInt64(c.count, int64(s.IdleConns()), c.idle)
	for i, l := range c.lanes {
		ls := s.Lane(l)
		o.ObserveInt64(c.count, int64(ls.InUse), c.used[i])
		o.ObserveInt64(c.pending, int64(ls.Waiting), c.lane[i])
		o.ObserveInt64(c.timeouts, ls.Timeouts, c.lane[i])
		o.ObserveFloat64(c.holdP99, ls.HoldP99.Seconds(), c.lane[i])
		o.ObserveFloat64(c.advised, ls.AdvisedTimeout.Seconds(), c.lane[i])
	}
	o.ObserveInt64(c.max, int64(s.MaxConns()), c.poolOnly)
	o.ObserveInt64(c.idleMax, c.maxConns, c.poolOnly)
	o.ObserveInt64(c.idleMin, c.minIdle, c.poolOnly)
	return nil
}

// observer records the histograms from the pool's events. Its options are made in Register, so an
// event costs a Record and no allocation of its own.
type observer struct {
	wait, use metric.Float64Histogram
	// waitOpts[lane][outcome] and useOpts[lane] are the record options of a lane's events.
	waitOpts [][len(errorTypes)][]metric.RecordOption
	useOpts  [][]metric.RecordOption
	retry    *retryCounters // RetryTx's counters (retry.go)
}

// ObserveAcquire records the wait of every acquire, with error.type when it failed.
func (ob *observer) ObserveAcquire(e pgxlanes.AcquireEvent) {
	if int(e.Lane) < len(ob.waitOpts) {
		ob.wait.Record(context.Background(), e.Wait.Seconds(), ob.waitOpts[e.Lane][outcome(e.Err)]...)
	}
}

// ObserveRelease records how long a lease held its connection.
func (ob *observer) ObserveRelease(e pgxlanes.ReleaseEvent) {
	if int(e.Lane) < len(ob.useOpts) {
		ob.use.Record(context.Background(), e.Hold.Seconds(), ob.useOpts[e.Lane]...)
	}
}

var _ pgxlanes.Observer = (*observer)(nil)
