package integration

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

const timeoutsSQL = "select current_setting('statement_timeout') || '/' || current_setting('lock_timeout')"

// TestPgBouncerTimeouts checks the lanes' server-side timeouts on every path in both pool modes.
//
// Session mode pins a server session to each client connection, so pgxlanes works as it does
// without PgBouncer: a transaction or held connection of the Tx lane gets Tx's timeouts by session
// SET, and RESET brings back Short's, which the database carries as its defaults
// (sessionModeDefaults). Transaction mode shares server sessions between clients, so pgxlanes
// (pgxlanes_transaction_pooler=true) sets nothing on the session: a transaction gets SET LOCAL
// right after its BEGIN (after the BEGIN of a batch's transaction too), and everything else sees
// the server's defaults, bounded on the client side only. In both, the server enforces a
// transaction's statement_timeout without a cancel request.
func TestPgBouncerTimeouts(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []string{"session", "transaction"} {
		dsn := newDB(t, 10) // a database of its own: session mode changes its defaults
		b := startBouncer(t, dsn, mode)
		plain := "0/0" // behind a transaction pooler: the server's defaults
		held := "0/0"
		if mode == "session" {
			sessionModeDefaults(t, b, dsn)
			plain, held = "5s/1s", "7s/3s"
		}
		p := newLanes(t, b.dsn, "pool_max_conns=4&lane_tx_statement_timeout=7s&lane_tx_lock_timeout=3s&"+bouncerParams(mode))
		setting := func(q interface {
			QueryRow(context.Context, string, ...any) pgx.Row
		}) string {
			t.Helper()
			var st string
			require.NoError(t, q.QueryRow(ctx, timeoutsSQL).Scan(&st))
			return st
		}
		require.NoError(t, pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
			assert.Equal(t, "7s/3s", setting(tx), "%s mode: transaction", mode)
			return nil
		}))
		batch := &pgx.Batch{}
		batch.BeginTx(pgx.TxOptions{})
		var inBatch string
		batch.Queue(timeoutsSQL).QueryRow(func(r pgx.Row) error { return r.Scan(&inBatch) })
		br := p.SendBatch(ctx, batch)
		require.NoError(t, br.Close())
		require.NoError(t, br.Tx().Commit(ctx))
		assert.Equal(t, "7s/3s", inBatch, "%s mode: transaction begun in a batch", mode)
		require.NoError(t, p.AcquireFunc(ctx, func(c *pgxlanes.Conn) error {
			assert.Equal(t, held, setting(c), "%s mode: held connection of the Tx lane", mode)
			return nil
		}))
		for range 5 {
			assert.Equal(t, plain, setting(p), "%s mode: plain statement after the others", mode)
		}

		// The server enforces a transaction's statement_timeout: no cancel request needed.
		fast := newLanes(t, b.dsn, "pool_max_conns=2&lane_tx_statement_timeout=300ms&"+bouncerParams(mode))
		start := time.Now()
		err := pgx.BeginFunc(ctx, fast, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "select pg_sleep(3)")
			return err
		})
		took := time.Since(start)
		assert.Equal(t, "57014", sqlState(err), "%s mode: %v", mode, err)
		assert.Less(t, took, 2*time.Second, "%s mode: the server's statement_timeout of 300ms", mode)
		lanesIdle(t, fast, mode+" mode, after the statement timeout")
		lanesIdle(t, p, mode+" mode")
		p.Close()
		fast.Close()
		b.requireAlive(t, mode+" mode")
	}

	// What a transaction pooler cannot do is refused when the pool is made, naming the setting.
	b := startBouncer(t, newDB(t, 1), "transaction")
	for _, bad := range []string{"lane_tx_over_budget=terminate", "lane_long_fleet_max_conns=2"} {
		_, err := pgxlanes.New(ctx, withParams(b.dsn, "pgxlanes_transaction_pooler=true&"+bad))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), strings.Split(bad, "=")[0])
		assert.Contains(t, err.Error(), "TransactionPooler")
	}
}

// violations collects what a pool's guard reports.
type violations struct {
	mu sync.Mutex
	v  []pgxlanes.Violation
}

func (vs *violations) add(v pgxlanes.Violation) {
	vs.mu.Lock()
	vs.v = append(vs.v, v)
	vs.mu.Unlock()
}

// last returns the last violation of action a that is not a warning, and whether there is one.
func (vs *violations) last(a pgxlanes.Action) (pgxlanes.Violation, bool) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	for i := len(vs.v) - 1; i >= 0; i-- {
		if vs.v[i].Action == a && !vs.v[i].Warning {
			return vs.v[i], true
		}
	}
	return pgxlanes.Violation{}, false
}

func guardedBouncerPool(t *testing.T, b *bouncer, params string) (*pgxlanes.Pool, *violations) {
	t.Helper()
	vs := &violations{}
	p, _ := newGuardedPool(t, b.dsn, params+"&"+bouncerParams(b.mode), func(c *pgxlanes.Config) {
		c.OnViolation = vs.add
		c.CancelGrace = time.Second
	})
	return p, vs
}

// rowLockFree reports whether row id of items can be locked at once, from a direct connection.
func rowLockFree(t *testing.T, dsn string, id int) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "begin; set local lock_timeout = '20ms'; select 1 from items where id = "+itoa(id)+" for update; rollback")
	if sqlState(err) == "55P03" {
		return false
	}
	require.NoError(t, err)
	return true
}

// TestPgBouncerBudgets: what each over_budget action becomes behind PgBouncer.
//
// Transaction mode, cancel: a transaction idle past its budget fails its next call with a
// *BudgetError; one running a statement returns at its budget, and without cancel requests its
// connection is closed (the statement went on, so the session's state cannot be what the
// interrupted caller was told). terminate is refused at config time (TestPgBouncerTimeouts).
//
// Session mode, terminate: the PID a client sees is PgBouncer's cancel key, not the backend's.
// pgxlanes checks the PID against pg_stat_activity before it terminates anything, finds no such
// backend, and reports the terminate as failed (Violation.Err, BudgetError.Failed,
// BudgetTerminateFailures); it then closes its own socket, PgBouncer closes the server
// connection of that client, and the backend rolls back at once: the row lock is freed all the
// same, a few milliseconds later than a verified terminate would free it.
func TestPgBouncerBudgets(t *testing.T) {
	ctx := context.Background()

	t.Run("transaction mode cancel", func(t *testing.T) {
		dsn := newDB(t, 10)
		b := startBouncer(t, dsn, "transaction")
		p, vs := guardedBouncerPool(t, b, "pool_max_conns=4&lane_tx_budget=300ms")
		// Idle past the budget.
		tx := beginT(t, p)
		_, err := tx.Exec(ctx, "select 1 from items where id = 1 for update")
		require.NoError(t, err)
		pgserver.Eventually(t, 2*time.Second, "the guard cancels", func() bool { _, ok := vs.last(pgxlanes.ActionCancel); return ok })
		_, err = tx.Exec(ctx, "select 1")
		var be *pgxlanes.BudgetError
		require.ErrorAs(t, err, &be)
		assert.Equal(t, pgxlanes.ActionCancel, be.Action)
		assert.Less(t, be.Elapsed, 450*time.Millisecond, "the ladder's first step (at the budget) cancelled, not its last (at twice the budget)")
		require.NoError(t, tx.Rollback(ctx))
		assert.True(t, rowLockFree(t, dsn, 1), "the rollback freed the row")

		// A statement running past the budget: the caller returns at the budget.
		tx = beginT(t, p)
		var backend int32
		require.NoError(t, tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&backend))
		start := time.Now()
		_, err = tx.Exec(ctx, "select pg_sleep(0.8)")
		took := time.Since(start)
		require.ErrorAs(t, err, &be)
		assert.Less(t, be.Elapsed, 450*time.Millisecond, "cancelled at the budget")
		assert.Equal(t, "57014", sqlState(err))
		assert.Less(t, took, 700*time.Millisecond, "returned at the budget of 300ms, not at the end of the statement")
		v, _ := vs.last(pgxlanes.ActionCancel)
		assert.NotEqual(t, uint32(backend), v.PID, "Violation.PID is PgBouncer's cancel key, not the backend's PID")
		opened := p.Stat().NewConnsCount()
		require.NoError(t, tx.Rollback(ctx))
		lanesIdle(t, p, "after the cancelled statement")
		require.NoError(t, p.QueryRow(ctx, "select 1").Scan(new(int)))
		assert.Equal(t, opened+1, p.Stat().NewConnsCount(), "the interrupted connection was closed, not reused")
		assert.EqualValues(t, 0, p.Stat().Lane(pgxlanes.Tx).BudgetTerminates)
		b.requireAlive(t, "after the cancels")
	})

	t.Run("session mode terminate", func(t *testing.T) {
		dsn := newDB(t, 10)
		b := startBouncer(t, dsn, "session")
		sessionModeDefaults(t, b, dsn)
		p, vs := guardedBouncerPool(t, b, "pool_max_conns=4&lane_tx_budget=300ms&lane_tx_over_budget=terminate")
		tx := beginT(t, p)
		var backend int32
		require.NoError(t, tx.QueryRow(ctx, "select pg_backend_pid() from items where id = 2 for update").Scan(&backend))
		assert.NotEqual(t, uint32(backend), tx.Conn().PgConn().PID(), "the client sees PgBouncer's key, not the backend's PID")
		pgserver.Eventually(t, 7*time.Second, "the guard acts", func() bool { _, ok := vs.last(pgxlanes.ActionTerminate); return ok })
		v, _ := vs.last(pgxlanes.ActionTerminate)
		require.Error(t, v.Err, "the terminate cannot be verified: the PID is not a backend's")
		assert.Contains(t, v.Err.Error(), "not a session of this server")
		assert.EqualValues(t, 1, p.Stat().Lane(pgxlanes.Tx).BudgetTerminateFailures)
		assert.EqualValues(t, 0, p.Stat().Lane(pgxlanes.Tx).BudgetTerminates)
		// The pool closed its socket: PgBouncer drops the server connection and the backend
		// rolls back, freeing the row.
		pgserver.Eventually(t, 2*time.Second, "the row lock freed", func() bool { return rowLockFree(t, dsn, 2) })
		assert.False(t, backendAlive(t, uint32(backend)), "the backend ended with its server connection")
		_, err := tx.Exec(ctx, "select 1")
		var be *pgxlanes.BudgetError
		require.ErrorAs(t, err, &be)
		assert.Equal(t, pgxlanes.ActionTerminate, be.Action)
		assert.Error(t, be.Failed)
		_ = tx.Rollback(ctx)
		lanesIdle(t, p, "after the failed terminate")
		b.requireAlive(t, "after the failed terminate")
	})
}

// TestPgBouncerTimeoutInterplay: PgBouncer's own timeouts against pgxlanes', in transaction mode
// (session mode behaves the same for these).
//
// query_wait_timeout: a lane admits a call when it has a slot; if PgBouncer has no server
// connection free, the call then waits inside PgBouncer, where the lanes cannot see it: Short's
// acquire timeout does not apply, and the lookup queues behind transactions again. PgBouncer
// ends the wait at query_wait_timeout by closing the client connection (FATAL 08P01). With
// PgBouncer's pool at least the size of the pgxlanes pools in front of it (plus a guard session
// each), nothing waits there.
//
// idle_transaction_timeout: shorter than a lane's budget, PgBouncer closes the connection first
// and the application gets an untyped FATAL instead of a *BudgetError. Longer (or off), the
// budget acts first; a transaction whose owner never comes back is then ended by the
// idle_in_transaction backstop, which pgxlanes sets with SET LOCAL in transaction mode.
func TestPgBouncerTimeoutInterplay(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 10)
	b := startBouncer(t, dsn, "transaction")

	t.Run("query_wait_timeout", func(t *testing.T) {
		b.set(t, "default_pool_size", "1")
		b.set(t, "query_wait_timeout", "0.5")
		defer b.set(t, "query_wait_timeout", "120")
		p, _ := guardedBouncerPool(t, b, "pool_max_conns=4")
		require.NoError(t, p.Ping(ctx))
		tx := beginT(t, p) // takes PgBouncer's only server connection
		_, err := tx.Exec(ctx, "select 1")
		require.NoError(t, err)
		waited := make(chan poolStats, 1)
		go func() {
			time.Sleep(250 * time.Millisecond)
			waited <- b.pool(t)
		}()
		start := time.Now()
		err = p.QueryRow(ctx, "select 1").Scan(new(int))
		took := time.Since(start)
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe, "the lookup fails with PgBouncer's FATAL")
		assert.Equal(t, "08P01", pe.Code)
		assert.Contains(t, pe.Message, "query_wait_timeout")
		assert.GreaterOrEqual(t, took, 500*time.Millisecond)
		ps := <-waited
		// The guard session may be waiting too: it asks the server for idle_session_timeout when it
		// opens, which needs a server connection like any other client.
		assert.GreaterOrEqual(t, ps.clWaiting, 1, "the lookup waited inside PgBouncer: %+v", ps)
		short := p.Stat().Lane(pgxlanes.Short)
		assert.EqualValues(t, 0, short.Timeouts+short.Errors, "the lanes admitted the lookup at once and never saw the wait")
		t.Logf("PgBouncer pool 1 < pgxlanes pool 4: a lookup admitted by Short waited %s inside PgBouncer, then: %v", fmtDur(took), err)

		// PgBouncer's pool sized for the pgxlanes pool and its guard session: the lookup runs
		// at once, the transaction still open.
		b.set(t, "default_pool_size", "5")
		start = time.Now()
		require.NoError(t, p.QueryRow(ctx, "select 1").Scan(new(int)))
		took = time.Since(start)
		assert.Less(t, took, 300*time.Millisecond)
		t.Logf("PgBouncer pool 5 ≥ pgxlanes pool 4 + guard: the lookup took %s", fmtDur(took))
		require.NoError(t, tx.Rollback(ctx))
		lanesIdle(t, p, "after query_wait_timeout")
	})

	t.Run("idle_transaction_timeout shorter than the budget", func(t *testing.T) {
		b.set(t, "default_pool_size", "5")
		b.set(t, "idle_transaction_timeout", "0.5")
		defer b.set(t, "idle_transaction_timeout", "0")
		p, vs := guardedBouncerPool(t, b, "pool_max_conns=4&lane_tx_budget=5s")
		tx := beginT(t, p)
		_, err := tx.Exec(ctx, "select 1 from items where id = 3 for update")
		require.NoError(t, err)
		pgserver.Eventually(t, 3*time.Second, "PgBouncer ends the idle transaction", func() bool { return rowLockFree(t, dsn, 3) })
		_, err = tx.Exec(ctx, "select 1")
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "08P01", pe.Code)
		assert.Contains(t, pe.Message, "idle transaction timeout")
		assert.NotErrorIs(t, err, pgxlanes.ErrBudgetExceeded, "PgBouncer acted first: no budget error")
		_ = tx.Rollback(ctx)
		lanesIdle(t, p, "after PgBouncer's idle_transaction_timeout")
		vs.mu.Lock()
		assert.Empty(t, vs.v, "the guard never acted")
		vs.mu.Unlock()
	})

	t.Run("budget and backstop inside PgBouncer's timeouts", func(t *testing.T) {
		// Budget 300ms, cancel: the guard cancels at 300ms and again at 600ms (behind a
		// transaction pooler its last step is a cancel, not a terminate); the backstop
		// idle_in_transaction_session_timeout = 600ms + 1s ends an idle transaction on the server.
		p, vs := guardedBouncerPool(t, b, "pool_max_conns=4&lane_tx_budget=300ms")
		tx := beginT(t, p)
		began := time.Now()
		_, err := tx.Exec(ctx, "select 1 from items where id = 4 for update")
		require.NoError(t, err)
		// The owner is stuck and never calls again: only the server can free the row.
		pgserver.Eventually(t, 5*time.Second, "the backstop frees the row", func() bool { return rowLockFree(t, dsn, 4) })
		freed := time.Since(began)
		t.Logf("an abandoned transaction's row freed by the SET LOCAL backstop after %s (expected about 1.6s)", fmtDur(freed))
		assert.Greater(t, freed, 1200*time.Millisecond, "not before the backstop")
		_, ok := vs.last(pgxlanes.ActionCancel)
		assert.True(t, ok, "the guard cancelled first")
		_, err = tx.Exec(ctx, "select 1")
		require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
		_ = tx.Rollback(ctx)
		lanesIdle(t, p, "after the backstop")
		assert.NoError(t, p.QueryRow(ctx, "select 1").Scan(new(int)), "the pool serves the next call")
	})
	b.requireAlive(t, "after the timeouts")
}

// beginT begins a transaction on p that is rolled back when t ends, before p is closed: a test
// that fails while it holds one must not hang in the pool's Close.
func beginT(t *testing.T, p *pgxlanes.Pool) pgx.Tx {
	t.Helper()
	tx, err := p.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(ctx)
	})
	return tx
}

// errorsIsAny reports whether err is any of targets.
func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
