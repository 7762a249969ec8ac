package pgxlanes

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// The tests of the sweep (sweep.go), against a real PostgreSQL: a lease whose first step is far
// off is watched only once it nears it, and the guard still acts on time.

// watchState returns whether l is published to the sweep and whether the guard watches it.
func watchState(l *lease) (published, watched bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.published, l.watched
}

// TestSweepWatchesFarLeasesInTime: a held connection of a lane whose budget is 600 ms (flag) is
// not watched at acquire; the sweep watches it before the budget, and the flag comes at the
// budget, as for a lease watched at acquire (150 ms, the second case).
func TestSweepWatchesFarLeasesInTime(t *testing.T) {
	for _, tc := range []struct {
		budget time.Duration
		eager  bool
	}{{600 * time.Millisecond, false}, {150 * time.Millisecond, true}} {
		t.Run(tc.budget.String(), func(t *testing.T) {
			p := reusePool(t, "pool_max_conns=4&lane_tx_over_budget=flag&lane_tx_budget="+tc.budget.String())
			ctx := WithLane(context.Background(), Tx)
			c, err := p.Acquire(ctx)
			require.NoError(t, err)
			defer c.Release() // a second Release does nothing; this one lets Close return if a check fails
			start := c.l.acquired
			published, watched := watchState(c.l)
			assert.Equal(t, !tc.eager, published, "published to the sweep at acquire")
			assert.Equal(t, tc.eager, watched, "watched at acquire")
			if !tc.eager {
				// Unwatched until two sweeps before its first step. The sweep cannot watch it
				// earlier, so a lease seen watched with less time gone is the sweep's error; a
				// sleep that overshoots (a loaded machine) makes the check say nothing, not fail.
				time.Sleep(tc.budget - 4*sweepEvery - start.since())
				_, watched = watchState(c.l)
				gone := start.since()
				assert.False(t, watched && gone < tc.budget-2*sweepEvery, "watched %v after acquire, before two sweeps from its first step", gone)
				if gone >= tc.budget-2*sweepEvery {
					t.Logf("slept to %v, past the sweep's window: the check above said nothing", gone)
				}
			}
			require.Eventually(t, func() bool { return c.l.has(fFlagged) }, tc.budget+3*time.Second, time.Millisecond,
				"never flagged")
			flagged := start.since()
			t.Logf("budget %v: flagged after %v", tc.budget, flagged.Round(time.Millisecond))
			assert.GreaterOrEqual(t, flagged, tc.budget, "flagged before the budget")
			assert.Less(t, flagged, tc.budget+2*time.Second, "flagged long after the budget")
			_, watched = watchState(c.l)
			assert.True(t, watched, "watched (by the sweep, for the first case)")
			c.Release()
			assert.EqualValues(t, 1, p.Stat().Lane(Tx).BudgetFlags)
		})
	}
}

// TestSweepStopsWhenIdle: the sweep runs only while a published lease is held.
func TestSweepStopsWhenIdle(t *testing.T) {
	p := reusePool(t, "pool_max_conns=4&lane_tx_budget=10s")
	ctx := WithLane(context.Background(), Tx)
	assert.False(t, p.sweep.armed.Load(), "armed before any lease")
	c, err := p.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	published, _ := watchState(c.l)
	require.True(t, published)
	assert.True(t, p.sweep.armed.Load(), "not armed with a published lease held")
	time.Sleep(3 * sweepEvery)
	assert.True(t, p.sweep.armed.Load(), "disarmed with a published lease held")
	c.Release()
	require.Eventually(t, func() bool { return !p.sweep.armed.Load() }, 5*time.Second, time.Millisecond,
		"still armed with no lease held")
	// And armed again by the next one.
	c, err = p.Acquire(ctx)
	require.NoError(t, err)
	assert.True(t, p.sweep.armed.Load(), "not armed again")
	c.Release()
}

// TestSweepStress: many holders take and end leases whose budget (400 ms, flag) falls inside
// the sweep's window, while the sweep runs; a lease held clearly past its budget is flagged once,
// one that ends clearly before it never, whatever the interleaving with the sweep and with the
// reuse of leases; at the end no lease is published or watched, and the sweep stops.
func TestSweepStress(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const budget = 400 * time.Millisecond
	p := reusePool(t, "pool_max_conns=8&lane_tx_over_budget=flag&lane_tx_budget=400ms&lane_tx_max_conns=6")
	defer p.Close() // before goleak looks
	ctx := WithLane(context.Background(), Tx)
	// late: leases meant to end before their budget that a loaded machine kept past it (their
	// release came after the budget), which the guard may rightly have flagged.
	var over, flagged, early, missed, late atomic.Int64
	var mu sync.Mutex
	var errs []error
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for time.Now().Before(stop) {
				c, err := p.Acquire(ctx)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				l, gen, acquired := c.l, c.gen, c.l.acquired
				var hold time.Duration
				switch rng.IntN(3) {
				case 0: // ends at once
				case 1: // ends around the time the sweep watches it
					hold = budget - 2*sweepEvery + time.Duration(rng.IntN(int(sweepEvery)))
				default: // clearly over budget
					hold = budget + 150*time.Millisecond
				}
				time.Sleep(hold)
				isFlagged := l.has(fFlagged) && l.gen() == gen
				held := acquired.since() // after the look: a flag seen means this much time had gone
				if hold > budget {
					over.Add(1)
					// A late flag is possible only under extreme load: wait for it, a while.
					for wait := time.Now(); !isFlagged && time.Since(wait) < 5*time.Second; isFlagged = l.has(fFlagged) {
						time.Sleep(time.Millisecond)
					}
					if isFlagged {
						flagged.Add(1)
					} else {
						missed.Add(1)
					}
				} else if isFlagged && held < budget {
					early.Add(1) // a sleep that overshot past the budget may see a flag, rightly
				}
				c.Release()
				if hold <= budget && acquired.since() >= budget {
					late.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, errs)
	assert.Zero(t, early.Load(), "leases flagged before their budget")
	assert.Zero(t, missed.Load(), "leases over budget never flagged")
	assert.Positive(t, over.Load(), "no lease held over budget")
	assert.Equal(t, over.Load(), flagged.Load())
	n := p.Stat().Lane(Tx).BudgetFlags
	assert.GreaterOrEqual(t, n, over.Load(), "flags counted, one per lease over budget")
	assert.LessOrEqual(t, n, over.Load()+late.Load(), "flags counted for leases ended before their budget (%d kept past it by the machine)", late.Load())
	t.Logf("%d leases over budget flagged; %d meant to end before it were kept past it", over.Load(), late.Load())
	for _, srv := range p.servers {
		for i := range srv.live {
			assert.Nil(t, srv.live[i].l.Load(), "live entry %d still published", i)
		}
	}
	require.Eventually(t, func() bool { return !p.sweep.armed.Load() }, 5*time.Second, time.Millisecond,
		"the sweep still runs with no lease held")
}

// TestFirstStep: the first step is the ladder's or the mark's, whichever is sooner; a budget of
// a nanosecond is due at once (newLease watches it at acquire).
func TestFirstStep(t *testing.T) {
	for _, tc := range []struct {
		budget time.Duration
		action Action
		mark   time.Duration
		want   time.Duration
	}{
		{6 * time.Second, ActionCancel, 0, 3 * time.Second},
		{6 * time.Second, ActionTerminate, 0, 3 * time.Second},
		{6 * time.Second, ActionFlag, 0, 6 * time.Second},
		{6 * time.Second, ActionCancel, time.Second, time.Second},
		{time.Second, ActionCancel, 6 * time.Second, 500 * time.Millisecond},
		{0, ActionCancel, time.Second, time.Second},
		{time.Nanosecond, ActionCancel, 0, 0},
	} {
		got := firstStep(ladderFirst(tc.budget, tc.action), tc.mark)
		assert.Equal(t, tc.want, got, "budget %v %v, mark %v", tc.budget, tc.action, tc.mark)
	}
}

// TestLadderFirstFollowsTheSession: Short's budget follows the session's statement_timeout, read
// at the first connection (settings.go), and so does the first step the sweep plans with.
func TestLadderFirstFollowsTheSession(t *testing.T) {
	ctx := context.Background()
	dsn := pgserver.NewDatabase(t)
	c, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `do $$ begin execute format('alter database %I set statement_timeout = %L', current_database(), '20s'); end $$`)
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
	p, err := New(ctx, dsn)
	require.NoError(t, err)
	defer p.Close()
	before := p.lanes[Short].ladderFirst
	require.NoError(t, p.Ping(context.Background()))
	assert.Equal(t, 21*time.Second, p.lanes[Short].cfg.Budget, "Short's budget: the session's statement_timeout + 1 s")
	assert.Equal(t, ladderFirst(21*time.Second, p.lanes[Short].cfg.OverBudget), p.lanes[Short].ladderFirst,
		"the first step (it was %v before the first connection)", before)
}

// TestSweepTableIsBounded: the live table has at most liveMax entries, whatever MaxConns (pgx's
// own TestPoolAcquireWithMaxConnsEqualsMaxInt32 runs out of memory otherwise); a lease whose slot
// is past the table is watched at acquire, as before the sweep.
func TestSweepTableIsBounded(t *testing.T) {
	huge := reusePool(t, "pool_max_conns=2147483647")
	assert.Len(t, huge.servers[0].live, liveMax)

	p := reusePool(t, "pool_max_conns=4&lane_tx_budget=10s")
	first, second := pastTheTable(t, WithLane(context.Background(), Tx), p)
	published, watched := watchState(first.l)
	assert.True(t, published && !watched, "the lease of slot 0: published, not watched")
	published, watched = watchState(second.l)
	assert.True(t, !published && watched, "the lease of slot 1, past the table: watched at acquire")
}

// TestShortHoldersInLiveTable: a Short lease notes its backend's PID in its slot's entry of the
// live table for as long as it holds the slot, and only then, also while leases come and go on
// every slot at once (run with -race); a lease whose slot is past the table is not noted, and the
// others still are.
func TestShortHoldersInLiveTable(t *testing.T) {
	p := reusePool(t, "pool_max_conns=4")
	srv := p.servers[0]
	ctx := WithLane(context.Background(), Short)
	c, err := p.Acquire(ctx)
	require.NoError(t, err)
	pid := c.Conn().PgConn().PID()
	assert.True(t, srv.holdsShort(pid), "a held Short lease is noted")
	assert.False(t, srv.holdsShort(0), "PID 0 is never a holder")
	c.Release()
	assert.False(t, srv.holdsShort(pid), "a released lease is not noted")

	tx, err := p.Begin(context.Background()) // the Tx lane: in the registry, not the live table's PIDs
	require.NoError(t, err)
	assert.False(t, srv.holdsShort(tx.Conn().PgConn().PID()))
	require.NoError(t, tx.Rollback(context.Background()))

	var wg sync.WaitGroup
	var wrong atomic.Int64
	deadline := time.Now().Add(500 * time.Millisecond)
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				c, err := p.Acquire(ctx)
				if err != nil {
					wrong.Add(1)
					return
				}
				if !srv.holdsShort(c.Conn().PgConn().PID()) {
					wrong.Add(1)
				}
				c.Release()
			}
		})
	}
	wg.Wait()
	assert.Zero(t, wrong.Load(), "a held lease not noted (or an acquire failed)")
	for i := range srv.live {
		assert.Zero(t, srv.live[i].pid.Load(), "entry %d still notes a PID after every lease ended", i)
	}

	p = reusePool(t, "pool_max_conns=4")
	first, second := pastTheTable(t, ctx, p)
	assert.True(t, p.servers[0].holdsShort(first.Conn().PgConn().PID()), "slot 0: noted")
	assert.False(t, p.servers[0].holdsShort(second.Conn().PgConn().PID()), "slot 1, past the table: not noted")
}

// pastTheTable cuts new pool p's live table to one entry, before any lease, and takes two
// connections with ctx: the first holds slot 0, in the table, the second slot 1, past it. Both
// are released when the test ends.
func pastTheTable(t *testing.T, ctx context.Context, p *Pool) (first, second *Conn) {
	t.Helper()
	p.servers[0].live = p.servers[0].live[:1]
	first, err := p.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(first.Release)
	second, err = p.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(second.Release)
	require.Equal(t, []int{0, 1}, []int{first.l.slot.Index(), second.l.slot.Index()})
	return first, second
}

// TestIdleBeforeAnyLeaseEnded: an idle connection counts as recently used (handed over without
// a ping's bound) only once a lease has ended; before that, lastUse is 0, which is not a use
// however early the acquire's clock reads (a process's first half second).
func TestIdleBeforeAnyLeaseEnded(t *testing.T) {
	p := reusePool(t, "pool_max_conns=2")
	srv := p.servers[0]
	open := srv.open.Load()
	srv.open.Store(open + 1) // one idle connection more, as far as poolCtx can tell
	defer srv.open.Store(open)
	rt := route{lane: Short, set: Short}
	early := mono(100 * time.Millisecond) // an acquire in the process's first half second
	_, release, idle := p.poolCtx(context.Background(), rt, early)
	assert.False(t, idle, "no lease ended yet: not a recent use")
	if release != nil {
		release()
	}
	srv.lastUse.Store(int64(early - mono(time.Millisecond)))
	_, release, idle = p.poolCtx(context.Background(), rt, early)
	assert.True(t, idle, "a lease ended 1 ms before: a recent use")
	if release != nil {
		release()
	}
}
