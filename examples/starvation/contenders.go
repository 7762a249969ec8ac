package main

// The contenders of the demo: how each builds its pools, and how their acquire waits are recorded.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// querier is what the workload needs of a pool: *pgxpool.Pool and *pgxlanes.Pool both have it.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// contenderSpec names a contender and builds its pools for one run.
type contenderSpec struct {
	name  string
	about string
	tx    bool // runs the steady and burst phases; false for pgxlanes-nolearn, which runs only the slow phase
	load  bool // runs the long transactions in them; false for the idle baseline
	slow  bool // runs the slow statements in the learn and slow phases; false for the idle baseline
	// prio runs the priority phase (priority.go), with its background work if load; the idle
	// baseline runs its critical requests alone.
	prio  bool
	build func(ctx context.Context, dsn string, cfg *config, rec *recorder) (*pools, error)
}

// pools is one contender's pools: short lookups go to short, long transactions to long.
type pools struct {
	short, long querier
	// openConns and newConns read the pools' connection counts (open: established, not still
	// connecting); close closes them.
	openConns func() int32
	newConns  func() int64
	close     func()
	// each holds every connection of the pools at once and runs f on each.
	each func(ctx context.Context, f func(*pgx.Conn) error) error
	// learning reads pgxlanes' Stat().Learning(); nil for the pgxpools.
	learning func() *learningResult
	// ages reads pgxlanes' PriorityAge of Short and Tx from its Config (0: off, FIFO) and the
	// aged grants from its Stat; nil for the pgxpools.
	ages func() laneAges
}

// holdAll acquires n connections with acquire, all at the same time, runs f on each and
// releases them.
func holdAll(ctx context.Context, n int, acquire func(context.Context) (*pgx.Conn, func(), error), f func(*pgx.Conn) error) error {
	var releases []func()
	defer func() {
		for _, r := range releases {
			r()
		}
	}()
	for range n {
		c, release, err := acquire(ctx)
		if err != nil {
			return err
		}
		releases = append(releases, release)
		if err := f(c); err != nil {
			return err
		}
	}
	return nil
}

func pgxpoolAcquire(p *pgxpool.Pool) func(context.Context) (*pgx.Conn, func(), error) {
	return func(ctx context.Context) (*pgx.Conn, func(), error) {
		c, err := p.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		return c.Conn(), c.Release, nil
	}
}

// warm runs every statement of the workload once on every connection, so that no contender is
// measured while its connections prepare statements or its server sessions fill their caches.
func warm(ctx context.Context, ps *pools, row int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return ps.each(ctx, func(c *pgx.Conn) error {
		var v string
		err := c.QueryRow(ctx, lookupSQL, row).Scan(&v)
		if err == nil {
			err = c.QueryRow(ctx, lookupWorkSQL, row, 0.0).Scan(&v)
		}
		if err == nil {
			err = c.QueryRow(ctx, lockSQL, row).Scan(&v) // outside a transaction the lock ends with the statement
		}
		if err != nil {
			return fmt.Errorf("warming up: %w", err)
		}
		return nil
	})
}

// contenderNames are the contenders, in the default order.
var contenderNames = []string{"idle", "pgxpool", "two-pool", "pgxlanes-nolearn", "pgxlanes-fifo", "pgxlanes"}

// contenders returns the contenders cfg names, in its order.
func contenders(cfg *config) ([]contenderSpec, error) {
	heavy := cfg.conns - cfg.fastConns
	threshold := "default"
	if cfg.slowThreshold > 0 {
		threshold = cfg.slowThreshold.String()
	}
	all := []contenderSpec{
		{name: "idle", about: fmt.Sprintf("pgxlanes, %d conns, default lanes, no long transactions, no slow statements (baseline)", cfg.conns),
			tx: true, prio: true, build: buildLanes(true, true)},
		{name: "pgxpool", about: fmt.Sprintf("one pgxpool of %d conns", cfg.conns), tx: true, load: true, slow: true, prio: true, build: buildPgxpool},
		{name: "two-pool", about: fmt.Sprintf("pgxpool fast %d + heavy %d conns; unannotated statements go to fast", cfg.fastConns, heavy),
			tx: true, load: true, slow: true, build: buildTwoPools},
		{name: "pgxlanes-nolearn", about: fmt.Sprintf("pgxlanes, %d conns, default lanes, learning off (lane_short_slow_threshold=0); slow phase only", cfg.conns),
			slow: true, build: buildLanes(false, true)},
		{name: "pgxlanes-fifo", about: fmt.Sprintf("pgxlanes, %d conns, default lanes, priorities off (lane_short_priority_age=0, lane_tx_priority_age=0: FIFO); priority phase only", cfg.conns),
			load: true, prio: true, build: buildLanes(true, false)},
		{name: "pgxlanes", about: fmt.Sprintf("pgxlanes, %d conns, default lanes, learning on (lane_short_slow_threshold %s), priorities on (default ages)", cfg.conns, threshold),
			tx: true, load: true, slow: true, prio: true, build: buildLanes(true, true)},
	}
	var specs []contenderSpec
next:
	for _, name := range cfg.contenders {
		for _, s := range all {
			if s.name == name {
				specs = append(specs, s)
				continue next
			}
		}
		return nil, usageError{fmt.Sprintf("-contenders: unknown contender %q (contenders are %s)", name, strings.Join(contenderNames, ", "))}
	}
	return specs, nil
}

func newPgxpool(ctx context.Context, dsn string, n int, rec *recorder) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns, pc.MinConns = int32(n), int32(n)
	pc.ConnConfig.Tracer = acquireTracer{rec}
	return pgxpool.NewWithConfig(ctx, pc)
}

// established counts a pool's established connections. TotalConns counts those still connecting
// too, and a warm-up that acquires one of those waits for it: pgxlanes' Short lane gave up after
// its 1 s acquire timeout once, under load.
func established(s interface {
	TotalConns() int32
	ConstructingConns() int32
}) int32 {
	return s.TotalConns() - s.ConstructingConns()
}

func buildPgxpool(ctx context.Context, dsn string, cfg *config, rec *recorder) (*pools, error) {
	p, err := newPgxpool(ctx, dsn, cfg.conns, rec)
	if err != nil {
		return nil, err
	}
	return &pools{short: p, long: p, close: p.Close,
		openConns: func() int32 { return established(p.Stat()) },
		newConns:  func() int64 { return p.Stat().NewConnsCount() },
		each: func(ctx context.Context, f func(*pgx.Conn) error) error {
			return holdAll(ctx, cfg.conns, pgxpoolAcquire(p), f)
		}}, nil
}

func buildTwoPools(ctx context.Context, dsn string, cfg *config, rec *recorder) (*pools, error) {
	fast, err := newPgxpool(ctx, dsn, cfg.fastConns, rec)
	if err != nil {
		return nil, err
	}
	heavy, err := newPgxpool(ctx, dsn, cfg.conns-cfg.fastConns, rec)
	if err != nil {
		fast.Close()
		return nil, err
	}
	return &pools{short: fast, long: heavy,
		close:     func() { fast.Close(); heavy.Close() },
		openConns: func() int32 { return established(fast.Stat()) + established(heavy.Stat()) },
		newConns:  func() int64 { return fast.Stat().NewConnsCount() + heavy.Stat().NewConnsCount() },
		each: func(ctx context.Context, f func(*pgx.Conn) error) error {
			if err := holdAll(ctx, cfg.fastConns, pgxpoolAcquire(fast), f); err != nil {
				return err
			}
			return holdAll(ctx, cfg.conns-cfg.fastConns, pgxpoolAcquire(heavy), f)
		}}, nil
}

// buildLanes builds a pgxlanes pool with its default lanes, learning slow statements or not,
// ordering its queues by priority (the default) or strictly FIFO.
func buildLanes(learn, priorities bool) func(ctx context.Context, dsn string, cfg *config, rec *recorder) (*pools, error) {
	return func(ctx context.Context, dsn string, cfg *config, rec *recorder) (*pools, error) {
		lc, err := pgxlanes.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		lc.MaxConns, lc.MinConns = int32(cfg.conns), int32(cfg.conns) // the lanes are sized for MaxConns
		switch {
		case !learn:
			lc.Short.SlowThreshold = pgxlanes.Off // lane_short_slow_threshold=0
		case cfg.slowThreshold > 0:
			lc.Short.SlowThreshold = cfg.slowThreshold
		}
		if !priorities {
			lc.Short.PriorityAge, lc.Tx.PriorityAge = pgxlanes.Off, pgxlanes.Off // lane_<lane>_priority_age=0
		}
		lc.ConnConfig.Tracer = slowTracer{} // a QueryTracer only: pgxlanes' observer times the acquires
		p, err := pgxlanes.NewWithConfig(ctx, lc)
		if err != nil {
			return nil, err
		}
		p.AddObserver(laneObserver{rec})
		// Short may hold every connection (its cap is MaxConns), and needs no session SET to do so.
		acquire := func(ctx context.Context) (*pgx.Conn, func(), error) {
			c, err := p.Acquire(pgxlanes.WithLane(ctx, pgxlanes.Short))
			if err != nil {
				return nil, nil, err
			}
			return c.Conn(), c.Release, nil
		}
		var short querier = p
		if lookupsOnTx {
			short = txLane{p}
		}
		return &pools{short: short, long: p, close: p.Close,
			openConns: func() int32 { return established(p.Stat()) },
			newConns:  func() int64 { return p.Stat().NewConnsCount() },
			each: func(ctx context.Context, f func(*pgx.Conn) error) error {
				return holdAll(ctx, cfg.conns, acquire, f)
			},
			learning: func() *learningResult {
				st := p.Stat()
				l := st.Learning()
				return &learningResult{ThresholdMS: ms(l.Threshold), Demoted: l.Demoted, Demotions: l.Demotions,
					Promotions: l.Promotions, LongMaxConns: st.Lane(pgxlanes.Long).MaxConns}
			},
			ages: func() laneAges {
				c, st := p.Config(), p.Stat()
				return laneAges{Short: max(c.Short.PriorityAge, 0), Tx: max(c.Tx.PriorityAge, 0),
					ShortTimeout: max(c.Short.AcquireTimeout, 0), TxTimeout: max(c.Tx.AcquireTimeout, 0),
					AgedShort: st.Lane(pgxlanes.Short).AgedGrants, AgedTx: st.Lane(pgxlanes.Tx).AgedGrants}
			}}, nil
	}
}

// txLane sends every plain query to the Tx lane: the broken build of lookupsOnTx (verdict.go).
type txLane struct{ *pgxlanes.Pool }

func (q txLane) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return q.Pool.QueryRow(pgxlanes.WithLane(ctx, pgxlanes.Tx), sql, args...)
}

// acquireTracer times pgxpool's Acquire for the calls whose context carries a phase.
type acquireTracer struct{ rec *recorder }

type acquireStartKey struct{}

func (t acquireTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	if _, ok := ctx.Value(phaseKey{}).(phase); !ok {
		return ctx
	}
	return context.WithValue(ctx, acquireStartKey{}, time.Now())
}

func (t acquireTracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	ph, ok := ctx.Value(phaseKey{}).(phase)
	start, ok2 := ctx.Value(acquireStartKey{}).(time.Time)
	if ok && ok2 && data.Err == nil {
		t.rec.acquired(ph, time.Since(start))
	}
}

func (acquireTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return slowTracer{}.TraceQueryStart(ctx, c, data)
}
func (acquireTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// slowTracer tells a slow statement's call that it has a connection and is starting (see storm).
type slowTracer struct{}

func (slowTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if c, ok := ctx.Value(slowCallKey{}).(*slowCall); ok {
		c.starting()
	}
	return ctx
}
func (slowTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// laneObserver records pgxlanes' acquire waits; the phase comes from the call's tag.
type laneObserver struct{ rec *recorder }

func (o laneObserver) ObserveAcquire(e pgxlanes.AcquireEvent) {
	if ph, ok := phaseOfTag(e.Tag); ok && e.Err == nil {
		o.rec.acquired(ph, e.Wait)
	}
}
func (laneObserver) ObserveRelease(pgxlanes.ReleaseEvent) {}

// phaseKey carries the phase of a call in its context, for acquireTracer.
type phaseKey struct{}

// phaseContext returns ctx marked with phase ph: a pgxlanes tag and a value for the tracer.
func phaseContext(ctx context.Context, ph phase) context.Context {
	return context.WithValue(pgxlanes.WithTag(ctx, ph.String()), phaseKey{}, ph)
}

// classify sorts a failed call's error.
func classify(err error) errKind {
	switch {
	case err == nil:
		return kindOK
	case errors.Is(err, pgxlanes.ErrAcquireTimeout):
		return kindAcquireTimeout
	case errors.Is(err, pgxlanes.ErrLaneFull):
		return kindLaneFull
	case errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err):
		return kindDeadline
	}
	return kindOther
}
