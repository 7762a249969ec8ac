package stdlib_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	pgxstdlib "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

// churn runs db calls and transactions on db from 6 goroutines until the returned func is called,
// so that sessions change hands between the statements of a sql.Conn.
func churn(t *testing.T, db *sql.DB) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if i%2 == 0 {
					_, _ = db.ExecContext(ctx, "select pg_sleep(0.002)")
					continue
				}
				_ = inTx(ctx, db, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "select pg_sleep(0.002)")
					return err
				})
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

// A sql.Conn is one server session from its first statement to Close, with other calls taking
// and returning sessions between its statements: a temporary table, a setting, a BEGIN sent as
// SQL and a session advisory lock behave as with pgx's stdlib over pgxpool, which runs beside it.
// Without pinning the bridge ran such a sql.Conn on 5 backends.
func TestSQLConnIsOneSession(t *testing.T) {
	ctx := context.Background()
	pool, bridge := open(t, "pool_max_conns=8")
	pgxp, err := pgxpool.New(ctx, withParams(pgserver.NewDatabase(t), "pool_max_conns=8"))
	require.NoError(t, err)
	defer pgxp.Close()
	direct := pgxstdlib.OpenDBFromPool(pgxp)
	defer direct.Close()

	for _, tc := range []struct {
		name string
		db   *sql.DB
	}{{"bridge", bridge}, {"pgx stdlib", direct}} {
		t.Run(tc.name, func(t *testing.T) {
			stop := churn(t, tc.db)
			defer stop()
			for round := range 5 {
				conn, err := tc.db.Conn(ctx)
				require.NoError(t, err)
				defer conn.Close()
				backends := map[int]bool{}
				pid := func() {
					var n int
					require.NoError(t, conn.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&n))
					backends[n] = true
				}
				exec := func(q string, args ...any) {
					_, err := conn.ExecContext(ctx, q, args...)
					require.NoError(t, err, q)
					pid()
				}
				exec("select pg_advisory_lock($1)", 42+round)
				exec("create temporary table t (n int)")
				exec("set search_path = pg_temp, public")
				exec("begin")
				exec("insert into t values (1)")
				exec("commit")
				var n int
				require.NoError(t, conn.QueryRowContext(ctx, "select count(*) from t").Scan(&n), "the temporary table is there")
				assert.Equal(t, 1, n, "the transaction sent as SQL committed")
				var path string
				require.NoError(t, conn.QueryRowContext(ctx, "show search_path").Scan(&path))
				assert.Equal(t, "pg_temp, public", path)
				var unlocked bool
				require.NoError(t, conn.QueryRowContext(ctx, "select pg_advisory_unlock($1)", 42+round).Scan(&unlocked))
				assert.True(t, unlocked, "the session that took the lock released it")
				pid()
				assert.Len(t, backends, 1, "one backend for the whole sql.Conn")
				_, err = conn.ExecContext(ctx, "drop table t; reset search_path")
				require.NoError(t, err)
				require.NoError(t, conn.Close())
			}
			stop()
			var locks int
			require.NoError(t, tc.db.QueryRowContext(ctx, "select count(*) from pg_locks where locktype = 'advisory'").Scan(&locks))
			assert.Zero(t, locks, "no advisory lock left held")
		})
	}
	lanesIdle(t, pool)
}

// sql.Conn.Raw hands out a *stdlib.Conn whose Conn() is the pinned session's *pgx.Conn, with
// the same line as pgx's stdlib: CopyFrom through it fills a temporary table that the sql.Conn's
// statements see.
func TestConnRaw(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=4")
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()

	var n int
	require.NoError(t, conn.Raw(func(driverConn any) error {
		conn := driverConn.(*stdlib.Conn).Conn()
		return conn.QueryRow(ctx, "select 42").Scan(&n)
	}))
	assert.Equal(t, 42, n)
	assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "Conn pinned the session on Tx")

	_, err = conn.ExecContext(ctx, "create temporary table c (n int)")
	require.NoError(t, err)
	require.NoError(t, conn.Raw(func(driverConn any) error {
		conn := driverConn.(*stdlib.Conn).Conn()
		_, err := conn.CopyFrom(ctx, pgx.Identifier{"c"}, []string{"n"}, pgx.CopyFromRows([][]any{{1}, {2}, {3}}))
		return err
	}))
	require.NoError(t, conn.QueryRowContext(ctx, "select sum(n) from c").Scan(&n))
	assert.Equal(t, 6, n)

	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "insert into c values (4)")
	require.NoError(t, err)
	require.NoError(t, conn.Raw(func(driverConn any) error {
		return driverConn.(*stdlib.Conn).Conn().QueryRow(ctx, "select sum(n) from c").Scan(&n)
	}))
	assert.Equal(t, 10, n, "inside a transaction, the transaction's session")
	require.NoError(t, tx.Rollback())
	require.NoError(t, conn.Close())
	lanesIdle(t, pool)
}

// On a sql.Conn, PrepareContext prepares on the pinned session, as pgx's stdlib does: a syntax
// error is reported at once, the argument count is checked, two Stmts of one text share one
// server statement, deallocated when the last is closed, and a Stmt left open is deallocated
// when the sql.Conn closes.
func TestPrepareOnSession(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=4")
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	prepared := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) int {
		var n int
		require.NoError(t, q.QueryRowContext(ctx, "select count(*) from pg_prepared_statements where statement = 'select $1::int + 1'").Scan(&n))
		return n
	}

	_, err = conn.PrepareContext(ctx, "selec 1")
	require.ErrorContains(t, err, "syntax error", "prepared on the server")

	stmt1, err := conn.PrepareContext(ctx, "select $1::int + 1")
	require.NoError(t, err)
	stmt2, err := conn.PrepareContext(ctx, "select $1::int + 1")
	require.NoError(t, err)
	assert.Equal(t, 1, prepared(conn))
	var n int
	require.NoError(t, stmt1.QueryRowContext(ctx, 41).Scan(&n))
	assert.Equal(t, 42, n)
	_, err = stmt1.ExecContext(ctx)
	require.ErrorContains(t, err, "expected 1 arguments, got 0")

	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, tx.StmtContext(ctx, stmt2).QueryRowContext(ctx, 1).Scan(&n))
	assert.Equal(t, 2, n)
	require.NoError(t, tx.Commit())

	require.NoError(t, stmt1.Close())
	assert.Equal(t, 1, prepared(conn), "stmt2 still uses it")
	require.NoError(t, stmt2.Close())
	assert.Equal(t, 0, prepared(conn), "deallocated with the last Stmt")

	_, err = conn.PrepareContext(ctx, "select $1::int + 1")
	require.NoError(t, err)
	var backend int
	require.NoError(t, conn.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&backend))
	require.NoError(t, conn.Close())

	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer held.Release()
	var again int
	require.NoError(t, held.QueryRow(ctx, "select pg_backend_pid()").Scan(&again))
	require.Equal(t, backend, again, "the same session back from the pool")
	require.NoError(t, held.QueryRow(ctx, "select count(*) from pg_prepared_statements where statement = 'select $1::int + 1'").Scan(&n))
	assert.Zero(t, n, "the Stmt left open was deallocated when the sql.Conn closed")
}

// The rows of an empty result release their lease at once; their columns, asked for later, are
// still theirs, not those of the statement that the session ran next (found by -race under
// River's job fetches).
func TestColumnsAfterRelease(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=1")
	rows, err := db.QueryContext(ctx, "select 1 as a where false")
	require.NoError(t, err)
	assert.Equal(t, [3]int{}, inUse(pool), "an empty result released its lease")
	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	var b, c int
	require.NoError(t, held.QueryRow(ctx, "select 2 as b, 3 as c").Scan(&b, &c))
	held.Release()
	cols, err := rows.Columns()
	require.NoError(t, err)
	assert.Equal(t, []string{"a"}, cols)
	assert.False(t, rows.Next())
	require.NoError(t, rows.Close())
}

// slowConnector is the bridge's connector, whose Connect sleeps while slow is set: the connection
// that database/sql's opener goroutine makes then arrives after its waiter has left.
type slowConnector struct {
	driver.Connector
	slow atomic.Bool
}

func (s *slowConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if s.slow.Load() {
		time.Sleep(300 * time.Millisecond)
	}
	return s.Connector.Connect(ctx)
}

// With SetMaxOpenConns reached, a caller waits; when a connection is then closed as bad,
// database/sql's opener goroutine makes a new one and hands it to the waiter, or puts it on the
// idle list if the waiter has left, and a later caller takes it from there. The driver is told of
// neither checkout: Connect ran on the opener goroutine, and database/sql calls no ResetSession
// on a connection that was never returned. A sql.Conn that gets such a connection is still one
// server session, pinned on Tx from its first call, with other callers taking the pool's idle
// sessions between its statements; a db call that gets one pins nothing (Short, for its own
// duration). Before the fix such a sql.Conn ran each statement on a lease of its own.
func TestSQLConnOnOpenerConnectionIsOneSession(t *testing.T) {
	ctx := context.Background()
	pool := newPool(t, "pool_max_conns=8")
	connector := &slowConnector{Connector: stdlib.GetPoolConnector(pool)}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)

	// openerMade makes database/sql's opener make a connection for a caller that waits: it
	// holds the one connection, starts wait (which must queue for a connection), marks the
	// held connection bad and closes it.
	openerMade := func(t *testing.T, wait func()) {
		t.Helper()
		a, err := db.Conn(ctx)
		require.NoError(t, err)
		waits := db.Stats().WaitCount
		go wait()
		pgserver.Eventually(t, 5*time.Second, "a caller waits for a connection", func() bool {
			return db.Stats().WaitCount > waits
		})
		_ = a.Raw(func(any) error { return driver.ErrBadConn }) // database/sql closes the connection
		_ = a.Close()
	}
	// idle leaves an opener-made connection on database/sql's idle list: its waiter leaves
	// while the opener's Connect is still under way.
	idle := func(t *testing.T) {
		t.Helper()
		connector.slow.Store(true)
		defer connector.slow.Store(false)
		wctx, cancel := context.WithCancel(ctx)
		left := make(chan error, 1)
		openerMade(t, func() {
			c, err := db.Conn(wctx)
			if c != nil {
				_ = c.Close()
			}
			left <- err
		})
		cancel()
		require.ErrorIs(t, <-left, context.Canceled)
		pgserver.Eventually(t, 5*time.Second, "the opener's connection idle", func() bool {
			return db.Stats().Idle == 1
		})
	}
	oneSession := func(t *testing.T, conn *sql.Conn) {
		t.Helper()
		pid := func() int {
			var n int
			require.NoError(t, conn.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&n))
			return n
		}
		first := pid()
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "pinned on Tx between statements")
		// Another caller takes the pool's idle sessions between the sql.Conn's statements.
		var held []*pgxlanes.Conn
		for range 3 {
			c, err := pool.Acquire(ctx)
			require.NoError(t, err)
			held = append(held, c)
		}
		_, err := conn.ExecContext(ctx, "set application_name = 'one session'")
		require.NoError(t, err)
		for _, c := range held {
			c.Release()
		}
		assert.Equal(t, first, pid(), "one server session for the whole sql.Conn")
		assert.Equal(t, "one session", queryString(t, conn, ctx, "show application_name"))
		_, err = conn.ExecContext(ctx, "reset application_name")
		require.NoError(t, err)
		require.NoError(t, conn.Close())
		lanesIdle(t, pool)
	}

	t.Run("waiting db.Conn", func(t *testing.T) {
		got := make(chan *sql.Conn, 1)
		openerMade(t, func() {
			c, err := db.Conn(ctx)
			assert.NoError(t, err)
			got <- c
		})
		conn := <-got
		require.NotNil(t, conn)
		oneSession(t, conn)
	})

	t.Run("idle, then db.Conn", func(t *testing.T) {
		idle(t)
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		oneSession(t, conn)
	})

	t.Run("idle, then a transaction first", func(t *testing.T) {
		idle(t)
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		tx, err := conn.BeginTx(ctx, nil)
		require.NoError(t, err)
		var inTx int
		require.NoError(t, tx.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&inTx))
		require.NoError(t, tx.Commit())
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "the session stays pinned after Commit")
		pid := func() int {
			var n int
			require.NoError(t, conn.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&n))
			return n
		}
		assert.Equal(t, inTx, pid(), "the transaction ran inside the sql.Conn's session")
		require.NoError(t, conn.Close())
		lanesIdle(t, pool)
	})

	t.Run("idle, then a driver call under Raw first", func(t *testing.T) {
		idle(t)
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.Raw(func(driverConn any) error {
			_, err := driverConn.(driver.ExecerContext).ExecContext(ctx, "set application_name = 'raw'", nil)
			return err
		}))
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "pinned on Tx")
		assert.Equal(t, "raw", queryString(t, conn, ctx, "show application_name"))
		_, err = conn.ExecContext(ctx, "reset application_name")
		require.NoError(t, err)
		require.NoError(t, conn.Close())
		lanesIdle(t, pool)
	})

	t.Run("waiting db call", func(t *testing.T) {
		got := make(chan *sql.Rows, 1)
		openerMade(t, func() {
			rows, err := db.QueryContext(ctx, "select g from generate_series(1, 2) g")
			assert.NoError(t, err)
			got <- rows
		})
		rows := <-got
		require.NotNil(t, rows)
		assert.Equal(t, [3]int{1, 0, 0}, inUse(pool), "on Short until the rows are closed, not pinned")
		require.NoError(t, rows.Close())
		assert.Equal(t, [3]int{}, inUse(pool))
	})

	t.Run("idle, then db call", func(t *testing.T) {
		idle(t)
		rows, err := db.QueryContext(ctx, "select g from generate_series(1, 2) g")
		require.NoError(t, err)
		assert.Equal(t, [3]int{1, 0, 0}, inUse(pool), "on Short until the rows are closed, not pinned")
		require.NoError(t, rows.Close())
		assert.Equal(t, [3]int{}, inUse(pool))
	})
	lanesIdle(t, pool)
}
