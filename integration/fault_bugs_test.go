package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Tests that pin the five bugs of issue 12. Each fails on the code the issue describes.

// adminConn opens a connection to dsn for out-of-band checks, closed with the test.
func adminConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// guardPIDs lists the backends of the guard sessions on the admin connection's database.
func guardPIDs(t *testing.T, admin *pgx.Conn) []int32 {
	t.Helper()
	rows, err := admin.Query(context.Background(), `select pid from pg_stat_activity
		where application_name = 'pgxlanes guard' and datname = current_database()`)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

// waitGuard waits until the pool's guard session is open and returns its backend's PID.
func waitGuard(t *testing.T, admin *pgx.Conn) int32 {
	t.Helper()
	var pids []int32
	pgserver.Eventually(t, 10*time.Second, "the guard session is open", func() bool {
		pids = guardPIDs(t, admin)
		return len(pids) == 1
	})
	return pids[0]
}

func aliveOn(t *testing.T, admin *pgx.Conn, pid int32) bool {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), "select count(*) from pg_stat_activity where pid = $1", pid).Scan(&n))
	return n > 0
}

// lockRow begins a transaction that locks row id and returns it with its backend's PID.
func lockRow(t *testing.T, p *pgxlanes.Pool, id int) (pgx.Tx, int32) {
	t.Helper()
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	require.NoError(t, err)
	var pid int32
	require.NoError(t, tx.QueryRow(ctx, "select pg_backend_pid() from items where id = $1 for update", id).Scan(&pid))
	return tx, pid
}

// requireVerifiedTerminate waits for the guard's terminate of tx and checks that it was reported
// as done only because it was: the backend is gone, the counters say terminated, and the
// transaction's next call fails with a *BudgetError without Failed.
func requireVerifiedTerminate(t *testing.T, p *pgxlanes.Pool, ch chan pgxlanes.Violation, admin *pgx.Conn, tx pgx.Tx, pid int32) {
	t.Helper()
	v := waitAction(t, ch, pgxlanes.ActionTerminate, 15*time.Second)
	require.NoError(t, v.Err, "the terminate failed (or was reported so)")
	assert.False(t, aliveOn(t, admin, pid), "reported terminated, but backend %d is alive", pid)
	st := p.Stat().Lane(pgxlanes.Tx)
	assert.EqualValues(t, 1, st.BudgetTerminates)
	assert.EqualValues(t, 0, st.BudgetTerminateFailures)
	_, err := tx.Exec(context.Background(), "select 1")
	var be *pgxlanes.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, pgxlanes.ActionTerminate, be.Action)
	assert.NoError(t, be.Failed)
	_ = tx.Rollback(context.Background())
	lanesIdle(t, p, "after the terminate")
}

// TestFaultGuardTerminateAfterGuardSessionDied pins bug 1: the first terminate after the guard's
// own session died (a restart; a firewall or idle_session_timeout, here pg_terminate_backend on
// it) still terminates: the guard notices its dead session, opens a new one and tries again, and
// reports "terminated" only once the backend is verified gone. A terminate that fails is
// reported as failed: TestFaultGuardNeverBlocksCaller and TestPgBouncerBudgets/session_mode_terminate.
func TestFaultGuardTerminateAfterGuardSessionDied(t *testing.T) {
	srv := pgserver.NewLocal(t, pgserver.Options{})
	createFaultTable(t, srv.DSN())
	ctx := context.Background()
	const params = "pool_max_conns=4&lane_tx_budget=500ms&lane_tx_over_budget=terminate"

	t.Run("guard session terminated", func(t *testing.T) {
		ch := make(chan pgxlanes.Violation, 16)
		p, _ := newGuardedPool(t, srv.DSN(), params, violationsTo(ch))
		require.NoError(t, p.Ping(ctx))
		admin := adminConn(t, srv.DSN())
		guard := waitGuard(t, admin)
		var ok bool
		require.NoError(t, admin.QueryRow(ctx, "select pg_terminate_backend($1, 5000)", guard).Scan(&ok))
		require.True(t, ok)
		tx, pid := lockRow(t, p, 1)
		requireVerifiedTerminate(t, p, ch, admin, tx, pid)
		assert.NotContains(t, guardPIDs(t, admin), guard, "the dead guard session is replaced")
	})

	t.Run("server restarted", func(t *testing.T) {
		ch := make(chan pgxlanes.Violation, 16)
		p, _ := newGuardedPool(t, srv.DSN(), params, violationsTo(ch))
		require.NoError(t, p.Ping(ctx))
		admin := adminConn(t, srv.DSN())
		waitGuard(t, admin)
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := srv.Restart(rctx, pgserver.StopFast)
		require.NoError(t, err)
		admin = adminConn(t, srv.DSN())
		// The pool's idle connections died with the server: pgxpool finds them closed and opens new
		// ones; the guard session is dead too, and nothing has told the guard.
		var tx pgx.Tx
		var pid int32
		pgserver.Eventually(t, 10*time.Second, "a transaction after the restart", func() bool {
			c, err := p.Begin(ctx)
			if err != nil {
				return false
			}
			if err := c.QueryRow(ctx, "select pg_backend_pid() from items where id = 1 for update").Scan(&pid); err != nil {
				_ = c.Rollback(ctx)
				return false
			}
			tx = c
			return true
		})
		requireVerifiedTerminate(t, p, ch, admin, tx, pid)
	})
}

// TestFaultGuardNeverBlocksCaller pins bug 2: no caller waits on the guard's network I/O. The
// link to the server is blackholed (the guard's session included), then the guard cancels a
// statement over budget and, at twice the budget, terminates the transaction, which hangs on the
// blackholed guard session for its 5 s. The statement returns at the budget; Rollback, called
// while the terminate hangs, returns at once; the terminate is reported as failed, not done.
func TestFaultGuardNeverBlocksCaller(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 10)
	proxy := pgserver.NewProxy(t, dsn)
	const budget = 400 * time.Millisecond
	ch := make(chan pgxlanes.Violation, 16)
	p, _ := newGuardedPool(t, proxy.DSN(), "pool_max_conns=4&lane_tx_budget=400ms&lane_tx_over_budget=cancel", func(c *pgxlanes.Config) {
		c.CancelGrace = time.Second
		violationsTo(ch)(c)
	})
	require.NoError(t, p.Ping(ctx))
	waitGuard(t, adminConn(t, dsn))

	tx, err := p.Begin(ctx)
	require.NoError(t, err)
	began := time.Now()
	_, err = tx.Exec(ctx, "select 1")
	require.NoError(t, err)
	require.NoError(t, proxy.SetBlackhole(faultproxy.Both, true))
	defer proxy.Normal() //nolint:errcheck

	// The statement hangs on the blackholed link; the guard's cancel returns it at the budget,
	// before the caller's own 1 s deadline.
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	start := time.Now()
	_, err = tx.Exec(sctx, "select pg_sleep(5)")
	took := time.Since(start)
	cancel()
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
	assert.Less(t, took, time.Second+faultSlack/4, "the statement returned after %v", took)

	// At twice the budget the guard terminates; its I/O hangs on the blackhole.
	time.Sleep(time.Until(began.Add(2*budget + 300*time.Millisecond)))
	start = time.Now()
	err = tx.Rollback(ctx)
	took = time.Since(start)
	t.Logf("guard I/O blackholed: Rollback returned after %v (%v)", fmtDur(took), err)
	figure(t, "fault_guard_blackholed_rollback_ms", ms(took))
	assert.Less(t, took, 500*time.Millisecond, "Rollback waited on the guard's terminate")

	v := waitAction(t, ch, pgxlanes.ActionTerminate, 15*time.Second)
	require.Error(t, v.Err, "the terminate could not reach the server: it must be reported as failed")
	st := p.Stat().Lane(pgxlanes.Tx)
	assert.EqualValues(t, 0, st.BudgetTerminates)
	assert.EqualValues(t, 1, st.BudgetTerminateFailures)
	require.NoError(t, proxy.Normal())
	lanesIdle(t, p, "after the blackhole")
	require.NoError(t, p.QueryRow(ctx, "select 1").Scan(new(int)))
}

// TestFaultAcquireTimeoutWhilePinging pins bug 3: the lane's acquire timeout holds while pgxpool
// pings an idle connection on a frozen server. The connection is idle for over a second, so
// pgxpool pings it before handing it out; the server never answers; a Short Exec with
// context.Background() gets ErrAcquireTimeout at Short's acquire timeout (1 s), not when the
// server thaws.
func TestFaultAcquireTimeoutWhilePinging(t *testing.T) {
	srv := pgserver.NewLocal(t, pgserver.Options{})
	ctx := context.Background()
	p := newLanes(t, srv.DSN(), "pool_max_conns=4&lane_short_acquire_timeout=1s")
	_, err := p.Exec(ctx, "select 1")
	require.NoError(t, err)
	time.Sleep(1500 * time.Millisecond) // pgxpool pings a connection idle for more than 1 s
	require.NoError(t, srv.Freeze())
	defer srv.Thaw() //nolint:errcheck

	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := p.Exec(context.Background(), "select 1")
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(time.Second + faultSlack + 5*time.Second):
		require.NoError(t, srv.Thaw())
		<-done
		t.Fatalf("Exec(context.Background()) on a frozen server did not return within its acquire timeout; it returned only after the thaw, %v later", time.Since(start))
	}
	took := time.Since(start)
	t.Logf("frozen server, idle connection pinged: Exec returned after %v: %v", fmtDur(took), err)
	figure(t, "fault_frozen_ping_acquire_ms", ms(took))
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout)
	assert.Less(t, took, time.Second+faultSlack)
	require.NoError(t, srv.Thaw())
	pgserver.Eventually(t, 10*time.Second, "the pool serves after the thaw", func() bool {
		return p.QueryRow(ctx, "select 1").Scan(new(int)) == nil
	})
	lanesIdle(t, p, "after the thaw")
}

// TestFaultGuardOpensEagerly pins bug 4: the guard session opens with the pool (it used to at the
// first terminate; TestGuardOpensWithThePool shows it opens before the pool's first connection),
// so a server that later reaches max_connections cannot refuse it and the terminate works.
func TestFaultGuardOpensEagerly(t *testing.T) {
	srv := pgserver.NewLocal(t, pgserver.Options{MaxConnections: 6})
	createFaultTable(t, srv.DSN())
	ctx := context.Background()
	ch := make(chan pgxlanes.Violation, 16)
	p, _ := newGuardedPool(t, srv.DSN(), "pool_max_conns=4&lane_tx_budget=500ms&lane_tx_over_budget=terminate", violationsTo(ch))
	require.NoError(t, p.Ping(ctx))
	admin := adminConn(t, srv.DSN())
	deadline := time.Now().Add(5 * time.Second)
	for len(guardPIDs(t, admin)) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Not fatal: the terminate below shows what a lazy guard costs.
	assert.Len(t, guardPIDs(t, admin), 1, "the guard session opens with the pool")
	// Take every connection the server has left.
	fillers := 0
	for ; fillers < 10; fillers++ {
		c, err := pgx.Connect(ctx, srv.DSN())
		if err != nil {
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			require.Equal(t, "53300", pgErr.Code)
			break
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
	}
	require.Less(t, fillers, 10, "the server never refused a connection")
	t.Logf("server at max_connections 6: pool 1, guard 1, admin 1, fillers %d", fillers)
	tx, pid := lockRow(t, p, 1) // on the pool's idle connection
	requireVerifiedTerminate(t, p, ch, admin, tx, pid)
}

// TestFaultBlackholedCapacityNotFree pins bug 5: capacity whose connections are blackholed is
// not reported free. Three lookups hang on a blackholed link and return at their 300 ms
// deadline; their slots stay in use (Cleaning) while the pool tries to clean the connections,
// and pgxpool's figures never show more connections taken than the lanes do for long. Both go
// back to 0 within CancelGrace plus a slack, not after pgx's 15 s close of a dead socket.
func TestFaultBlackholedCapacityNotFree(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 10)
	proxy := pgserver.NewProxy(t, dsn)
	const grace = time.Second
	cfg, err := pgxlanes.ParseConfig(withParams(proxy.DSN(), "pool_max_conns=4"))
	require.NoError(t, err)
	cfg.CancelGrace = grace
	p, err := pgxlanes.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer p.Close()
	lookups := func(d time.Duration, sql string) []error {
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for i := range errs {
			wg.Go(func() {
				c, cancel := context.WithTimeout(ctx, d)
				defer cancel()
				_, errs[i] = p.Exec(c, sql)
			})
		}
		wg.Wait()
		return errs
	}
	for _, err := range lookups(10*time.Second, "select pg_sleep(0.05)") { // three open connections
		require.NoError(t, err)
	}
	require.NoError(t, proxy.SetBlackhole(faultproxy.Both, true))
	defer proxy.Normal() //nolint:errcheck
	start := time.Now()
	for _, err := range lookups(300*time.Millisecond, "select 1") {
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	returned := time.Since(start)
	assert.Less(t, returned, 300*time.Millisecond+faultSlack)
	st := p.Stat()
	assert.Equal(t, 3, st.Lane(pgxlanes.Short).InUse, "the blackholed connections' slots are not free")
	assert.Equal(t, 3, st.Lane(pgxlanes.Short).Cleaning)

	// Until they are gone: the lanes never show less in use than pgxpool holds, but for a moment
	// (pgxpool destroys a closed connection on a goroutine of its own).
	var gapSince time.Time
	var worstGap time.Duration
	pgserver.Eventually(t, grace+5*time.Second, "the blackholed connections closed and their slots freed", func() bool {
		st := p.Stat()
		inUse := 0
		for _, l := range pgxlanes.Lanes() {
			inUse += st.Lane(l).InUse
		}
		switch {
		case int(st.AcquiredConns()) <= inUse:
			gapSince = time.Time{}
		case gapSince.IsZero():
			gapSince = time.Now()
		default:
			worstGap = max(worstGap, time.Since(gapSince))
		}
		return inUse == 0 && st.AcquiredConns() == 0
	})
	freed := time.Since(start)
	t.Logf("blackholed: callers returned after %v; slots and pgxpool's connections freed after %v (CancelGrace %v); pgxpool ahead of the lanes for at most %v",
		fmtDur(returned), fmtDur(freed), grace, fmtDur(worstGap))
	figure(t, "fault_blackholed_capacity_freed_ms", ms(freed))
	assert.Less(t, freed, grace+3*time.Second)
	assert.Less(t, worstGap, 500*time.Millisecond, "pgxpool held connections the lanes reported free")
	require.NoError(t, proxy.Normal())
	require.NoError(t, p.QueryRow(ctx, "select 1").Scan(new(int)))
}
