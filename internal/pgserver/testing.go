package pgserver

import (
	"context"
	"crypto/rand"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// startTimeout bounds the start of the shared server. It is long because the Docker path may pull
// an image.
const startTimeout = 5 * time.Minute

// shared is the one server of a test package, started by the first DSN or NewDatabase call.
var shared struct {
	once sync.Once
	srv  *Server // nil if Start failed
	err  error
}

func sharedServer() (*Server, error) {
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		shared.srv, shared.err = Start(ctx)
	})
	return shared.srv, shared.err
}

// Main runs the package's tests and benchmarks, then stops the shared server if a test started it,
// and exits with the tests' exit code. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgserver.Main(m) }
//
// The server starts lazily, so a package whose selected tests need no server does not pay for one.
// Without Main, the server still dies with the test process, but its temporary directory stays
// until a later harness run removes it.
//
// Main also closes (and so thaws) every server from StartLocal that a test left open.
func Main(m *testing.M) {
	code := m.Run()
	fail := func(err error) {
		logf("%v", err)
		if code == 0 {
			code = 1
		}
	}
	if shared.srv != nil {
		if err := shared.srv.Close(); err != nil {
			fail(err)
		}
	}
	for _, s := range openLocal() {
		logf("a test left the local server at %s open; closing it", redact(s.DSN()))
		if err := s.Close(); err != nil {
			fail(err)
		}
	}
	os.Exit(code)
}

// DSN returns the DSN of the package's shared server, starting it on first use. If no server can
// be had, it fails tb at once with a message that says what to install.
func DSN(tb testing.TB) string {
	tb.Helper()
	s, err := sharedServer()
	if err != nil {
		tb.Fatal(err)
	}
	return s.DSN()
}

// Shared returns the package's shared server, starting it on first use, or fails tb like DSN.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	s, err := sharedServer()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// NewDatabase creates a fresh database on the shared server and returns its DSN. The database is
// dropped, its remaining sessions closed, when tb's cleanups run.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	s := Shared(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := s.CreateDatabase(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.DropDatabase(ctx, dsn); err != nil {
			tb.Error(err)
		}
	})
	return dsn
}

// Password returns cfg's password, giving cfg a random one first if it has none, for tests that
// check that a password never shows. The harness's own servers always ask for one; the server of
// PGXLANES_TEST_DATABASE may let its role in without one (trust, peer, a certificate). pgconn has
// read PGPASSWORD and the passfile into cfg already, so a cfg without a password is one whose
// server asks for none: the password given here is never sent.
func Password(cfg *pgconn.Config) string {
	if cfg.Password == "" {
		cfg.Password = "unasked-" + rand.Text()
	}
	return cfg.Password
}

// NewLocal starts a new local server with the options o (see StartLocal) and closes it, thawing
// it first, when tb's cleanups run. It fails tb at once, with what to install, if no server can
// be started; it never skips.
func NewLocal(tb testing.TB, o Options) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := StartLocal(ctx, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// Eventually polls cond every few milliseconds until it holds, and fails tb if d passes first.
// Tests use it instead of fixed sleeps for conditions that another goroutine or the server
// brings about.
func Eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
