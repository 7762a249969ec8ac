package pgxlanestest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanestest"
)

func TestMain(m *testing.M) { pgxlanestest.Main(m) }

// recorder is a testing.TB whose Fatal and Error are recorded instead of failing the test, for
// tests of the helpers' failures. Fatal ends the goroutine, as testing's does: run the code under
// test with run. Everything else goes to the real test.
type recorder struct {
	testing.TB
	mu       sync.Mutex
	fatal    string
	errors   []string
	logs     []string
	cleanups []func()
	out      bytes.Buffer
}

func newRecorder(t *testing.T) *recorder { return &recorder{TB: t} }

func (r *recorder) Helper() {}

func (r *recorder) Fatal(args ...any) {
	r.mu.Lock()
	r.fatal = fmt.Sprint(args...)
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) { r.Fatal(fmt.Sprintf(format, args...)) }

func (r *recorder) Error(args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprint(args...))
}

func (r *recorder) Errorf(format string, args ...any) { r.Error(fmt.Sprintf(format, args...)) }

func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func (r *recorder) logged() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.logs)
}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// Output collects what the pool logs.
func (r *recorder) Output() io.Writer { return &syncWriter{r: r} }

// run calls f on a goroutine of its own, as testing runs a test, and returns the Fatal message
// ("" if f returned).
func (r *recorder) run(f func(tb testing.TB)) string {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fatal
}

// cleanup runs the recorded cleanups, last first, and returns the errors recorded meanwhile.
func (r *recorder) cleanup() []string {
	r.mu.Lock()
	cs := slices.Clone(r.cleanups)
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errors)
}

type syncWriter struct{ r *recorder }

func (w *syncWriter) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	return w.r.out.Write(p)
}

// ownDatabases is the prefix of the databases this test process creates. A server of
// PGXLANES_TEST_DATABASE is shared with the other packages' tests, which go test runs at the same
// time: counting databases by this prefix leaves theirs out.
var ownDatabases = pgserver.DatabasePrefix()

// databases lists the databases of the shared server whose name starts with prefix.
func databases(t *testing.T, prefix string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgserver.DSN(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `select datname from pg_database where starts_with(datname, $1) order by 1`, prefix)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// connect opens a plain connection to dsn, closed with the test.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// ctxFor returns a context that ends after d, and with the test.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
