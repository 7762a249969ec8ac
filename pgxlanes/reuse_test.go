package pgxlanes

import (
	"context"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/txguard"
)

// The tests of lease reuse (slab.go), against a real PostgreSQL: a wrapper kept past its hold,
// and a guard action that comes late, must not reach the lease's next hold.

func reusePool(t *testing.T, params string) *Pool {
	t.Helper()
	dsn := pgserver.NewDatabase(t)
	sep := "?"
	for i := range len(dsn) {
		if dsn[i] == '?' {
			sep = "&"
		}
	}
	p, err := New(context.Background(), dsn+sep+params)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// untilReused runs first, which takes a lease, makes wrappers of it and ends its hold, then
// second, which takes a lease and keeps it, until second's lease is the one first ended. Leases
// are reused through a sync.Pool, which the race detector makes drop some of them at random;
// undo gives back a lease of second's that is not the one wanted.
func untilReused(t *testing.T, first func() *lease, second func() (l *lease, undo func())) {
	t.Helper()
	for range 1000 {
		old := first()
		l, undo := second()
		if l == old {
			return
		}
		undo()
	}
	t.Fatal("no lease was reused in 1000 tries")
}

func backendPID(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int32 {
	t.Helper()
	var pid int32
	require.NoError(t, q.QueryRow(context.Background(), "select pg_backend_pid()").Scan(&pid))
	return pid
}

// Every wrapper of a hold that ended (a held connection, its transaction, a pool transaction, a
// pool row and rows) refuses calls once its lease serves another caller, and releasing it again
// does not end the other caller's hold.
func TestStaleWrapperAfterReuse(t *testing.T) {
	ctx := context.Background()
	p := reusePool(t, "pool_max_conns=4")

	t.Run("held connection", func(t *testing.T) {
		var stale *Conn
		var staleTx pgx.Tx
		var fresh *Conn
		untilReused(t, func() *lease {
			c, err := p.Acquire(ctx)
			require.NoError(t, err)
			tx, err := c.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			c.Release()
			stale, staleTx = c, tx
			return c.l
		}, acquireInto(t, p, &fresh))
		pid := backendPID(t, fresh)
		freshTx, err := fresh.Begin(ctx)
		require.NoError(t, err)

		_, err = stale.Exec(ctx, "select 1")
		assert.ErrorIs(t, err, ErrReleased)
		_, err = stale.Query(ctx, "select 1")
		assert.ErrorIs(t, err, ErrReleased)
		var n int
		assert.ErrorIs(t, stale.QueryRow(ctx, "select 1").Scan(&n), ErrReleased)
		_, err = stale.Begin(ctx)
		assert.ErrorIs(t, err, ErrReleased)
		assert.ErrorIs(t, stale.Ping(ctx), ErrReleased)
		var b pgx.Batch
		b.Queue("select 1")
		assert.ErrorIs(t, stale.SendBatch(ctx, &b).Close(), ErrReleased)
		_, err = staleTx.Exec(ctx, "select 1")
		assert.ErrorIs(t, err, ErrReleased)
		assert.ErrorIs(t, staleTx.Rollback(ctx), ErrReleased)
		assert.Panics(t, func() { stale.Conn() })
		assert.Panics(t, func() { stale.Hijack() })
		stale.Release() // a second Release: nothing
		assert.Equal(t, Tx, stale.Lane())

		// The other caller's hold, and its transaction, are untouched.
		assert.Equal(t, phActive, fresh.l.phase())
		assert.Equal(t, 1, p.Stat().Lane(Tx).InUse)
		_, err = freshTx.Exec(ctx, "create temporary table reuse_t (x int)")
		require.NoError(t, err)
		require.NoError(t, freshTx.Commit(ctx))
		assert.Equal(t, pid, backendPID(t, fresh), "the same session")
		fresh.Release()
		assert.Equal(t, 0, p.Stat().Lane(Tx).InUse)
	})

	t.Run("pool transaction", func(t *testing.T) {
		// The classic: defer tx.Rollback after Commit, run when the lease serves another caller.
		var stale, fresh pgx.Tx
		untilReused(t, func() *lease {
			tx, err := p.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			stale = tx
			return tx.(*leaseTx).l
		}, func() (*lease, func()) {
			tx, err := p.Begin(ctx)
			require.NoError(t, err)
			fresh = tx
			return tx.(*leaseTx).l, func() { _ = tx.Rollback(ctx) }
		})
		_, err := fresh.Exec(ctx, "create temporary table reuse_u (x int)")
		require.NoError(t, err)
		assert.ErrorIs(t, stale.Rollback(ctx), pgx.ErrTxClosed)
		assert.ErrorIs(t, stale.Commit(ctx), pgx.ErrTxClosed)
		_, err = stale.Exec(ctx, "select 1")
		assert.ErrorIs(t, err, pgx.ErrTxClosed)
		assert.Panics(t, func() { stale.Conn() })
		// Still in the other caller's transaction: the table it created is there.
		_, err = fresh.Exec(ctx, "insert into reuse_u values (1)")
		require.NoError(t, err)
		require.NoError(t, fresh.Commit(ctx))
		assert.Equal(t, 0, p.Stat().Lane(Tx).InUse)
	})

	t.Run("pool row and rows", func(t *testing.T) {
		var row pgx.Row
		var rows pgx.Rows
		var fresh *Conn
		untilReused(t, func() *lease {
			var n int
			rows, _ = p.Query(ctx, "select 1")
			rows.Close()
			row = p.QueryRow(ctx, "select 1")
			require.NoError(t, row.Scan(&n))
			return row.(*leaseRow).l
		}, acquireInto(t, p, &fresh))
		var n int
		assert.Error(t, row.Scan(&n), "a second Scan gets pgx's answer for a closed row")
		rows.Close()
		assert.False(t, rows.Next())
		assert.Nil(t, rows.Conn())
		assert.Equal(t, 1, p.Stat().Lane(Tx).InUse, "the second Scan released nothing")
		_, err := fresh.Exec(ctx, "select 1")
		require.NoError(t, err)
		fresh.Release()
	})
}

// A guard action decided for a hold that ended, carried out once the lease serves another caller,
// does nothing to that caller: no flag, no cancel, no terminate, no mark, nothing counted. The
// same action for the current hold does act.
func TestLateGuardActionOnReusedLease(t *testing.T) {
	ctx := context.Background()
	p := reusePool(t, "pool_max_conns=4&lane_tx_budget=1h&lane_tx_over_budget=cancel")
	var old uint64
	var fresh *Conn
	untilReused(t, func() *lease {
		c, err := p.Acquire(ctx)
		require.NoError(t, err)
		old = c.gen
		c.Release()
		return c.l
	}, acquireInto(t, p, &fresh))
	require.NotEqual(t, old, fresh.gen)
	pid := backendPID(t, fresh)
	for _, a := range []txguard.Action{txguard.Flag, txguard.Mark, txguard.Cancel, txguard.Terminate} {
		fresh.l.ActGen(old, a, 2*time.Hour)
	}
	// The late terminate returns at once, having done nothing; a goroutine would do the same.
	assert.Equal(t, phActive, fresh.l.phase())
	assert.Nil(t, fresh.l.violation.Load())
	assert.False(t, fresh.l.has(fFlagged|fOverran))
	assert.Equal(t, pid, backendPID(t, fresh), "the session is alive and the call succeeds")
	st := p.Stat().Lane(Tx)
	assert.Zero(t, st.BudgetWarnings+st.BudgetFlags+st.BudgetCancels+st.BudgetTerminates+st.BudgetTerminateFailures)

	// The same action for the current hold acts: the check above is the generation's.
	fresh.l.ActGen(fresh.gen, txguard.Cancel, 2*time.Hour)
	_, err := fresh.Exec(ctx, "select 1")
	require.ErrorIs(t, err, ErrBudgetExceeded)
	assert.Equal(t, int64(1), p.Stat().Lane(Tx).BudgetCancels)
	fresh.Release()
}

// A lease the guard terminated is not reused until its owner lets go: the owner's calls keep
// failing with the terminate's *BudgetError, not with another caller's results; after Release
// they fail with ErrReleased, and the lease may serve another caller.
func TestTerminatedLeaseReusedAfterRelease(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	p := reusePool(t, "pool_max_conns=4&lane_tx_budget=100ms&lane_tx_over_budget=terminate")
	c, err := p.Acquire(ctx)
	require.NoError(t, err)
	gen := c.gen
	require.Eventually(t, func() bool { return c.l.phase() == phTerminated }, 10*time.Second, 10*time.Millisecond)
	for range 3 {
		_, err = c.Exec(ctx, "select 1")
		require.ErrorIs(t, err, ErrBudgetExceeded)
	}
	assert.Equal(t, gen, c.l.gen(), "not reused while its owner holds it")
	c.Release()
	assert.NotEqual(t, gen, c.l.gen(), "reused once the owner let go")
	_, err = c.Exec(ctx, "select 1")
	require.ErrorIs(t, err, ErrReleased)
	c2, err := p.Acquire(WithBudget(ctx, Off))
	require.NoError(t, err)
	_, err = c2.Exec(ctx, "select 1")
	require.NoError(t, err)
	c2.Release()
	p.Close()
}

// TestLeaseReuseStress runs holders that keep their wrappers past release and use them again at
// random, and fires the guard's actions late at random (with the generation of an ended hold), on
// a few connections, so that leases are reused all the time. Invariants: a stale call always gets
// ErrReleased (or, for a pool transaction, pgx.ErrTxClosed) and never reaches a session; a live
// holder's calls always succeed, on the session it started with; a late action never counts a
// violation or ends a session; at the end every lane is idle and nothing leaked.
// PGXLANES_STRESS sets its length (default 2s).
func TestLeaseReuseStress(t *testing.T) {
	d := 2 * time.Second
	if v := os.Getenv("PGXLANES_STRESS"); v != "" {
		var err error
		d, err = time.ParseDuration(v)
		require.NoError(t, err)
	}
	leak := goleak.IgnoreCurrent()
	ctx := context.Background()
	p := reusePool(t, "pool_max_conns=4&lane_tx_budget=1h&lane_tx_over_budget=terminate&lane_short_budget=1h&lane_short_over_budget=cancel")

	type staleHold struct {
		c   *Conn
		tx  pgx.Tx // a pool transaction, committed
		gen uint64
		l   *lease
	}
	var mu sync.Mutex
	var stales []staleHold
	remember := func(s staleHold) {
		mu.Lock()
		defer mu.Unlock()
		if len(stales) < 64 {
			stales = append(stales, s)
		} else {
			stales[rand.IntN(len(stales))] = s
		}
	}
	pick := func() (staleHold, bool) {
		mu.Lock()
		defer mu.Unlock()
		if len(stales) == 0 {
			return staleHold{}, false
		}
		return stales[rand.IntN(len(stales))], true
	}
	var ops, staleCalls, lateActs atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if s, ok := pick(); ok {
					staleCalls.Add(1)
					if s.c != nil {
						_, err := s.c.Exec(ctx, "select 1")
						if !assert.ErrorIs(t, err, ErrReleased) {
							return
						}
						s.c.Release()
					} else {
						if !assert.ErrorIs(t, s.tx.Rollback(ctx), pgx.ErrTxClosed) {
							return
						}
					}
					if rand.IntN(2) == 0 {
						lateActs.Add(1)
						a := []txguard.Action{txguard.Flag, txguard.Mark, txguard.Cancel, txguard.Terminate}[rand.IntN(4)]
						s.l.ActGen(s.gen, a, 2*time.Hour)
					}
				}
				if w%2 == 0 {
					c, err := p.Acquire(ctx)
					if !assert.NoError(t, err) {
						return
					}
					pid := backendPID(t, c)
					runtime.Gosched()
					assert.Equal(t, pid, backendPID(t, c), "a live holder keeps its session")
					c.Release()
					remember(staleHold{c: c, gen: c.gen, l: c.l})
				} else {
					tx, err := p.Begin(ctx)
					if !assert.NoError(t, err) {
						return
					}
					_, err = tx.Exec(ctx, "select 1")
					assert.NoError(t, err)
					assert.NoError(t, tx.Commit(ctx))
					lt := tx.(*leaseTx)
					remember(staleHold{tx: tx, gen: lt.gen, l: lt.l})
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d holds, %d stale calls, %d late guard actions in %v", ops.Load(), staleCalls.Load(), lateActs.Load(), d)
	st := p.Stat()
	for _, lane := range Lanes() {
		ls := st.Lane(lane)
		assert.Zero(t, ls.InUse, "%v lane idle", lane)
		assert.Zero(t, ls.BudgetWarnings+ls.BudgetFlags+ls.BudgetCancels+ls.BudgetTerminates+ls.BudgetTerminateFailures,
			"%v lane: a late action counted", lane)
	}
	assert.EqualValues(t, st.NewConnsCount(), st.TotalConns(), "no session was ended")
	p.Close()
	goleak.VerifyNone(t, leak)
}

// acquireInto is untilReused's second step for a held connection: it acquires, keeps the Conn in
// *c, and gives its lease and its release.
func acquireInto(t *testing.T, p *Pool, c **Conn) func() (*lease, func()) {
	return func() (*lease, func()) {
		conn, err := p.Acquire(context.Background())
		require.NoError(t, err)
		*c = conn
		return conn.l, conn.Release
	}
}
