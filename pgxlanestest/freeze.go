package pgxlanestest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Frozen is a server frozen by Freeze.
type Frozen struct {
	srv   *pgserver.Server
	timer *time.Timer
	once  sync.Once
	err   error
}

// freezes counts the Freezes in force on each server: the server thaws when the last one ends.
var freezes struct {
	mu sync.Mutex
	n  map[*pgserver.Server]int
}

// Freeze stops the PostgreSQL server behind pool, a pool made by NewPool, with SIGSTOP to its
// postmaster and every backend, until d has passed, Thaw is called or the test ends. The server's
// sockets stay open: connections are accepted and then hang, and so do queries on open sessions,
// as against a server that stalls (a storage hiccup, a long GC pause of a VM). It returns once
// every process is stopped.
//
//	f := pgxlanestest.Freeze(t, pool, 5*time.Second)
//	_, err := svc.Balance(ctx, 1) // must fail within the service's deadline, not hang
//	require.NoError(t, f.Thaw())
//
// Every pool of the server hangs, those of other tests too: a test that freezes the shared server
// must not run in parallel with others (t.Parallel) unless its pool has WithPrivateServer. Freezes
// of one server nest: it thaws when the last one ends. If the test process dies while the server
// is frozen, a guard process thaws it.
//
// Only a server that pgxlanestest started from the local PostgreSQL binaries can be frozen.
// Freeze fails tb, without skipping, for a server from PGXLANES_TEST_DATABASE or from Docker
// (WithPrivateServer gives a local server whatever the shared one is).
func Freeze(tb testing.TB, pool *pgxlanes.Pool, d time.Duration) *Frozen {
	tb.Helper()
	f, err := freeze(pool, d)
	if err != nil {
		tb.Fatalf("pgxlanestest: Freeze: %v", err)
	}
	tb.Cleanup(func() {
		if err := f.Thaw(); err != nil {
			tb.Error(err)
		}
	})
	return f
}

func freeze(pool *pgxlanes.Pool, d time.Duration) (*Frozen, error) {
	if d <= 0 {
		return nil, fmt.Errorf("d = %v: want a positive duration", d)
	}
	pp, ok := lookup(pool)
	if !ok {
		return nil, errors.New("pool was not made by NewPool, or its test has ended")
	}
	srv := pp.srv
	switch srv.Source() {
	case pgserver.SourceLocal:
	case pgserver.SourceEnv:
		return nil, fmt.Errorf("the server comes from %s, and only a server that pgxlanestest started from the "+
			"local PostgreSQL binaries can be frozen: create the pool with WithPrivateServer(), or unset %s",
			EnvDatabase, EnvDatabase)
	case pgserver.SourceDocker:
		return nil, fmt.Errorf("the server runs in Docker (pgxlanestest/containers), and freezing a container is "+
			"not supported: create the pool with WithPrivateServer() (it needs the local PostgreSQL binaries), or set "+
			"%s=0 to use them for the shared server", EnvDocker)
	default:
		return nil, fmt.Errorf("the server's source %q cannot be frozen", srv.Source())
	}

	freezes.mu.Lock()
	defer freezes.mu.Unlock()
	if freezes.n[srv] == 0 {
		if err := srv.Freeze(); err != nil {
			return nil, err
		}
	}
	if freezes.n == nil {
		freezes.n = make(map[*pgserver.Server]int)
	}
	freezes.n[srv]++
	f := &Frozen{srv: srv}
	f.timer = time.AfterFunc(d, func() { _ = f.Thaw() })
	return f, nil
}

// Thaw ends this freeze: the server resumes with SIGCONT unless another Freeze of it is still in
// force. It is safe to call more than once, and returns the error of the first call; the test's
// cleanup calls it, and so does a timer after Freeze's d.
func (f *Frozen) Thaw() error {
	f.once.Do(func() {
		freezes.mu.Lock() // after freeze has set f.timer
		defer freezes.mu.Unlock()
		f.timer.Stop()
		freezes.n[f.srv]--
		if freezes.n[f.srv] > 0 {
			return
		}
		delete(freezes.n, f.srv)
		if err := f.srv.Thaw(); err != nil {
			f.err = fmt.Errorf("pgxlanestest: Thaw: %w", err)
		}
	})
	return f.err
}
