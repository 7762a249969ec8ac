package integration

import (
	"context"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestPgBouncerDeadlineWithoutCancelRequests: with pgxlanes_cancel_requests=false the deadline
// path degrades cleanly through PgBouncer 1.18, in both pool modes. The caller returns at its
// deadline with the context's error, and PgBouncer receives no cancel request (the statement runs
// to its end and its write lands). A statement that ends within CancelGrace leaves its
// connection to be reused; one that does not gets its connection closed at CancelGrace, and
// PgBouncer then drops the server connection. The server stops the orphaned statement only if it
// checks its client socket (client_connection_check_interval, PostgreSQL 14+), which this test
// sets: the abandoned write never lands. PgBouncer is alive and the lanes idle at the end.
func TestPgBouncerDeadlineWithoutCancelRequests(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const grace = time.Second
	for _, mode := range []string{"session", "transaction"} {
		dsn := newDB(t, 1)
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "create table marks (n int not null)")
		require.NoError(t, err)
		marks := func(n int) int {
			var c int
			require.NoError(t, admin.QueryRow(ctx, "select count(*) from marks where n = $1", n).Scan(&c))
			return c
		}
		b := startBouncer(t, dsn, mode)
		if mode == "session" {
			sessionModeDefaults(t, b, dsn)
		}
		b.alterDatabase(t, dsn, "client_connection_check_interval = '100ms'")
		p, _ := newGuardedPool(t, b.dsn, "pool_max_conns=2&"+bouncerParams(mode), func(c *pgxlanes.Config) { c.CancelGrace = grace })
		require.NoError(t, p.Ping(ctx))

		// A statement that ends within CancelGrace: its connection is kept.
		opened := p.Stat().NewConnsCount()
		c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		start := time.Now()
		_, err = p.Exec(c, "insert into marks select 1 from pg_sleep(0.5)")
		took := time.Since(start)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "%s mode", mode)
		assert.Less(t, took, 400*time.Millisecond, "%s mode: returned at the deadline of 100ms, not at the statement's end", mode)
		lanesIdle(t, p, mode+" mode, after a statement that ended within the grace")
		assert.Equal(t, 1, marks(1), "%s mode: no cancel request was sent: the statement ran to its end", mode)
		require.NoError(t, p.QueryRow(ctx, "select 1").Scan(new(int)))
		assert.Equal(t, opened, p.Stat().NewConnsCount(), "%s mode: the connection was reused", mode)

		// A statement that outlives CancelGrace: its connection is closed at the grace.
		c, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
		start = time.Now()
		_, err = p.Exec(c, "insert into marks select 2 from pg_sleep(5)")
		took = time.Since(start)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "%s mode", mode)
		assert.Less(t, took, 400*time.Millisecond, "%s mode: returned at the deadline", mode)
		assert.Equal(t, 1, p.Stat().Lane(pgxlanes.Short).Cleaning, "%s mode: the slot is held while the statement may still end", mode)
		lanesIdle(t, p, mode+" mode, after a statement that outlived the grace")
		idle := time.Since(start)
		t.Logf("%s mode: caller back after %s; connection closed and lane idle after %s (CancelGrace %s)", mode, fmtDur(took), fmtDur(idle), grace)
		assert.GreaterOrEqual(t, idle, grace, "%s mode: the connection waited for the statement through the grace", mode)
		require.NoError(t, p.QueryRow(ctx, "select 1").Scan(new(int)))
		assert.Equal(t, opened+1, p.Stat().NewConnsCount(), "%s mode: the connection was closed, a new one opened", mode)
		// PgBouncer dropped the server connection; the server noticed within
		// client_connection_check_interval and rolled the insert back.
		pgserver.Eventually(t, 3*time.Second, mode+" mode: the orphaned statement stopped", func() bool {
			var n int
			require.NoError(t, admin.QueryRow(ctx, "select count(*) from pg_stat_activity where query like 'insert into marks select 2%'").Scan(&n))
			return n == 0
		})
		assert.Equal(t, 0, marks(2), "%s mode: the abandoned write did not land", mode)
		b.requireAlive(t, mode+" mode, after the deadlines")
		p.Close()
		require.NoError(t, admin.Close(ctx))
	}
}

// TestPgBouncerCancelStorm sends protocol cancel requests through the installed PgBouncer: 8
// clients for 3 s, each statement with a deadline that usually expires while it runs. It is off
// unless PGXLANES_PGBOUNCER_CANCELS=1, because PgBouncer 1.18 (Debian 12's) may crash on a cancel
// request (pgbouncer/pgbouncer#801, fixed in 1.19.1; #822 and #904, fixed in 1.21.0): run it to
// check a PgBouncer before turning pgxlanes_cancel_requests on. A crash cannot hang it: every
// call has a deadline, a drain is bounded by CancelGrace, a cancel request to a dead PgBouncer is
// refused at once, and the final check has a timeout of its own.
func TestPgBouncerCancelStorm(t *testing.T) {
	if os.Getenv("PGXLANES_PGBOUNCER_CANCELS") != "1" {
		t.Skip("sends cancel requests, which PgBouncer before 1.21 may crash on: set PGXLANES_PGBOUNCER_CANCELS=1 to run it")
	}
	dsn := newDB(t, 1)
	for _, mode := range []string{"session", "transaction"} {
		b := startBouncer(t, dsn, mode)
		params := "pool_max_conns=8"
		if mode == "transaction" {
			params += "&pgxlanes_transaction_pooler=true&default_query_exec_mode=cache_describe"
		} else {
			sessionModeDefaults(t, b, dsn)
		}
		p, _ := newGuardedPool(t, b.dsn, params, func(c *pgxlanes.Config) { c.CancelGrace = 500 * time.Millisecond })
		stop := time.Now().Add(3 * time.Second)
		var calls, deadlines, other atomic.Int64
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), 2))
				for time.Now().Before(stop) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(5+rng.IntN(40))*time.Millisecond)
					_, err := p.Exec(ctx, "select pg_sleep(0.03)")
					cancel()
					calls.Add(1)
					switch {
					case err == nil:
					case errorsIsAny(err, context.DeadlineExceeded):
						deadlines.Add(1)
					default:
						other.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		alive := b.alive()
		// A deadline that expired in the lane's queue sent nothing; one in flight, a cancel request.
		inFlight := deadlines.Load() - p.Stat().Lane(pgxlanes.Short).Canceled
		t.Logf("%s mode: %d calls, %d ended at their deadline while running (a cancel request each), %d while queued, %d other errors; PgBouncer alive: %v",
			mode, calls.Load(), inFlight, deadlines.Load()-inFlight, other.Load(), alive == nil)
		require.NoError(t, alive, "%s mode: PgBouncer died under cancel requests", mode)
		assert.Greater(t, inFlight, int64(10), "%s mode: cancel requests were sent", mode)
		lanesIdle(t, p, mode+" mode, after the storm")
		p.Close()
	}
}
