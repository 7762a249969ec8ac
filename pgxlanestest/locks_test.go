package pgxlanestest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/pgxlanestest"
)

const accounts = `create table accounts (id int primary key, balance bigint not null);
	insert into accounts select g, 100 from generate_series(1, 10) g`

// lockedOut reports whether row id of accounts is locked: an update waits for it beyond 100 ms.
func lockedOut(t *testing.T, dsn string, id int) bool {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	conn := connect(t, dsn)
	defer conn.Close(ctx)
	_, err := conn.Exec(ctx, "set lock_timeout = '100ms'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "update accounts set balance = balance where id = $1", id)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return true
	}
	require.NoError(t, err)
	return false
}

// waitingOnLocks counts the sessions of the database of dsn that wait for a lock.
func waitingOnLocks(t *testing.T, dsn, app string) int {
	t.Helper()
	var n int
	require.NoError(t, connect(t, dsn).QueryRow(ctx(t), `select count(*) from pg_stat_activity
		where datname = current_database() and wait_event_type = 'Lock' and application_name = $1`, app).Scan(&n))
	return n
}

func ctx(t *testing.T) context.Context { return ctxFor(t, 10*time.Second) }

// TestHoldLocksOnPool checks that HoldLocks on a pool returns with the storm in place: n
// transactions of the Tx lane, one holding the row, the others waiting for it, and the row
// locked; and that Stop ends them and frees the lane and the row.
func TestHoldLocksOnPool(t *testing.T) {
	running := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, running) }) // runs last, after the pool's cleanup
	pool := pgxlanestest.NewPool(t, pgxlanestest.WithDSNParams("pool_max_conns=8"), pgxlanestest.WithSchema(accounts))
	dsn := pgxlanestest.DSN(t, pool)
	n := pool.Stat().Lane(pgxlanes.Tx).MaxConns
	require.Equal(t, 6, n)

	h := pgxlanestest.HoldLocks(t, pool, n, time.Minute, "accounts", "id = $1", 1)
	assert.Equal(t, 1, h.Locked())
	assert.Equal(t, n, pool.Stat().Lane(pgxlanes.Tx).InUse, "every transaction has its connection")
	assert.Equal(t, n-1, waitingOnLocks(t, dsn, ""), "the others wait for the row in the server")
	assert.True(t, lockedOut(t, dsn, 1), "row 1 is locked")
	assert.False(t, lockedOut(t, dsn, 2), "row 2 is not")
	var balance int64
	require.NoError(t, pool.QueryRow(ctx(t), "select balance from accounts where id = 1").Scan(&balance),
		"a lookup of the locked row answers")

	h.Stop()
	h.Stop()
	assert.Zero(t, h.Locked())
	pgserver.Eventually(t, 10*time.Second, "the Tx lane is free", func() bool {
		return pool.Stat().Lane(pgxlanes.Tx).InUse == 0
	})
	assert.False(t, lockedOut(t, dsn, 1), "row 1 is free after Stop")
	assert.Zero(t, pool.Stat().Lane(pgxlanes.Tx).Errors)
}

// TestHoldLocksOnDSN checks that HoldLocks on a DSN takes none of the pool's connections, and that
// the pool's transactions then wait for the rows and end at the lane's lock timeout.
func TestHoldLocksOnDSN(t *testing.T) {
	pool := pgxlanestest.NewPool(t, pgxlanestest.WithDSNParams("lane_tx_lock_timeout=100ms"), pgxlanestest.WithSchema(accounts))
	dsn := pgxlanestest.DSN(t, pool)

	h := pgxlanestest.HoldLocks(t, dsn, 3, time.Minute, "public.accounts", "id in ($1, $2)", 3, 4)
	assert.Equal(t, 1, h.Locked())
	assert.Equal(t, 2, waitingOnLocks(t, dsn, "pgxlanestest HoldLocks"))
	assert.Zero(t, pool.Stat().Lane(pgxlanes.Tx).InUse)

	tx, err := pool.Begin(ctx(t))
	require.NoError(t, err)
	_, err = tx.Exec(ctx(t), "update accounts set balance = balance + 1 where id = 4")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "55P03", pgErr.Code, "lock timeout")
	require.NoError(t, tx.Rollback(ctx(t)))

	h.Stop()
	assert.False(t, lockedOut(t, dsn, 4))
}

// TestHoldLocksEndsByItself checks that the transactions end when d has passed.
func TestHoldLocksEndsByItself(t *testing.T) {
	pool := pgxlanestest.NewPool(t, pgxlanestest.WithSchema(accounts))
	h := pgxlanestest.HoldLocks(t, pool, 2, 300*time.Millisecond, "accounts", "")
	pgserver.Eventually(t, 10*time.Second, "the transactions end", func() bool {
		return h.Locked() == 0 && pool.Stat().Lane(pgxlanes.Tx).InUse == 0
	})
	assert.False(t, lockedOut(t, pgxlanestest.DSN(t, pool), 1))
}

// TestHoldLocksEarlyEndLogged checks that a transaction that the lane's lock timeout ended is
// logged by Stop, and does not fail the test.
func TestHoldLocksEarlyEndLogged(t *testing.T) {
	r := newRecorder(t)
	require.Empty(t, r.run(func(tb testing.TB) {
		pool := pgxlanestest.NewPool(tb, pgxlanestest.WithDSNParams("lane_tx_lock_timeout=200ms"), pgxlanestest.WithSchema(accounts))
		h := pgxlanestest.HoldLocks(tb, pool, 2, time.Minute, "accounts", "id = 1")
		pgserver.Eventually(t, 10*time.Second, "the waiting transaction ends", func() bool {
			return pool.Stat().Lane(pgxlanes.Tx).InUse == 1
		})
		h.Stop()
	}))
	assert.Empty(t, r.cleanup())
	logs := r.logged()
	require.Len(t, logs, 1)
	assert.Contains(t, logs[0], "pgxlanestest: HoldLocks: transaction ")
	assert.Contains(t, logs[0], "pgxlanestest: HoldLocks: transaction ")
	assert.Contains(t, logs[0], " of 2 ended early, after ")
	assert.Contains(t, logs[0], "SQLSTATE 55P03")
}

// TestHoldLocksBadInput checks that wrong parameters fail the test with their names, and that a
// DSN's password never appears.
func TestHoldLocksBadInput(t *testing.T) {
	pool := pgxlanestest.NewPool(t, pgxlanestest.WithDSNParams("pool_max_conns=8"), pgxlanestest.WithSchema(accounts))
	for _, tc := range []struct {
		name string
		f    func(tb testing.TB)
		want string
	}{
		{"n", func(tb testing.TB) { pgxlanestest.HoldLocks(tb, pool, 0, time.Second, "accounts", "") }, "n = 0: want at least 1"},
		{"d", func(tb testing.TB) { pgxlanestest.HoldLocks(tb, pool, 1, 0, "accounts", "") }, "d = 0s: want a positive duration"},
		{"table", func(tb testing.TB) { pgxlanestest.HoldLocks(tb, pool, 1, time.Second, "", "") }, "table is empty"},
		{"dots", func(tb testing.TB) { pgxlanestest.HoldLocks(tb, pool, 1, time.Second, "a..b", "") }, `table "a..b" is not a name`},
		{"nil pool", func(tb testing.TB) { pgxlanestest.HoldLocks(tb, (*pgxlanes.Pool)(nil), 1, time.Second, "accounts", "") }, "db: the pool is nil"},
		{"too many", func(tb testing.TB) { pgxlanestest.HoldLocks(tb, pool, 7, time.Second, "accounts", "") }, "n = 7 exceeds the pool's Tx lane, which holds at most 6"},
		{"no rows", func(tb testing.TB) { pgxlanestest.HoldLocks(tb, pool, 1, time.Minute, "accounts", "id = $1", 99) }, "transaction 1 of 1: no row matches"},
		{"no table", func(tb testing.TB) { pgxlanestest.HoldLocks(tb, pool, 1, time.Minute, "acounts", "") }, `relation "acounts" does not exist`},
		{"bad dsn", func(tb testing.TB) {
			pgxlanestest.HoldLocks(tb, "postgres://u:hunter2@[::1", 1, time.Second, "accounts", "")
		}, "db: not a valid DSN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(t)
			msg := r.run(tc.f)
			assert.Empty(t, r.cleanup())
			assert.Contains(t, msg, "pgxlanestest: HoldLocks: ")
			assert.Contains(t, msg, tc.want)
			assert.NotContains(t, msg, "hunter2")
		})
	}
	pgserver.Eventually(t, 10*time.Second, "nothing left held", func() bool {
		return pool.Stat().Lane(pgxlanes.Tx).InUse == 0
	})
}
