package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// The pool learns which unannotated statements are slow and keeps them out of Short's capacity.

// rowQuerier is what the storm needs of a pool: pgxlanes and pgxpool both have it.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type stormResult struct {
	lookups  *latencies // lookups that started after the learning period
	failed   int64      // lookups that failed after the learning period
	slowDone int64      // slow statements that completed
	slowErr  int64      // slow statements started after learn that the pool refused
	slowCut  int64      // slow statements still queued when the run's own deadline cut them off

	firstSlowErr error
}

// storm runs `slow` clients of an unannotated 1.5 s statement and `fast` clients of primary-key
// lookups for d, and measures the lookups that start after learn.
func storm(ctx context.Context, p rowQuerier, slow, fast int, d, learn time.Duration) stormResult {
	r := stormResult{lookups: &latencies{}}
	start := time.Now()
	stop := start.Add(d)
	var failed, slowDone, slowErr, slowCut atomic.Int64
	var firstSlowErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				c, cancel := context.WithDeadline(ctx, stop.Add(5*time.Second))
				t0 := time.Now()
				err := p.QueryRow(c, "select pg_sleep(1.5)").Scan(new(any))
				cancel()
				switch {
				case errors.Is(err, context.DeadlineExceeded):
					slowCut.Add(1)
					continue
				case err != nil && t0.Sub(start) >= learn:
					// Refused after the learning period. During it, the storm fills Short and
					// queues there, as it would in pgxpool, until the statement is learned.
					if slowErr.Add(1) == 1 {
						e := err
						firstSlowErr.Store(&e)
					}
					continue
				case err != nil:
					continue
				}
				slowDone.Add(1)
			}
		}()
	}
	for i := range fast {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			for time.Now().Before(stop) {
				t0 := time.Now()
				err := p.QueryRow(ctx, "select v from items where id = $1", 1+rng.IntN(100)).Scan(new(int))
				if t0.Sub(start) < learn {
					continue
				}
				if err != nil {
					failed.Add(1)
					continue
				}
				r.lookups.add(time.Since(t0))
			}
		}()
	}
	wg.Wait()
	r.failed, r.slowDone, r.slowErr, r.slowCut = failed.Load(), slowDone.Load(), slowErr.Load(), slowCut.Load()
	if e := firstSlowErr.Load(); e != nil {
		r.firstSlowErr = *e
	}
	return r
}

// TestUnannotatedStormIsLearned: 12 clients run an unannotated slow statement through the pool
// of 8 while 8 clients look rows up. With pgxpool (and with pgxlanes before it learned), the slow
// statements fill the pool and the lookups wait 1.5 s or fail. After a learning period of at most
// 2 s, pgxlanes serves the lookups at about their idle latency, none failing, while the slow
// statements still complete, levelled in Long's capacity.
func TestUnannotatedStormIsLearned(t *testing.T) {
	if testing.Short() {
		t.Skip("a 14 s side-by-side run")
	}
	bg := context.Background()
	const slow, fast, d, learn = 12, 8, 6 * time.Second, 2 * time.Second
	dsn := newDB(t, 100)
	lanes := newLanes(t, dsn, "pool_max_conns=8&pool_min_conns=8")
	idle := storm(bg, lanes, 0, fast, time.Second, 0)
	idleP99, _ := idle.lookups.quantile(0.99)

	got := storm(bg, lanes, slow, fast, d, learn)
	lanesP99, n := got.lookups.quantile(0.99)
	ls := lanes.Stat().Learning()

	plain := newPgxpool(t, newDB(t, 100), "pool_max_conns=8&pool_min_conns=8")
	base := storm(bg, plain, slow, fast, d, learn)
	plainP99, pn := base.lookups.quantile(0.99)

	t.Logf("idle lookups p99 %v", fmtDur(idleP99))
	t.Logf("pgxlanes after %v of learning: %d lookups, p99 %v (%.1fx idle), %d failed; slow statements: %d done, %d refused, %d still queued at the end; demoted %d (demotions %d)",
		learn, n, fmtDur(lanesP99), float64(lanesP99)/float64(idleP99), got.failed, got.slowDone, got.slowErr, got.slowCut, ls.Demoted, ls.Demotions)
	t.Logf("pgxpool: %d lookups, p99 %v, %d failed; slow statements: %d done", pn, fmtDur(plainP99), base.failed, base.slowDone)

	figure(t, "storm.idle_p99_ms", ms(idleP99))
	figure(t, "storm.pgxlanes_p99_ms", ms(lanesP99))
	figure(t, "storm.pgxpool_p99_ms", ms(plainP99))
	figure(t, "storm.ratio_to_idle", float64(lanesP99)/float64(idleP99))
	figure(t, "storm.pgxpool_ratio", float64(plainP99)/float64(lanesP99))
	assert.GreaterOrEqual(t, ls.Demotions, int64(1), "the slow statement was learned")
	assert.Zero(t, got.failed, "no lookup fails after the learning period")
	assert.Greater(t, n, 1000, "lookups were served")
	// 2x the idle p99 is the goal (the figures above and docs/design.md report the ratio); on a
	// shared 2-core machine the assertion is the goal or 10 ms, whichever is larger.
	assert.Less(t, lanesP99, max(2*idleP99, 10*time.Millisecond))
	assert.Zero(t, got.slowErr, "the slow statements are levelled, not refused; first refusal: %v", got.firstSlowErr)
	assert.Greater(t, got.slowDone, int64(0), "the slow statements still complete")
	// The comparison reproduces: with pgxpool the lookups wait behind the slow statements.
	assert.Greater(t, plainP99, 500*time.Millisecond)
}

// TestLockWaitDoesNotDemote: a lookup with a long history of fast runs that waits once on a row
// lock (600 ms, past the slow threshold) stays in Short, and keeps its latency while Long is
// saturated, where a demoted lookup would queue. The lookup that waits is the very statement
// whose history the pool keeps: the same SQL text, taking the row lock itself.
func TestLockWaitDoesNotDemote(t *testing.T) {
	bg := context.Background()
	const threshold, wait = 250 * time.Millisecond, 600 * time.Millisecond
	p := newLanes(t, newDB(t, 100), "pool_max_conns=8&lane_short_slow_threshold=250ms&lane_long_max_conns=1")
	const lookup = "select v from items where id = $1 for update"
	for i := range 50 {
		require.NoError(t, p.QueryRow(bg, lookup, 1+i%100).Scan(new(int)))
	}
	require.Equal(t, 1, p.Stat().Learning().Proven, "fast runs put the lookup on record as proven")

	// The lookup of row 1 waits on the row lock of another transaction, released after 600 ms.
	tx, err := p.Begin(bg)
	require.NoError(t, err)
	_, err = tx.Exec(bg, "select 1 from items where id = 1 for update")
	require.NoError(t, err)
	committed := make(chan error, 1)
	time.AfterFunc(wait, func() { committed <- tx.Commit(bg) })
	start := time.Now()
	require.NoError(t, p.QueryRow(bg, lookup, 1).Scan(new(int)))
	waited := time.Since(start)
	require.NoError(t, <-committed)
	t.Logf("the lookup's lock wait took %v", fmtDur(waited))
	require.GreaterOrEqual(t, waited, wait-50*time.Millisecond, "the lookup waited on the lock")
	ls := p.Stat().Learning()
	assert.Equal(t, 1, ls.Tracked, "the pool counted the lookup's slow run")
	assert.Zero(t, ls.Demoted, "a lookup that waited once stays in Short")
	assert.Zero(t, ls.Demotions)

	// Long saturated: its one connection held by an annotated report.
	held, err := p.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	defer held.Release()
	longBefore := p.Stat().Lane(pgxlanes.Long).Acquires

	var l latencies
	var failed error
	for i := range 300 {
		// Demoted, a lookup would queue behind the held report for Long's acquire timeout: each
		// is cut at 2 s, and the first failure ends the loop.
		ctx, cancel := context.WithTimeout(bg, 2*time.Second)
		t0 := time.Now()
		err := p.QueryRow(ctx, lookup, 1+i%100).Scan(new(int))
		cancel()
		if err != nil {
			failed = err
			break
		}
		l.add(time.Since(t0))
	}
	p99, n := l.quantile(0.99)
	t.Logf("lookups after the lock wait, Long saturated: %d, p99 %v", n, fmtDur(p99))
	require.NoError(t, failed, "a lookup after the lock wait")
	assert.Equal(t, 300, n)
	assert.Zero(t, p.Stat().Learning().Demoted, "the lookup still in Short")
	assert.Equal(t, longBefore, p.Stat().Lane(pgxlanes.Long).Acquires, "no lookup went to Long")
	assert.Less(t, p99, threshold)
}

// TestLearningRespectsAnnotations: WithLane always wins over what the pool learned, and learning
// can be turned off.
func TestLearningRespectsAnnotations(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	p := newLanes(t, dsn, "pool_max_conns=8&lane_short_slow_threshold=50ms")
	// Lookups run meanwhile: the learner demotes a statement that is slow relative to the rest
	// of Short's runs (in an idle pool there is nothing to compare with).
	stop := make(chan struct{})
	var lookups sync.WaitGroup
	lookups.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = p.QueryRow(bg, "select v from items where id = 1").Scan(new(int))
		}
	})
	var slowErrs atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 3 {
				if err := p.QueryRow(bg, "select pg_sleep(0.1)").Scan(new(any)); err != nil {
					slowErrs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	lookups.Wait()
	require.Zero(t, slowErrs.Load())
	require.GreaterOrEqual(t, p.Stat().Learning().Demoted, 1)
	// The demoted statement takes Long's capacity...
	before := p.Stat().Lane(pgxlanes.Long).Acquires
	require.NoError(t, p.QueryRow(bg, "select pg_sleep(0.1)").Scan(new(any)))
	assert.Equal(t, before+1, p.Stat().Lane(pgxlanes.Long).Acquires)
	// ...unless the call names a lane.
	before = p.Stat().Lane(pgxlanes.Short).Acquires
	require.NoError(t, p.QueryRow(pgxlanes.WithLane(bg, pgxlanes.Short), "select pg_sleep(0.1)").Scan(new(any)))
	assert.Equal(t, before+1, p.Stat().Lane(pgxlanes.Short).Acquires)

	off := newLanes(t, dsn, "pool_max_conns=8&lane_short_slow_threshold=0")
	for range 6 {
		require.NoError(t, off.QueryRow(bg, "select pg_sleep(0.1)").Scan(new(any)))
	}
	assert.Zero(t, off.Stat().Learning().Demotions, "learning off")
	assert.Zero(t, off.Stat().Lane(pgxlanes.Long).Acquires)
	_, err := off.Exec(bg, "select 1")
	require.False(t, errors.Is(err, pgxlanes.ErrLaneFull))
}

// TestLiteralsAreOneStatement: an unannotated storm of a slow statement whose integer literal,
// string literal and IN list change on every call (an ORM that inlines values) is learned as one
// statement: one demotion, a handful of entries, and no lookup fails.
func TestLiteralsAreOneStatement(t *testing.T) {
	if testing.Short() {
		t.Skip("a 4 s storm")
	}
	bg := context.Background()
	p := newLanes(t, newDB(t, 100), "pool_max_conns=8&pool_min_conns=8")
	rec := &eventRecorder{}
	p.AddObserver(rec)
	cfg := openLoop{lookups: 8, every: 5 * time.Millisecond, slow: 12, slowAt: time.Second, d: 4 * time.Second,
		slowSQL: func(i int) string {
			in := make([]string, 1+i%7)
			for j := range in {
				in[j] = itoa(i*10 + j)
			}
			return fmt.Sprintf("select pg_sleep(1.5) where %d > 0 and 'client-%d' <> '' and %d in (%s) /* call %d */",
				i, i, i*10, strings.Join(in, ", "), i)
		}}
	got := cfg.run(bg, p)
	ls := p.Stat().Learning()
	p99, n := got.lookups.quantile(0.99)
	demotions, _ := rec.count("select pg_sleep(?) where ? > ? and ? <> ? and ? in (?)", true)
	t.Logf("lookups %d, failed %d, p99 %v; slow: %d done, %d refused; learner: %+v; events %d; loadavg %s",
		n, got.failed.Load(), fmtDur(p99), got.slowDone.Load(), got.slowErr.Load(), ls, demotions, loadavg())
	assert.Equal(t, int64(1), ls.Demotions, "one statement learned, once")
	assert.Equal(t, 1, demotions, "its event shows the text with the literals folded")
	assert.LessOrEqual(t, ls.Tracked, 3, "one entry for the slow texts (and the lookup's)")
	assert.Zero(t, got.failed.Load(), "no lookup fails")
}
