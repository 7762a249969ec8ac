package integration

import (
	"context"
	"errors"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// longCalls runs Long calls one after the other until stop is closed and returns how long each
// took, and the errors.
func longCalls(p *pgxlanes.Pool, stop <-chan struct{}) (took []time.Duration, errs []error) {
	for {
		select {
		case <-stop:
			return took, errs
		default:
		}
		start := time.Now()
		_, err := p.Exec(pgxlanes.WithLane(context.Background(), pgxlanes.Long), "select 1")
		took = append(took, time.Since(start))
		if err != nil {
			errs = append(errs, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// warmLong opens the fleet's sessions and a Long connection: on a busy machine the first dial
// may take longer than Long's acquire timeout of 300 ms, which is not what these tests measure.
func warmLong(t *testing.T, p *pgxlanes.Pool) {
	t.Helper()
	pgserver.Eventually(t, 10*time.Second, "a Long call", func() bool {
		_, err := p.Exec(pgxlanes.WithLane(context.Background(), pgxlanes.Long), "select 1")
		return err == nil
	})
}

// TestLongCallsNeverWaitBehindTerminates: the guard terminates 16 transactions over their
// budget at once while Long callers, under a fleet cap of 2 and an acquire timeout of 300 ms,
// run on. Their slots live on the fleet's own sessions and the terminates hold the guard session
// one statement at a time: no Long call fails or waits for the terminates.
func TestLongCallsNeverWaitBehindTerminates(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 20)
	ch := make(chan pgxlanes.Violation, 64)
	p, _ := newGuardedPool(t, dsn, "pool_max_conns=24&lane_short_reserved=2&lane_tx_reserved=18&lane_tx_max_conns=18&lane_long_reserved=2&lane_long_max_conns=2"+
		"&lane_long_fleet_max_conns=2&lane_long_acquire_timeout=300ms&lane_tx_budget=300ms&lane_tx_over_budget=terminate", violationsTo(ch))
	warmLong(t, p)

	var txs []pgx.Tx
	for i := range 16 {
		tx, err := p.Begin(bg)
		require.NoError(t, err)
		_, err = tx.Exec(bg, "select v from items where id = $1 for update", i+1)
		require.NoError(t, err)
		txs = append(txs, tx)
	}
	stop := make(chan struct{})
	var took []time.Duration
	var errs []error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); took, errs = longCalls(p, stop) }()
	terminated := 0
	deadline := time.After(20 * time.Second)
	for terminated < 16 {
		select {
		case v := <-ch:
			if v.Action == pgxlanes.ActionTerminate {
				require.NoError(t, v.Err)
				terminated++
			}
		case <-deadline:
			t.Fatalf("%d of 16 terminates reported", terminated)
		}
	}
	close(stop)
	wg.Wait()
	for _, tx := range txs {
		_ = tx.Rollback(bg)
	}
	require.NotEmpty(t, took)
	t.Logf("16 terminates at once: %d Long calls meanwhile, median %v, worst %v, %d failed",
		len(took), fmtDur(median(took)), fmtDur(slices.Max(took)), len(errs))
	assert.Empty(t, errs, "a Long call failed while the guard terminated")
	assert.Less(t, slices.Max(took), 300*time.Millisecond, "a Long call waited for the guard")
	// With one guard session locked across each terminate, as before, the median Long call here
	// took about 100 ms (one terminate's round trips); without, a few ms on a busy machine.
	assert.Less(t, median(took), 50*time.Millisecond, "Long calls queued behind the terminates")
	lanesIdle(t, p, "after the terminates")
}

// TestTerminateOfAFrozenBackendDelaysNobody: the backend of a transaction over its budget is
// stopped (SIGSTOP), so that the guard's terminate cannot see it go for terminateTimeout (5 s).
// Meanwhile Long calls (fleet cap 2) run at their usual speed, and another transaction's
// terminate completes at its own budget, not after the frozen one's.
func TestTerminateOfAFrozenBackendDelaysNobody(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 10)
	admin := adminConn(t, dsn)
	ch := make(chan pgxlanes.Violation, 64)
	p, _ := newGuardedPool(t, dsn, "pool_max_conns=8&lane_tx_reserved=4&lane_tx_max_conns=4&lane_long_reserved=2&lane_long_max_conns=2"+
		"&lane_long_fleet_max_conns=2&lane_long_acquire_timeout=300ms&lane_tx_budget=300ms&lane_tx_over_budget=terminate", violationsTo(ch))
	warmLong(t, p)

	frozen, err := p.Begin(bg)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, frozen.QueryRow(bg, "select pg_backend_pid()").Scan(&pid))
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop backend %d: %v (the test needs to run as the server's user or root)", pid, err)
	}
	thaw := func() { _ = syscall.Kill(int(pid), syscall.SIGCONT) }
	t.Cleanup(thaw)
	began := time.Now()

	stop := make(chan struct{})
	var took []time.Duration
	var errs []error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); took, errs = longCalls(p, stop) }()

	// A second transaction, over its budget 1 s after the frozen one's terminate began.
	time.Sleep(time.Until(began.Add(time.Second)))
	other, err := p.Begin(bg)
	require.NoError(t, err)
	otherBegan := time.Now()
	_, err = other.Exec(bg, "select 1")
	require.NoError(t, err)
	var otherDone time.Duration
	deadline := time.After(15 * time.Second)
	for otherDone == 0 {
		select {
		case v := <-ch:
			if v.Action == pgxlanes.ActionTerminate && v.Err == nil {
				otherDone = time.Since(otherBegan)
			}
		case <-deadline:
			t.Fatal("the second transaction's terminate was not reported")
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("frozen backend: the other transaction was terminated %v after it began (budget 300ms); %d Long calls meanwhile, median %v, worst %v, %d failed",
		fmtDur(otherDone), len(took), fmtDur(median(took)), fmtDur(slices.Max(took)), len(errs))
	assert.Less(t, otherDone, 2*time.Second, "the second terminate waited for the frozen one")
	assert.Empty(t, errs)
	assert.Less(t, slices.Max(took), 300*time.Millisecond, "a Long call waited for the guard")
	_, err = other.Exec(bg, "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
	_ = other.Rollback(bg)

	// The frozen backend's terminate gives up at 5 s and is reported failed; thawed, the backend
	// takes its pending signal and goes.
	v := waitAction(t, ch, pgxlanes.ActionTerminate, 15*time.Second)
	assert.Error(t, v.Err, "the frozen backend's terminate could not be verified")
	thaw()
	pgserver.Eventually(t, 5*time.Second, "the thawed backend gone", func() bool { return !aliveOn(t, admin, pid) })
	_ = frozen.Rollback(bg)
	lanesIdle(t, p, "after the freeze")
}

// TestSlowOnViolationDelaysNoCancel: an OnViolation handler that takes a second on the first
// lease's half-budget warning does not delay another lease's cancel: reports run off the guard's
// goroutine.
func TestSlowOnViolationDelaysNoCancel(t *testing.T) {
	bg := context.Background()
	var once sync.Once
	p, _ := newGuardedPool(t, newDB(t, 1), "pool_max_conns=4&lane_tx_budget=400ms&lane_tx_over_budget=cancel", func(c *pgxlanes.Config) {
		c.OnViolation = func(v pgxlanes.Violation) {
			once.Do(func() { time.Sleep(1500 * time.Millisecond) })
		}
	})
	first, err := p.Begin(bg)
	require.NoError(t, err)
	defer first.Rollback(bg) //nolint:errcheck
	time.Sleep(100 * time.Millisecond)
	second, err := p.Begin(bg)
	require.NoError(t, err)
	defer second.Rollback(bg) //nolint:errcheck
	start := time.Now()
	// The first lease's warning is due at 200 ms and blocks its handler for 1.5 s; the second's
	// cancel is due 400 ms after it began.
	_, err = second.Exec(bg, "select pg_sleep(5)")
	took := time.Since(start)
	require.True(t, errors.Is(err, pgxlanes.ErrBudgetExceeded), "%v", err)
	t.Logf("the second lease's statement was cancelled after %v (budget 400ms)", fmtDur(took))
	assert.Less(t, took, 1200*time.Millisecond, "the cancel waited for the slow handler")
}

// TestGuardOpensWithTheFirstLease: the guard session opens in the background with the pool's
// first lease, as early as pgxpool's contract allows: pgxpool's NewWithConfig opens nothing and
// calls no hook (pgx's TestConstructorIgnoresContext, TestPoolBackgroundConnectionsContext), and its
// MinConns connections are counted through BeforeConnect (TestConnectEagerlyReachesMinPoolSize),
// which the guard's login goes through too. Not before: New and MinConns leave no guard session.
func TestGuardOpensWithTheFirstLease(t *testing.T) {
	dsn := newDB(t, 1)
	admin := adminConn(t, dsn)
	p, _ := newGuardedPool(t, dsn, "pool_max_conns=4&pool_min_conns=2", nil)
	pgserver.Eventually(t, 10*time.Second, "MinConns' connections", func() bool { return p.Stat().TotalConns() == 2 })
	assert.Empty(t, guardPIDs(t, admin), "no guard session before the first lease")
	require.NoError(t, p.Ping(context.Background()))
	waitGuard(t, admin)
}
