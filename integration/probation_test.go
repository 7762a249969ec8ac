package integration

import (
	"context"
	"errors"
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
}

type openLoopResult struct {
	lookups  latencies // every lookup due from slowAt on, the learning window included
	failed   atomic.Int64
	firstErr atomic.Pointer[error]
	slowDone atomic.Int64
	slowErr  atomic.Int64
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
				err := p.QueryRow(ctx, "select v from items where id = $1", 1+(i*7+int(due.UnixNano()/int64(time.Millisecond)))%100).Scan(new(int))
				if due.Sub(start) < o.slowAt {
					continue
				}
				if err != nil {
					if r.failed.Add(1) == 1 {
						r.firstErr.Store(&err)
					}
					continue
				}
				r.lookups.add(time.Since(due))
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
// the pool has never seen. Probation keeps the new statement out of a reserve's worth of Short
// until its first overrun demotes it (about the 1 s threshold): no lookup fails over the whole window,
// the learning window included. Five runs, each on a new pool; the lookup p99 against the idle
// p99 of the same pool is logged per run and as a median with its range (the goal is 1.5×; the
// assertion is generous: the machine is shared).
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
		cfg := openLoop{lookups: 8, every: 5 * time.Millisecond, d: time.Second}
		idle := cfg.run(bg, p)
		idleP99, _ := idle.lookups.quantile(0.99)

		cfg = openLoop{lookups: 8, every: 5 * time.Millisecond, slow: 12, slowAt: time.Second, d: 4 * time.Second,
			slowSQL: func(int) string { return "select pg_sleep(1.5)" }}
		stormStart := time.Now().Add(cfg.slowAt)
		got := cfg.run(bg, p)
		p99, n := got.lookups.quantile(0.99)
		demotions, at := rec.count("select pg_sleep(?)", true)
		ratio := float64(p99) / float64(idleP99)
		ratios = append(ratios, ratio)
		t.Logf("run %d: lookups from the storm's start %d, failed %d, p99 %v (idle %v, %.2fx); slow statement demoted %v after the storm began (%d demotions), %d done, %d refused; loadavg %s",
			run+1, n, got.failed.Load(), fmtDur(p99), fmtDur(idleP99), ratio, at.Sub(stormStart).Round(time.Millisecond),
			demotions, got.slowDone.Load(), got.slowErr.Load(), loadavg())
		var firstErr error
		if e := got.firstErr.Load(); e != nil {
			firstErr = *e
		}
		require.Zero(t, got.failed.Load(), "no lookup fails, the learning window included; first: %v", firstErr)
		require.Greater(t, n, 1500, "lookups were served")
		require.Equal(t, 1, demotions, "the slow statement was learned, once")
		assert.Less(t, at.Sub(stormStart), time.Second+500*time.Millisecond, "demoted at about the 1 s threshold")
		// Generous: the goal is 1.5x (logged); on a shared 2-core machine, 5x or 20 ms.
		assert.Less(t, p99, max(5*idleP99, 20*time.Millisecond))
		p.Close()
	}
	slices.Sort(ratios)
	t.Logf("lookup p99 / idle p99 over %d runs: median %.2fx, range %.2f–%.2fx (goal 1.5x); loadavg %s",
		runs, ratios[runs/2], ratios[0], ratios[runs-1], loadavg())
	figure(t, "probation.p99_ratio_to_idle", ratios[runs/2])
}

// TestProbationCap: unproven statements (here slow ones that an idle pool cannot demote) hold at
// most Short's cap less its reserve at once; a statement with a fast run on record is not capped.
func TestProbationCap(t *testing.T) {
	bg := context.Background()
	p := newLanes(t, newDB(t, 1), "pool_max_conns=16&lane_short_reserved=4&lane_short_max_conns=12&lane_short_slow_threshold=100ms")
	const capacity = 8 // Short's cap less its reserve
	// Probation applies once the pool has a proven statement whose reserve it keeps.
	require.NoError(t, p.QueryRow(bg, "select 1").Scan(new(any)))
	var peak, cur atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	var errs atomic.Int64
	for range 12 {
		wg.Go(func() {
			<-start
			if err := p.QueryRow(bg, "select pg_sleep(0.2)").Scan(new(any)); err != nil && !errors.Is(err, context.Canceled) {
				errs.Add(1)
			}
		})
	}
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			n := int32(p.Stat().Lane(pgxlanes.Short).InUse)
			cur.Store(n)
			for {
				old := peak.Load()
				if n <= old || peak.CompareAndSwap(old, n) {
					break
				}
			}
		}
	})
	close(start)
	wg.Wait()
	close(stop)
	sampler.Wait()
	assert.Zero(t, errs.Load())
	assert.LessOrEqual(t, peak.Load(), int32(capacity), "unproven statements held at most Short's cap less its reserve")
	assert.Equal(t, int32(capacity), peak.Load(), "and used it")

	// Its runs passed the 100 ms threshold, but in the learner's first window there are too few
	// runs to compare them with: not demoted. A statement proven fast by one run takes Short's
	// capacity: 12 at once.
	require.Zero(t, p.Stat().Learning().Demoted)
	require.NoError(t, p.QueryRow(bg, "select pg_sleep(0), 2").Scan(new(any), new(any)))
	require.Equal(t, 2, p.Stat().Learning().Proven) // select 1 and now this one
	peak.Store(0)
	stop = make(chan struct{})
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
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
	for range 12 {
		wg.Go(func() { assert.NoError(t, p.QueryRow(bg, "select pg_sleep(0.2), 2").Scan(new(any), new(any))) })
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	assert.Equal(t, int32(12), peak.Load(), "a proven statement takes Short's capacity")
}
