package pgxlanestest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Environment variables that choose the shared server (see the package documentation).
const (
	// EnvDatabase holds the DSN of a server to use as is.
	EnvDatabase = pgserver.EnvDatabase
	// EnvDocker set to "0" skips the Docker step.
	EnvDocker = pgserver.EnvDocker
	// EnvImage chooses the image of the Docker step.
	EnvImage = pgserver.EnvImage
)

// setupTimeout bounds creating a database and running the schema.
const setupTimeout = time.Minute

// closeTimeout bounds the wait for a pool's Close at the end of a test: Close waits for every
// acquired connection, so a leaked one would hang the test binary. A variable for the tests.
var closeTimeout = 10 * time.Second

// Main runs the tests of a package, then stops the shared server if a test started one and exits
// with the tests' exit code. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgxlanestest.Main(m) }
//
// It also stops every server of WithPrivateServer that a test left running. NewPool works without
// Main; see the package documentation for what is then left behind.
func Main(m *testing.M) { pgserver.Main(m) }

// Option configures NewPool.
type Option func(*options)

type options struct {
	params  url.Values
	configs []func(*pgxlanes.Config)
	schema  []string
	private bool
	err     error
}

// WithDSNParams adds connection string parameters to the pool's DSN, in query string form:
// pgxpool's (pool_max_conns=8), pgxlanes' (lane_tx_budget=2s, see pgxlanes.ParseConfig) and the
// server's run-time parameters (application_name=api). Several calls add up; a later value of a
// parameter replaces an earlier one. The parameters that choose the server and the database
// (host, hostaddr, port, dbname, user, password) belong to NewPool.
//
//	pool := pgxlanestest.NewPool(t, pgxlanestest.WithDSNParams("pool_max_conns=8&lane_tx_budget=2s"))
func WithDSNParams(params string) Option {
	return func(o *options) {
		v, err := url.ParseQuery(params)
		if err != nil {
			// Not wrapped: the error may quote the parameters, and they may hold a password.
			o.fail(errors.New("WithDSNParams: not a query string (name=value&name=value)"))
			return
		}
		for name := range v {
			switch strings.ToLower(name) {
			case "host", "hostaddr", "port", "dbname", "database", "user", "password", "passfile", "service", "servicefile":
				o.fail(fmt.Errorf("WithDSNParams: %s cannot be set: NewPool chooses the server and the database", name))
				return
			}
		}
		if o.params == nil {
			o.params = url.Values{}
		}
		for name, values := range v {
			o.params[name] = values
		}
	}
}

// WithConfig calls f with the pool's configuration, parsed from the DSN and its WithDSNParams,
// before the pool is created: for what a DSN cannot say (OnViolation, a tracer, AfterConnect,
// CaptureCallSites). Several calls run in order.
//
// NewPool sets Config.Logger to write to the test's log (go test -v shows it, and a failed test
// shows it); f may set another.
func WithConfig(f func(*pgxlanes.Config)) Option {
	return func(o *options) {
		if f == nil {
			o.fail(errors.New("WithConfig: f is nil"))
			return
		}
		o.configs = append(o.configs, f)
	}
}

// WithSchema runs sql in the fresh database before the pool is created, over a connection of
// its own, so that the pool's figures start at zero. sql may hold several statements separated by
// semicolons (it is sent as one simple query, which runs as one transaction); it takes no
// parameters. Several calls run in order.
func WithSchema(sql string) Option {
	return func(o *options) {
		if strings.TrimSpace(sql) == "" {
			o.fail(errors.New("WithSchema: sql is empty"))
			return
		}
		o.schema = append(o.schema, sql)
	}
}

// WithPrivateServer gives the pool a server of its own, started from the local PostgreSQL
// binaries whatever PGXLANES_TEST_DATABASE and Docker offer, and stopped when the test ends. It
// costs about a second. Use it for a test that freezes the server (Freeze) while other tests run
// in parallel, since they would hang with a shared server.
func WithPrivateServer() Option {
	return func(o *options) { o.private = true }
}

func (o *options) fail(err error) {
	if o.err == nil {
		o.err = err
	}
}

// pooled is what the helpers know of a pool made by NewPool.
type pooled struct {
	srv *pgserver.Server
	dsn string // the database's DSN, without the pool's parameters
}

// pools maps every open pool made by NewPool to its pooled.
var pools sync.Map

func lookup(p *pgxlanes.Pool) (*pooled, bool) {
	v, ok := pools.Load(p)
	if !ok {
		return nil, false
	}
	return v.(*pooled), true
}

// NewPool returns a pool on a fresh database of the test binary's shared PostgreSQL (see the
// package documentation for where the server comes from), with opts applied. The database has
// been reached and its schema (WithSchema) created; the pool itself, as pgxpool's, opens its
// connections at first use.
//
// When tb's cleanups run, the pool is closed and the database dropped, its remaining sessions
// closed. If the pool does not close within 10 s because a connection is still acquired (a Conn
// not released, Rows not closed, a transaction not ended), the test fails with that, and the
// database is dropped anyway.
//
// NewPool fails tb at once, with what to install, if no server can be had, and with the name of
// the option or DSN parameter at fault if the configuration is wrong. It never skips.
func NewPool(tb testing.TB, opts ...Option) *pgxlanes.Pool {
	tb.Helper()
	var o options
	for i, opt := range opts {
		if opt == nil {
			o.fail(fmt.Errorf("option %d is nil", i))
			continue
		}
		opt(&o)
	}
	if o.err != nil {
		tb.Fatalf("pgxlanestest: NewPool: %v", o.err)
	}

	var srv *pgserver.Server
	if o.private {
		srv = pgserver.NewLocal(tb, pgserver.Options{})
	} else {
		srv = pgserver.Shared(tb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	dsn, err := srv.CreateDatabase(ctx)
	if err != nil {
		tb.Fatalf("pgxlanestest: NewPool: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := srv.DropDatabase(ctx, dsn); err != nil {
			tb.Errorf("pgxlanestest: %v", err)
		}
	})
	if err := runSchema(ctx, dsn, o.schema); err != nil {
		tb.Fatalf("pgxlanestest: NewPool: WithSchema: %v", err)
	}

	poolDSN, err := withParams(dsn, o.params)
	if err != nil {
		tb.Fatalf("pgxlanestest: NewPool: %v", err)
	}
	cfg, err := pgxlanes.ParseConfig(poolDSN)
	if err != nil {
		tb.Fatalf("pgxlanestest: NewPool: %v", err) // pgxlanes' errors name the parameter, never the password
	}
	out := &testOutput{w: tb.Output()}
	cfg.Logger = slog.New(slog.NewTextHandler(out, nil))
	for _, f := range o.configs {
		f(cfg)
	}
	pool, err := pgxlanes.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("pgxlanestest: NewPool: %v", err)
	}
	pools.Store(pool, &pooled{srv: srv, dsn: dsn})
	tb.Cleanup(func() {
		defer out.stop()
		defer pools.Delete(pool)
		closePool(tb, pool)
	})
	return pool
}

// DSN returns the DSN of the database behind pool, a pool made by NewPool: user, password and
// all, without the pool's own parameters. Other clients of the database use it (a migration tool,
// database/sql, HoldLocks acting as another service). It fails tb if pool was not made by NewPool
// or was closed.
func DSN(tb testing.TB, pool *pgxlanes.Pool) string {
	tb.Helper()
	pp, ok := lookup(pool)
	if !ok {
		tb.Fatal("pgxlanestest: DSN: pool was not made by NewPool, or its test has ended")
	}
	return pp.dsn
}

// closePool closes pool, or fails tb if Close does not return within closeTimeout.
func closePool(tb testing.TB, pool *pgxlanes.Pool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		pool.Close()
	}()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		tb.Errorf("pgxlanestest: the pool did not close within %s: %d connection(s) still acquired "+
			"(a Conn not released, Rows not closed or a transaction not ended); dropping its database anyway",
			closeTimeout, pool.Stat().AcquiredConns())
	}
}

// runSchema runs each statement of schema on a connection of its own to dsn.
func runSchema(ctx context.Context, dsn string, schema []string) error {
	if len(schema) == 0 {
		return nil
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for i, sql := range schema {
		// Without arguments pgx sends a simple query, which may hold several statements.
		if _, err := conn.Exec(ctx, sql); err != nil {
			if len(schema) > 1 {
				return fmt.Errorf("schema %d of %d: %w", i+1, len(schema), err)
			}
			return err
		}
	}
	return nil
}

// withParams returns dsn with params added, in the form of dsn: URL or keyword/value.
func withParams(dsn string, params url.Values) (string, error) {
	if len(params) == 0 {
		return dsn, nil
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("the server's DSN is not a valid URL")
		}
		q := u.Query()
		for name, values := range params {
			q[name] = values
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	var b strings.Builder
	b.WriteString(dsn)
	names := make([]string, 0, len(params))
	for name := range params {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		v := params.Get(name)
		v = strings.ReplaceAll(v, `\`, `\\`)
		v = strings.ReplaceAll(v, `'`, `\'`)
		fmt.Fprintf(&b, " %s='%s'", name, v)
	}
	return b.String(), nil
}

// testOutput writes the pool's log lines to the test's output while the test runs, and to stderr
// after its cleanup (a pool that could not be closed may still log): testing forbids writing to a
// test's output once it has ended.
type testOutput struct {
	mu sync.Mutex
	w  io.Writer // nil once stopped
}

func (o *testOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.w == nil {
		return os.Stderr.Write(p)
	}
	return o.w.Write(p)
}

func (o *testOutput) stop() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.w = nil
}
