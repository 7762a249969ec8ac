package integration

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// The tests of the lease's transitions that need the guard's terminate to be under way for a
// while (docs/design.md, the lease state table): the lease's backend is stopped with SIGSTOP, so
// that the terminate cannot see it go until terminateTimeout (5 s) and reports a failure, after
// which the pool closes its socket. The other transitions are covered where their feature is
// tested: active -> releasing -> ended after a drain (TestCancelRunningStatement), active -> ended
// by Hijack (TestHijackAfterGuardCancel), terminating -> terminated -> ended
// (TestHijackAfterGuardTerminate), committing under the guard's cancel (TestCommitRacesTheGuard).

// stoppedTerminate begins a transaction on a pool whose Tx budget is 200 ms with terminate, stops
// its backend, and returns once the guard's terminate is under way (the lease's calls fail).
func stoppedTerminate(t *testing.T) (*pgxlanes.Pool, pgx.Tx, chan pgxlanes.Violation, *pgx.Conn, int32) {
	t.Helper()
	bg := context.Background()
	dsn := newDB(t, 1)
	admin := adminConn(t, dsn)
	ch := make(chan pgxlanes.Violation, 16)
	p, _ := newGuardedPool(t, dsn, "pool_max_conns=4&lane_tx_budget=200ms&lane_tx_over_budget=terminate", violationsTo(ch))
	tx, err := p.Begin(bg)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, tx.QueryRow(bg, "select pg_backend_pid()").Scan(&pid))
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop backend %d: %v", pid, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(int(pid), syscall.SIGCONT) })
	underWay(t, tx.Exec)
	return p, tx, ch, admin, pid
}

// underWay waits until the terminate of a lease whose budget (200 ms) began just now is under
// way: its backend is stopped, so a statement would hang; once the terminate began, exec fails
// at once with a *BudgetError without reaching the session.
func underWay(t *testing.T, exec func(context.Context, string, ...any) (pgconn.CommandTag, error)) {
	t.Helper()
	time.Sleep(700 * time.Millisecond)
	start := time.Now()
	_, err := exec(context.Background(), "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
	require.Less(t, time.Since(start), 100*time.Millisecond, "the call reached the stopped session")
}

// terminating -> abandoned -> ended: Hijack during the guard's terminate hands over the session
// being killed at once, and the lane slot stays taken until the guard's verdict, not freed before.
func TestLeaseHijackDuringTerminate(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	dsn := newDB(t, 1)
	ch := make(chan pgxlanes.Violation, 16)
	p, _ := newGuardedPool(t, dsn, "pool_max_conns=4&lane_tx_budget=200ms&lane_tx_over_budget=terminate", violationsTo(ch))
	c, err := p.Acquire(bg)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, c.QueryRow(bg, "select pg_backend_pid()").Scan(&pid))
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop backend %d: %v", pid, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(int(pid), syscall.SIGCONT) })
	underWay(t, c.Exec)
	start := time.Now()
	conn := c.Hijack()
	assert.Less(t, time.Since(start), 100*time.Millisecond, "Hijack waited for the guard's I/O")
	require.NotNil(t, conn)
	assert.Equal(t, 1, p.Stat().Lane(pgxlanes.Tx).InUse, "the slot is held until the guard's verdict")
	v := waitAction(t, ch, pgxlanes.ActionTerminate, 15*time.Second)
	assert.Error(t, v.Err, "the stopped backend could not be seen gone")
	lanesIdle(t, p, "after the verdict")
	_ = conn.Close(bg)
	assert.Panics(t, func() { c.Hijack() }, "a second Hijack")
}

// terminating -> abandoned -> ended: Release during the guard's terminate returns at once; the
// guard ends the lease at its verdict.
func TestLeaseReleaseDuringTerminate(t *testing.T) {
	t.Parallel()
	p, tx, ch, _, _ := stoppedTerminate(t)
	start := time.Now()
	err := tx.Rollback(context.Background())
	assert.Less(t, time.Since(start), 100*time.Millisecond, "Rollback waited for the guard's I/O")
	assert.NoError(t, err, "the guard acted: the server rolls back")
	assert.Equal(t, 1, p.Stat().Lane(pgxlanes.Tx).InUse, "the slot is held until the guard's verdict")
	waitAction(t, ch, pgxlanes.ActionTerminate, 15*time.Second)
	lanesIdle(t, p, "after the verdict")
}

// terminating, Commit: refused with a *BudgetError at once; the COMMIT is never sent, so the
// transaction cannot have committed.
func TestLeaseCommitDuringTerminate(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	p, tx, ch, _, _ := stoppedTerminate(t)
	start := time.Now()
	err := tx.Commit(bg)
	assert.Less(t, time.Since(start), 100*time.Millisecond, "Commit waited for the guard's I/O")
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
	require.NotErrorIs(t, err, pgxlanes.ErrCommitOutcomeUnknown)
	waitAction(t, ch, pgxlanes.ActionTerminate, 15*time.Second)
	lanesIdle(t, p, "after the verdict")
}

// committing, terminate: the guard waits for the COMMIT in flight (commitWait, 1 s) before it
// terminates; a COMMIT that does not return by then (its backend is stopped) ends with the
// session, and Commit says that the outcome is unknown, never that it failed.
func TestLeaseTerminateDuringCommit(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	dsn := newDB(t, 1)
	admin := adminConn(t, dsn)
	_, err := admin.Exec(bg, "create table done (id int primary key)")
	require.NoError(t, err)
	ch := make(chan pgxlanes.Violation, 16)
	p, _ := newGuardedPool(t, dsn, "pool_max_conns=4&lane_tx_budget=300ms&lane_tx_over_budget=terminate", violationsTo(ch))
	tx, err := p.Begin(bg)
	require.NoError(t, err)
	began := time.Now()
	var pid int32
	require.NoError(t, tx.QueryRow(bg, "select pg_backend_pid()").Scan(&pid))
	_, err = tx.Exec(bg, "insert into done values (1)")
	require.NoError(t, err)
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Skipf("cannot stop backend %d: %v", pid, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(int(pid), syscall.SIGCONT) })
	err = tx.Commit(bg) // hangs on the stopped backend, from well before the budget
	took := time.Since(began)
	t.Logf("Commit returned %v after the transaction began (budget 300ms, the guard waits 1s for a COMMIT): %v", fmtDur(took), err)
	require.ErrorIs(t, err, pgxlanes.ErrCommitOutcomeUnknown)
	require.NotErrorIs(t, err, pgxlanes.ErrBudgetExceeded, "an unknown outcome is no budget failure to retry")
	assert.Greater(t, took, 1300*time.Millisecond, "the guard waited for the COMMIT before it terminated")
	waitAction(t, ch, pgxlanes.ActionTerminate, 15*time.Second)
	lanesIdle(t, p, "after the verdict")
}
