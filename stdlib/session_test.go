package stdlib_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	pgxstdlib "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
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
