package integration

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// openLoop is the storm of issue 23: `lookups` clients each with one primary-key lookup due every
// `every`, latency counted from when it was due (open loop: a late lookup makes the next one late
// too, as a client's queue would), and from slowAt on, `slow` clients of an unannotated slow
// statement the pool has never seen, each running it back to back until the end.
type openLoop struct {
	lookups, slow int
	every         time.Duration
	slowAt, d     time.Duration
	slowSQL       func(i int) string // the slow statement's text for call i
	// window, if set, splits the lookups: those due in [slowAt, slowAt+window) are also kept in
	// openLoopResult.window (the learning window), the later ones in after.
	window time.Duration
	// spawn, if set, issues each lookup in a goroutine of its own (as a server does per
	// request), so that a lookup that waits delays no later one: calls keep arriving.
	spawn bool
	// lookupTimeout, if set, is each lookup's deadline (a request's).
	lookupTimeout time.Duration
}

type openLoopResult struct {
	lookups     latencies    // every lookup due from slowAt on, the learning window included
	window      latencies    // those due in the learning window (openLoop.window)
	after       latencies    // those due after it
	failedAfter atomic.Int64 // failed lookups due after the learning window
	failed      atomic.Int64
	firstErr    atomic.Pointer[error]
	slowDone    atomic.Int64
	slowErr     atomic.Int64
}

func (o openLoop) run(ctx context.Context, p rowQuerier) *openLoopResult {
	r := &openLoopResult{}
	start := time.Now()
	end := start.Add(o.d)
	slowCtx, stopSlow := context.WithDeadline(ctx, end)
	defer stopSlow()
	var wg sync.WaitGroup
	for i := range o.lookups {
		wg.Go(func() {
			for due := start.Add(time.Duration(i) * o.every / time.Duration(o.lookups)); due.Before(end); due = due.Add(o.every) {
				time.Sleep(time.Until(due))
				lookup := func() {
					lctx := ctx
					if o.lookupTimeout > 0 {
						var cancel context.CancelFunc
						lctx, cancel = context.WithTimeout(ctx, o.lookupTimeout)
						defer cancel()
					}
					err := p.QueryRow(lctx, "select v from items where id = $1", 1+(i*7+int(due.UnixNano()/int64(time.Millisecond)))%100).Scan(new(int))
					if due.Sub(start) < o.slowAt {
						return
					}
					if err != nil {
						if r.failed.Add(1) == 1 {
							r.firstErr.Store(&err)
						}
						if o.window > 0 && due.Sub(start) >= o.slowAt+o.window {
							r.failedAfter.Add(1)
						}
						return
					}
					d := time.Since(due)
					r.lookups.add(d)
					if o.window > 0 {
						if due.Sub(start) < o.slowAt+o.window {
							r.window.add(d)
						} else {
							r.after.add(d)
						}
					}
				}
				if o.spawn {
					wg.Go(lookup)
				} else {
					lookup()
				}
			}
		})
	}
	var n atomic.Int64
	for range o.slow {
		wg.Go(func() {
			time.Sleep(time.Until(start.Add(o.slowAt)))
			for slowCtx.Err() == nil {
				err := p.QueryRow(slowCtx, o.slowSQL(int(n.Add(1)))).Scan(new(any))
				switch {
				case err == nil:
					r.slowDone.Add(1)
				case slowCtx.Err() == nil:
					r.slowErr.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return r
}

// eventRecorder records the learner's events with their time.
type eventRecorder struct {
	mu     sync.Mutex
	events []pgxlanes.StatementEvent
	at     []time.Time
}

func (e *eventRecorder) ObserveAcquire(pgxlanes.AcquireEvent) {}
func (e *eventRecorder) ObserveRelease(pgxlanes.ReleaseEvent) {}
func (e *eventRecorder) ObserveStatement(ev pgxlanes.StatementEvent) {
	e.mu.Lock()
	e.events = append(e.events, ev)
	e.at = append(e.at, time.Now())
	e.mu.Unlock()
}

func (e *eventRecorder) count(sql string, demoted bool) (n int, first time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, ev := range e.events {
		if ev.SQL == sql && ev.Demoted == demoted {
			if n == 0 {
				first = e.at[i]
			}
			n++
		}
	}
	return n, first
}

// TestProbationStorm: a pool of 8 with the default lane settings; 8 lookup clients, open loop,
// one lookup due every 5 ms each; after 1 s, 12 clients start an unannotated `select pg_sleep(1.5)`
// the pool has never seen. Probation holds the new statement to one of Short's connections (half
// its reserve) until its first overrun demotes it (about the 1 s threshold): no lookup fails over
// the whole window, the learning window included. Five runs, each on a new pool; the lookup p99
// against the idle p99 of the same pool (warm) is logged per run, with the learning window's p99
// apart, and as a median with its range (the goal is 1.5×; the assertion is generous: the machine
// is shared).
func TestProbationStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("five 5 s storms")
	}
	const runs = 5
	bg := context.Background()
	dsn := newDB(t, 100)
	var ratios []float64
	for run := range runs {
		p := newLanes(t, dsn, "pool_max_conns=8&pool_min_conns=8")
		rec := &eventRecorder{}
		p.AddObserver(rec)
		// The idle baseline is taken on the warmed pool: a first second of lookups (connections
		// pinged, statements prepared) is left out, as the storm's lookups run on a warm pool.
		cfg := openLoop{lookups: 8, every: 5 * time.Millisecond, slowAt: time.Second, d: 3 * time.Second}
		idle := cfg.run(bg, p)
		idleP99, _ := idle.lookups.quantile(0.99)

		cfg = openLoop{lookups: 8, every: 5 * time.Millisecond, slow: 12, slowAt: time.Second, d: 4 * time.Second,
			window: 1500 * time.Millisecond, slowSQL: func(int) string { return "select pg_sleep(1.5)" }}
		stormStart := time.Now().Add(cfg.slowAt)
		got := cfg.run(bg, p)
		p99, n := got.lookups.quantile(0.99)
		wP99, _ := got.window.quantile(0.99)
		aP99, _ := got.after.quantile(0.99)
		demotions, at := rec.count("select pg_sleep(?)", true)
		ratio := float64(p99) / float64(idleP99)
		ratios = append(ratios, ratio)
		t.Logf("run %d: lookups from the storm's start %d, failed %d, p99 %v (idle %v, %.2fx; its first 1.5 s %v, the rest %v, max %v); slow statement demoted %v after the storm began (%d demotions), %d done, %d refused; loadavg %s",
			run+1, n, got.failed.Load(), fmtDur(p99), fmtDur(idleP99), ratio, fmtDur(wP99), fmtDur(aP99), fmtDur(got.lookups.max()),
			at.Sub(stormStart).Round(time.Millisecond), demotions, got.slowDone.Load(), got.slowErr.Load(), loadavg())
		var firstErr error
		if e := got.firstErr.Load(); e != nil {
			firstErr = *e
		}
		require.Zero(t, got.failed.Load(), "no lookup fails, the learning window included; first: %v", firstErr)
		require.Greater(t, n, 1500, "lookups were served")
		require.Equal(t, 1, demotions, "the slow statement was learned, once")
		assert.Less(t, at.Sub(stormStart), time.Second+500*time.Millisecond, "demoted at about the 1 s threshold")
		// Generous: the goal is 1.5x (logged, median of the runs); on a shared 2-core machine,
		// 5x or 50 ms per run (a machine stall of 30 ms after the demotion failed 20 ms in CI).
		assert.Less(t, p99, max(5*idleP99, 50*time.Millisecond))
		p.Close()
	}
	slices.Sort(ratios)
	t.Logf("lookup p99 / idle p99 over %d runs: median %.2fx, range %.2f–%.2fx (goal 1.5x); loadavg %s",
		runs, ratios[runs/2], ratios[0], ratios[runs-1], loadavg())
	figure(t, "probation.p99_ratio_to_idle", ratios[runs/2])
}

// shortPeak samples Short's connections in use every 5 ms until stop is closed, and returns the
// highest count seen (wait for the returned WaitGroup before reading it).
func shortPeak(p *pgxlanes.Pool, stop <-chan struct{}) (*atomic.Int32, *sync.WaitGroup) {
	var peak atomic.Int32
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			n := int32(p.Stat().Lane(pgxlanes.Short).InUse)
			for {
				old := peak.Load()
				if n <= old || peak.CompareAndSwap(old, n) {
					break
				}
			}
		}
	})
	return &peak, &wg
}

// TestProbationCap: unproven statements (here slow ones that an idle pool cannot demote: too few
// runs to compare) hold at most Short's cap less its reserve at once, and one statement at most
// half of Short's reserve (its other callers wait for its tokens); a statement with a fast run on
// record is not capped.
func TestProbationCap(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	const params = "pool_max_conns=16&lane_short_reserved=4&lane_short_max_conns=12&lane_short_slow_threshold=100ms"
	const capacity, perStmt = 8, 2 // Short's cap less its reserve; half its reserve
	// Each case on a pool of its own: the slow runs of one case would let the relative rule find
	// the next case's statement as slow as the lane, which proves it (TestRelativeRule).
	newPool := func() *pgxlanes.Pool {
		p := newLanes(t, dsn, params)
		ls := p.Stat().Learning()
		require.Equal(t, capacity, ls.Probation)
		require.Equal(t, perStmt, ls.ProbationPerStatement)
		// Probation applies once the pool has a proven statement whose reserve it keeps.
		require.NoError(t, p.QueryRow(bg, "select 1").Scan(new(any)))
		return p
	}
	run := func(p *pgxlanes.Pool, n int, sql func(i int) string) (peak int32, longAcquires int64) {
		longBefore := p.Stat().Lane(pgxlanes.Long).Acquires
		stop := make(chan struct{})
		pk, sampler := shortPeak(p, stop)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { assert.NoError(t, p.QueryRow(bg, sql(i)).Scan(new(any))) })
		}
		wg.Wait()
		close(stop)
		sampler.Wait()
		return pk.Load(), p.Stat().Lane(pgxlanes.Long).Acquires - longBefore
	}

	// Twelve new statements at once, one caller each: eight run, four wait for a token.
	peak, long := run(newPool(), 12, func(i int) string { return fmt.Sprintf("select pg_sleep(0.2) as c%d", i) })
	assert.Equal(t, int32(capacity), peak, "unproven statements held at most Short's cap less its reserve, and used it")
	assert.Zero(t, long, "a caller waiting for the cap in all is not sent away")

	// Six callers of one new statement: two run at a time (0.6 s in all, within Short's acquire
	// timeout).
	p := newPool()
	peak, long = run(p, 6, func(int) string { return "select pg_sleep(0.2) as one_statement" })
	assert.Equal(t, int32(perStmt), peak, "one unproven statement held at most half of Short's reserve")
	assert.Zero(t, long)

	// Its runs passed the 100 ms threshold, but in the learner's first window there are too few
	// runs to compare them with: not demoted. A statement proven fast by one run takes Short's
	// capacity: 12 at once.
	require.Zero(t, p.Stat().Learning().Demoted)
	require.NoError(t, p.QueryRow(bg, "select pg_sleep(0) as proven").Scan(new(any)))
	peak, long = run(p, 12, func(int) string { return "select pg_sleep(0.2) as proven" })
	assert.Equal(t, int32(12), peak, "a proven statement takes Short's capacity")
	assert.Zero(t, long)
}

// TestProbationNewFastStatements: a burst of new statements that are fast is not serialised by
// probation: 24 callers of each of 8 new statements at once (192, within Short's queue bound of 256),
// on a pool where probation applies,
// all succeed, and none waits for more than a few of its statement's first runs.
func TestProbationNewFastStatements(t *testing.T) {
	bg := context.Background()
	p := newLanes(t, newDB(t, 100), "pool_max_conns=8&pool_min_conns=8")
	require.NoError(t, p.QueryRow(bg, "select 1").Scan(new(any)))
	burst := func() *latencies {
		var lat latencies
		var wg sync.WaitGroup
		start := make(chan struct{})
		for s := range 8 {
			for i := range 24 {
				wg.Go(func() {
					<-start
					t0 := time.Now()
					sql := fmt.Sprintf("select v as c%d from items where id = $1", s)
					assert.NoError(t, p.QueryRow(bg, sql, 1+i%100).Scan(new(int)))
					lat.add(time.Since(t0))
				})
			}
		}
		close(start)
		wg.Wait()
		return &lat
	}
	first := burst() // new statements, on probation
	again := burst() // the same, proven
	p99, n := first.quantile(0.99)
	p99Again, _ := again.quantile(0.99)
	t.Logf("%d calls of 8 new statements at once: p99 %v, max %v; the same burst once proven: p99 %v; learner %+v; loadavg %s",
		n, fmtDur(p99), fmtDur(first.max()), fmtDur(p99Again), p.Stat().Learning(), loadavg())
	assert.Equal(t, 9, p.Stat().Learning().Proven, "every statement proven by its first runs")
	assert.Zero(t, p.Stat().Lane(pgxlanes.Long).Acquires, "none sent to Long")
	// Generous (shared machine): probation adds about one first run per statement, not a queue.
	assert.Less(t, p99, 3*p99Again+100*time.Millisecond)
}
