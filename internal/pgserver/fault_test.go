package pgserver_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// procStat returns the state letter and parent id of pid, or ok false if it is gone.
func procStat(t *testing.T, pid int) (state byte, ppid int, ok bool) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ppid, err = strconv.Atoi(f[1])
	require.NoError(t, err)
	return f[0][0], ppid, f[0][0] != 'Z'
}

// childrenOf lists the live children of pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := filepath.Glob("/proc/[0-9]*")
	require.NoError(t, err)
	var kids []int
	for _, e := range entries {
		id, err := strconv.Atoi(filepath.Base(e))
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(t, id); ok && ppid == pid {
			kids = append(kids, id)
		}
	}
	return kids
}

func backendPID(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var pid int
	require.NoError(t, conn.QueryRow(context.Background(), "select pg_backend_pid()").Scan(&pid))
	return pid
}

func TestStartLocalOptionsAndFacts(t *testing.T) {
	t.Parallel() // each on a server of its own
	ctx := testCtx(t, time.Minute)
	s := pgserver.NewLocal(t, pgserver.Options{
		MaxConnections: 5,
		Settings:       map[string]string{"statement_timeout": "1234ms", "application_name": "fault test"},
	})
	require.Equal(t, pgserver.SourceLocal, s.Source())

	conn := connect(t, s.DSN())
	var maxConns, timeout, appName, dataDir, port string
	require.NoError(t, conn.QueryRow(ctx, "select current_setting('max_connections'), current_setting('statement_timeout'), "+
		"current_setting('application_name'), current_setting('data_directory'), current_setting('port')").
		Scan(&maxConns, &timeout, &appName, &dataDir, &port))
	assert.Equal(t, "5", maxConns)
	assert.Equal(t, "1234ms", timeout)
	assert.Equal(t, "fault test", appName)

	// Process facts.
	assert.Equal(t, s.DataDir(), dataDir)
	assert.Equal(t, strconv.Itoa(s.Port()), port)
	assert.Contains(t, s.DSN(), "127.0.0.1:"+port)
	_, ppid, ok := procStat(t, backendPID(t, conn))
	require.True(t, ok)
	assert.Equal(t, s.PID(), ppid, "PID is the postmaster, the parent of every backend")
	pidFile, err := os.ReadFile(filepath.Join(s.DataDir(), "postmaster.pid"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(pidFile), strconv.Itoa(s.PID())+"\n"), "postmaster.pid")

	// The superuser postgres gets all MaxConnections, and not one more.
	for range 4 {
		connect(t, s.DSN())
	}
	_, err = pgx.Connect(ctx, s.DSN())
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "53300", pgErr.Code, "too many clients")

	// Each StartLocal is a new server.
	other := pgserver.NewLocal(t, pgserver.Options{})
	assert.NotEqual(t, s.Port(), other.Port())
	assert.NotEqual(t, s.PID(), other.PID())
	assert.NotEqual(t, s.DataDir(), other.DataDir())
	assert.NotEqual(t, s.DSN(), other.DSN())
	require.NoError(t, other.Close())
	assert.Zero(t, other.PID(), "closed")
	_, err = os.Stat(other.DataDir())
	assert.True(t, os.IsNotExist(err), "data directory removed by Close")
}

func TestStartLocalBadOptions(t *testing.T) {
	t.Parallel() // each on a server of its own
	ctx := testCtx(t, time.Minute)
	for _, tc := range []struct {
		name string
		o    pgserver.Options
		want string
	}{
		{"negative", pgserver.Options{MaxConnections: -1}, "Options.MaxConnections: -1 is negative"},
		{"within reserve", pgserver.Options{MaxConnections: 3}, "Options.MaxConnections: 3 must exceed superuser_reserved_connections (3)"},
		{"within lowered reserve", pgserver.Options{MaxConnections: 1, Settings: map[string]string{"superuser_reserved_connections": "1"}},
			"Options.MaxConnections: 1 must exceed superuser_reserved_connections (1)"},
		{"port", pgserver.Options{Settings: map[string]string{"port": "1"}}, "Options.Settings: port cannot be set"},
		{"max_connections", pgserver.Options{Settings: map[string]string{"Max_Connections": "9"}}, "use Options.MaxConnections"},
		{"listen", pgserver.Options{Settings: map[string]string{"listen_addresses": "*"}}, "127.0.0.1 only"},
		{"name", pgserver.Options{Settings: map[string]string{"work mem": "1MB"}}, `Options.Settings: "work mem" is not a setting name`},
		{"reserve", pgserver.Options{Settings: map[string]string{"superuser_reserved_connections": "x"}}, "is not an integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := pgserver.StartLocal(ctx, tc.o)
			require.ErrorContains(t, err, tc.want)
			assert.Nil(t, s)
			assert.True(t, strings.HasPrefix(err.Error(), "harness: "), err.Error())
		})
	}

	// A value PostgreSQL rejects: the error carries its log.
	_, err := pgserver.StartLocal(ctx, pgserver.Options{Settings: map[string]string{"work_mem": "banana"}})
	require.ErrorContains(t, err, `invalid value for parameter "work_mem"`)
}

func TestRestart(t *testing.T) {
	t.Parallel() // each on a server of its own
	ctx := testCtx(t, time.Minute)
	s := pgserver.NewLocal(t, pgserver.Options{})
	dsn, port, dataDir := s.DSN(), s.Port(), s.DataDir()

	setup := connect(t, dsn)
	_, err := setup.Exec(ctx, "create table logged (x int); insert into logged values (1); "+
		"create unlogged table unlogged (x int); insert into unlogged values (1)")
	require.NoError(t, err)

	// A fast stop terminates sessions and rolls back their transactions, and keeps unlogged
	// tables.
	conn := connect(t, dsn)
	_, err = conn.Exec(ctx, "begin; insert into logged values (2)")
	require.NoError(t, err)
	oldPID := s.PID()
	st, err := s.Restart(ctx, pgserver.StopFast)
	require.NoError(t, err)
	t.Logf("fast restart: %+v", st)
	assert.Equal(t, pgserver.StopFast, st.Mode)
	assert.Equal(t, oldPID, st.OldPID)
	assert.Equal(t, s.PID(), st.NewPID)
	assert.NotEqual(t, st.OldPID, st.NewPID)
	assert.Positive(t, st.Stopping)
	assert.GreaterOrEqual(t, st.Down, st.Stopping)
	assert.Equal(t, dsn, s.DSN())
	assert.Equal(t, port, s.Port())
	assert.Equal(t, dataDir, s.DataDir())
	_, err = conn.Exec(ctx, "commit")
	assert.Error(t, err, "a session survived a fast stop")

	conn = connect(t, dsn)
	var logged, unlogged int
	count := func() {
		require.NoError(t, conn.QueryRow(ctx, "select (select count(*) from logged), (select count(*) from unlogged)").
			Scan(&logged, &unlogged))
	}
	count()
	assert.Equal(t, 1, logged, "the open transaction was rolled back, the committed row kept")
	assert.Equal(t, 1, unlogged, "a fast stop keeps unlogged tables")

	// An immediate stop is a crash: recovery empties unlogged tables.
	st, err = s.Restart(ctx, pgserver.StopImmediate)
	require.NoError(t, err)
	t.Logf("immediate restart: %+v", st)
	assert.Equal(t, pgserver.StopImmediate, st.Mode)
	assert.NotEqual(t, st.OldPID, st.NewPID)
	assert.Error(t, conn.Ping(ctx), "a session survived an immediate stop")
	conn = connect(t, dsn)
	count()
	assert.Equal(t, 1, logged)
	assert.Equal(t, 0, unlogged, "no crash recovery after an immediate stop")

	_, err = s.Restart(ctx, pgserver.StopMode(9))
	assert.ErrorContains(t, err, "mode")
}

func TestStopAndStartPostmaster(t *testing.T) {
	t.Parallel() // each on a server of its own
	ctx := testCtx(t, time.Minute)
	s := pgserver.NewLocal(t, pgserver.Options{})
	require.NoError(t, s.StopPostmaster(pgserver.StopImmediate))
	assert.Zero(t, s.PID())
	_, err := pgx.Connect(ctx, s.DSN())
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "nothing listens while stopped")
	require.NoError(t, s.StopPostmaster(pgserver.StopFast), "stopping a stopped server")
	assert.ErrorContains(t, s.Freeze(), "stopped")
	_, err = s.Restart(ctx, pgserver.StopFast)
	assert.ErrorContains(t, err, "StartPostmaster")

	require.NoError(t, s.StartPostmaster(ctx))
	pid := s.PID()
	assert.Positive(t, pid)
	require.NoError(t, s.StartPostmaster(ctx), "starting a running server")
	assert.Equal(t, pid, s.PID())
	require.NoError(t, connect(t, s.DSN()).Ping(ctx))

	require.NoError(t, s.Close())
	assert.ErrorContains(t, s.StartPostmaster(ctx), "closed")
	assert.ErrorContains(t, s.Freeze(), "closed")
	assert.NoError(t, s.Thaw())
}

func TestFaultsNeedLocalServer(t *testing.T) {
	s := pgserver.NewServer("postgres://u:secret@127.0.0.1:5439/db", pgserver.SourceDocker, nil)
	_, err := s.Restart(context.Background(), pgserver.StopFast)
	assert.ErrorIs(t, err, pgserver.ErrNotLocal)
	assert.ErrorContains(t, err, "restart")
	assert.ErrorIs(t, s.StopPostmaster(pgserver.StopFast), pgserver.ErrNotLocal)
	assert.ErrorIs(t, s.StartPostmaster(context.Background()), pgserver.ErrNotLocal)
	assert.ErrorIs(t, s.Freeze(), pgserver.ErrNotLocal)
	assert.NoError(t, s.Thaw())
	assert.False(t, s.Frozen())
	assert.Zero(t, s.PID())
	assert.Empty(t, s.DataDir())
	assert.Equal(t, 5439, s.Port())
}

func TestFreezeThaw(t *testing.T) {
	t.Parallel() // each on a server of its own
	ctx := testCtx(t, time.Minute)
	s := pgserver.NewLocal(t, pgserver.Options{})
	conn := connect(t, s.DSN())
	backend := backendPID(t, conn)
	pm := s.PID()

	require.NoError(t, s.Freeze())
	require.NoError(t, s.Freeze(), "freezing a frozen server")
	require.True(t, s.Frozen())
	kids := childrenOf(t, pm)
	require.Contains(t, kids, backend)
	require.Greater(t, len(kids), 2, "backend, checkpointer, walwriter, ...")
	for _, pid := range append(kids, pm) {
		state, _, ok := procStat(t, pid)
		if ok {
			assert.Equal(t, byte('T'), state, "process %d not stopped", pid)
		}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := pgx.Connect(short, s.DSN())
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded, "a frozen server answered")

	require.NoError(t, s.Thaw())
	require.NoError(t, s.Thaw(), "second Thaw")
	assert.False(t, s.Frozen())
	for _, pid := range append(kids, pm) {
		if state, _, ok := procStat(t, pid); ok {
			assert.NotEqual(t, byte('T'), state, "process %d still stopped", pid)
		}
	}
	require.NoError(t, conn.Ping(ctx))
	require.NoError(t, connect(t, s.DSN()).Ping(ctx))

	// Restart thaws first.
	require.NoError(t, s.Freeze())
	_, err = s.Restart(ctx, pgserver.StopFast)
	require.NoError(t, err)
	assert.False(t, s.Frozen())
	require.NoError(t, connect(t, s.DSN()).Ping(ctx))

	// Close thaws first: nothing stays behind.
	pm = s.PID()
	require.NoError(t, s.Freeze())
	kids = childrenOf(t, pm)
	require.NoError(t, s.Close())
	for _, pid := range append(kids, pm) {
		_, _, ok := procStat(t, pid)
		assert.False(t, ok, "process %d of a closed frozen server lives on", pid)
	}
}

func TestStartLocalNeverUsesEnv(t *testing.T) {
	t.Setenv(pgserver.EnvDatabase, "postgres://u:p@127.0.0.1:1/db")
	s := pgserver.NewLocal(t, pgserver.Options{})
	assert.Equal(t, pgserver.SourceLocal, s.Source())
	assert.NotContains(t, s.DSN(), "127.0.0.1:1/")
	require.NoError(t, connect(t, s.DSN()).Ping(context.Background()))
}
