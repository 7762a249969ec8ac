package pgxlanestest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/pgxlanestest"
)

// stopped reports whether process pid is stopped (state T in /proc/<pid>/stat).
func stopped(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	i := bytes.LastIndexByte(b, ')')
	require.Positive(t, i)
	return b[i+2] == 'T'
}

// answers reports whether pool answers a query within 300 ms: long enough to show that a frozen
// server hangs. That a live one answers is checked with answersWithin and a generous bound: a
// first query also dials, which can take longer on a loaded machine.
func answers(t *testing.T, pool *pgxlanes.Pool) bool {
	t.Helper()
	return answersWithin(t, pool, 300*time.Millisecond)
}

func answersWithin(t *testing.T, pool *pgxlanes.Pool, d time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	err := pool.QueryRow(ctx, "select 1").Scan(new(int))
	if err != nil {
		require.ErrorIs(t, err, context.DeadlineExceeded)
		return false
	}
	return true
}

// localShared returns the shared server, which these tests freeze. On the Docker path (make
// test-containers) freezing it is unsupported by design, which TestFreezeRefusesOtherSources
// checks, so they are skipped there with that reason, and on a server of PGXLANES_TEST_DATABASE,
// which Freeze refuses too (TestNewPoolFromEnvironment); make test runs them on the local server.
// Any other source fails.
func localShared(t *testing.T) *pgserver.Server {
	t.Helper()
	srv := pgserver.Shared(t)
	switch srv.Source() {
	case pgserver.SourceLocal:
		return srv
	case pgserver.SourceDocker:
		t.Skip("the shared server is a Docker container, which Freeze refuses (TestFreezeRefusesOtherSources); make test runs this test on the local server")
	case pgserver.SourceEnv:
		t.Skipf("the shared server is %s's, which Freeze refuses (TestNewPoolFromEnvironment); make test, which does not read it, runs this test on the local server", pgserver.EnvDatabase)
	}
	t.Fatalf("this test needs the local server; the shared one is from %s", srv.Source())
	return nil
}

// TestFreezeSharedServer checks that Freeze stops the shared local server's processes, so that
// queries hang until the caller's deadline, and that Thaw resumes it.
func TestFreezeSharedServer(t *testing.T) {
	srv := localShared(t)
	pool := pgxlanestest.NewPool(t)
	require.True(t, answersWithin(t, pool, 10*time.Second))

	f := pgxlanestest.Freeze(t, pool, time.Minute)
	assert.True(t, srv.Frozen())
	assert.True(t, stopped(t, srv.PID()), "the postmaster is stopped")
	assert.False(t, answers(t, pool))

	require.NoError(t, f.Thaw())
	require.NoError(t, f.Thaw())
	assert.False(t, srv.Frozen())
	assert.False(t, stopped(t, srv.PID()))
	pgserver.Eventually(t, 10*time.Second, "the pool answers again", func() bool { return answers(t, pool) })
}

// TestFreezeNests checks that the server thaws when the last of two freezes ends.
func TestFreezeNests(t *testing.T) {
	srv := localShared(t)
	pool := pgxlanestest.NewPool(t)
	f1 := pgxlanestest.Freeze(t, pool, time.Minute)
	f2 := pgxlanestest.Freeze(t, pool, time.Minute)
	require.NoError(t, f1.Thaw())
	assert.True(t, srv.Frozen(), "another freeze is in force")
	require.NoError(t, f2.Thaw())
	assert.False(t, srv.Frozen())
}

// TestFreezeEnds checks that a freeze ends when d has passed, and with its test.
func TestFreezeEnds(t *testing.T) {
	srv := localShared(t)
	t.Run("by itself", func(t *testing.T) {
		pgxlanestest.Freeze(t, pgxlanestest.NewPool(t), time.Second) // still frozen when Freeze returns, on a loaded machine too
		require.True(t, srv.Frozen())
		pgserver.Eventually(t, 10*time.Second, "the server thaws", func() bool { return !srv.Frozen() })
	})
	t.Run("with its test", func(t *testing.T) {
		pgxlanestest.Freeze(t, pgxlanestest.NewPool(t), time.Minute)
		require.True(t, srv.Frozen())
	})
	assert.False(t, srv.Frozen())
}

// TestFreezePrivateServer checks that freezing a pool's private server leaves the shared one
// alone.
func TestFreezePrivateServer(t *testing.T) {
	private := pgxlanestest.NewPool(t, pgxlanestest.WithPrivateServer())
	shared := pgxlanestest.NewPool(t)
	require.NotEqual(t, connect(t, pgxlanestest.DSN(t, private)).Config().Port, connect(t, pgxlanestest.DSN(t, shared)).Config().Port)

	pgxlanestest.Freeze(t, private, time.Minute)
	assert.False(t, answers(t, private))
	assert.True(t, answersWithin(t, shared, 10*time.Second))
	assert.False(t, pgserver.Shared(t).Frozen())
}

func TestFreezeBadInput(t *testing.T) {
	pool := pgxlanestest.NewPool(t)
	other, err := pgxlanes.New(context.Background(), pgxlanestest.DSN(t, pool))
	require.NoError(t, err)
	defer other.Close()
	for _, tc := range []struct {
		name string
		f    func(tb testing.TB)
		want string
	}{
		{"not ours", func(tb testing.TB) { pgxlanestest.Freeze(tb, other, time.Second) }, "pool was not made by NewPool"},
		{"d", func(tb testing.TB) { pgxlanestest.Freeze(tb, pool, 0) }, "d = 0s: want a positive duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(t)
			msg := r.run(tc.f)
			assert.Empty(t, r.cleanup())
			assert.Contains(t, msg, "pgxlanestest: Freeze: "+tc.want)
		})
	}
	assert.False(t, pgserver.Shared(t).Frozen())
}
