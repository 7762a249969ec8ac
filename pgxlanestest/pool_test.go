package pgxlanestest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/pgxlanestest"
)

// TestNewPoolFreshDatabaseDropped checks that NewPool with no options gives a working pool on a
// database of its own, and that the database is gone when the test's cleanups have run.
func TestNewPoolFreshDatabaseDropped(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	var names []string
	for range 2 {
		t.Run("pool", func(t *testing.T) {
			pool := pgxlanestest.NewPool(t)
			var name string
			require.NoError(t, pool.QueryRow(ctx, "select current_database()").Scan(&name))
			names = append(names, name)
			assert.Contains(t, databases(t, ownDatabases), name)
			assert.Equal(t, name, connect(t, pgxlanestest.DSN(t, pool)).Config().Database,
				"DSN names the pool's database")
		})
	}
	require.Len(t, names, 2)
	assert.NotEqual(t, names[0], names[1], "each pool has a database of its own")
	left := databases(t, ownDatabases)
	assert.NotContains(t, left, names[0], "dropped with its test")
	assert.NotContains(t, left, names[1], "dropped with its test")
}

// TestNewPoolOptions checks that each option reaches the pool.
func TestNewPoolOptions(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	var hooked bool
	pool := pgxlanestest.NewPool(t,
		pgxlanestest.WithDSNParams("pool_max_conns=8&lane_tx_budget=2s"),
		pgxlanestest.WithDSNParams("application_name=svc"),
		pgxlanestest.WithConfig(func(c *pgxlanes.Config) { c.CaptureCallSites = true }),
		pgxlanestest.WithConfig(func(c *pgxlanes.Config) { hooked = c.CaptureCallSites }),
		pgxlanestest.WithSchema(`create table a (id int primary key); insert into a values (1), (2)`),
		pgxlanestest.WithSchema(`create table b (id int references a)`),
	)
	assert.Zero(t, pool.Stat().AcquireCount(), "the schema does not go through the pool")

	cfg := pool.Config()
	assert.EqualValues(t, 8, cfg.MaxConns)
	assert.Equal(t, 2*time.Second, cfg.Tx.Budget)
	assert.True(t, cfg.CaptureCallSites)
	assert.True(t, hooked, "WithConfig funcs run in order")

	var app string
	var n int
	require.NoError(t, pool.QueryRow(ctx, "select current_setting('application_name'), (select count(*) from a) + (select count(*) from b)").Scan(&app, &n))
	assert.Equal(t, "svc", app)
	assert.Equal(t, 2, n)
}

// TestNewPoolBadOptions checks that a wrong option fails the test with its name, never the
// password, and leaves no database behind.
func TestNewPoolBadOptions(t *testing.T) {
	before := databases(t, ownDatabases)
	for _, tc := range []struct {
		name string
		opts []pgxlanestest.Option
		want string
	}{
		{"nil option", []pgxlanestest.Option{nil}, "option 0 is nil"},
		{"not a query", []pgxlanestest.Option{pgxlanestest.WithDSNParams("a=%zz")}, "WithDSNParams: not a query string"},
		{"dbname", []pgxlanestest.Option{pgxlanestest.WithDSNParams("dbname=other")}, "WithDSNParams: dbname cannot be set"},
		{"password", []pgxlanestest.Option{pgxlanestest.WithDSNParams("password=hunter2")}, "WithDSNParams: password cannot be set"},
		{"lane param", []pgxlanestest.Option{pgxlanestest.WithDSNParams("lane_tx_budget=soon")}, `lane_tx_budget: "soon" is not a duration`},
		{"nil config", []pgxlanestest.Option{pgxlanestest.WithConfig(nil)}, "WithConfig: f is nil"},
		{"empty schema", []pgxlanestest.Option{pgxlanestest.WithSchema(" ")}, "WithSchema: sql is empty"},
		{"bad schema", []pgxlanestest.Option{pgxlanestest.WithSchema("create tabel x ()")}, `WithSchema: ERROR: syntax error at or near "tabel"`},
		{"bad config", []pgxlanestest.Option{pgxlanestest.WithConfig(func(c *pgxlanes.Config) { c.Tx.MaxConns = 1000 })}, "MaxConns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(t)
			msg := r.run(func(tb testing.TB) { pgxlanestest.NewPool(tb, tc.opts...) })
			assert.Empty(t, r.cleanup())
			assert.Contains(t, msg, "pgxlanestest: NewPool: ")
			assert.Contains(t, msg, tc.want)
			assert.NotContains(t, msg, "hunter2")
		})
	}
	assert.Equal(t, before, databases(t, ownDatabases), "no database left behind")
}

// TestNewPoolLeakedConnection checks that a pool that cannot close (a connection never
// released) fails the test instead of hanging it, and that its database is dropped anyway.
func TestNewPoolLeakedConnection(t *testing.T) {
	defer pgxlanestest.SetCloseTimeout(200 * time.Millisecond)()
	ctx := ctxFor(t, time.Minute)
	r := newRecorder(t)
	var conn *pgxlanes.Conn
	var name string
	require.Empty(t, r.run(func(tb testing.TB) {
		pool := pgxlanestest.NewPool(tb)
		var err error
		conn, err = pool.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, "select current_database()").Scan(&name))
	}))
	errs := r.cleanup()
	conn.Release() // lets the pool's Close return
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0], "the pool did not close within 200ms: 1 connection(s) still acquired")
	assert.NotContains(t, databases(t, ownDatabases), name)
}

// TestNewPoolLogsToTest checks that the pool's log lines go to the test's output.
func TestNewPoolLogsToTest(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	r := newRecorder(t)
	var logged string
	require.Empty(t, r.run(func(tb testing.TB) {
		pool := pgxlanestest.NewPool(tb, pgxlanestest.WithDSNParams("lane_tx_budget=20ms&lane_tx_over_budget=flag"))
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		pgserver.Eventually(t, 10*time.Second, "a budget flag", func() bool {
			return pool.Stat().Lane(pgxlanes.Tx).BudgetFlags > 0
		})
		require.NoError(t, tx.Rollback(ctx))
		r.mu.Lock()
		logged = r.out.String()
		r.mu.Unlock()
	}))
	assert.Empty(t, r.cleanup())
	assert.Contains(t, logged, "budget")
	assert.Contains(t, logged, "lane=tx")
}

// TestNewPoolFromEnvironment runs this test binary again with PGXLANES_TEST_DATABASE set: to the
// shared server, where NewPool uses it as is and Freeze refuses it; and to a port where nothing
// listens, where NewPool fails the test loudly without the password.
func TestNewPoolFromEnvironment(t *testing.T) {
	if os.Getenv("PGXLANESTEST_CHILD") == "1" {
		child(t)
		return
	}
	dsn := pgserver.DSN(t)
	run := func(env string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNewPoolFromEnvironment$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "PGXLANESTEST_CHILD=1", pgxlanestest.EnvDatabase+"="+env)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out, err := run(dsn)
	require.NoError(t, err, out)
	assert.Contains(t, out, "harness: using PGXLANES_TEST_DATABASE")
	assert.Contains(t, out, "child: pool answers")
	assert.Contains(t, out, "child: Freeze: pgxlanestest: Freeze: the server comes from PGXLANES_TEST_DATABASE")
	assert.Contains(t, out, "WithPrivateServer()")
	assert.NotContains(t, out, "SKIP")

	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	const password = "hunter2secret"
	out, err = run("postgres://postgres:" + password + "@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
	require.Error(t, err, out)
	assert.Contains(t, out, "pgxlanestest: NewPool: harness: create database")
	assert.Contains(t, out, "--- FAIL: TestNewPoolFromEnvironment")
	assert.NotContains(t, out, password)
	if cfg.Password != "" { // a PGXLANES_TEST_DATABASE role may have none
		assert.NotContains(t, out, cfg.Password)
	}
	assert.NotContains(t, out, "SKIP")
}

func child(t *testing.T) {
	pool := pgxlanestest.NewPool(t)
	var one int
	require.NoError(t, pool.QueryRow(context.Background(), "select 1").Scan(&one))
	t.Log("child: pool answers")
	r := newRecorder(t)
	msg := r.run(func(tb testing.TB) { pgxlanestest.Freeze(tb, pool, time.Second) })
	t.Log("child: Freeze: " + strings.ReplaceAll(msg, "\n", " "))
	r.cleanup()
}
