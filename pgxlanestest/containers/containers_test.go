package containers

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

func TestHostNetwork(t *testing.T) {
	for _, tc := range []struct {
		env     string
		host    bool
		wantErr bool
	}{
		{env: "", host: false},
		{env: "bridge", host: false},
		{env: "host", host: true},
		{env: "Host", wantErr: true},
		{env: "none", wantErr: true},
	} {
		t.Run(fmt.Sprintf("%q", tc.env), func(t *testing.T) {
			t.Setenv(EnvNetwork, tc.env)
			host, err := hostNetwork()
			if tc.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), EnvNetwork)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.host, host)
		})
	}
}

func TestFreePortIsFreeOnLoopback(t *testing.T) {
	port, err := freePort()
	require.NoError(t, err)
	require.Positive(t, port)
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	require.NoError(t, err, "the port freePort returned cannot be bound")
	require.NoError(t, l.Close())
}

func TestLoopbackDSN(t *testing.T) {
	cfg, err := pgconn.ParseConfig(loopbackDSN(54321, "pw/with:odd@chars"))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", cfg.Host)
	assert.EqualValues(t, 54321, cfg.Port)
	assert.Equal(t, "postgres", cfg.User)
	assert.Equal(t, "pw/with:odd@chars", cfg.Password)
	assert.Equal(t, "postgres", cfg.Database)
	assert.Nil(t, cfg.TLSConfig, "sslmode=disable")
}

// request applies opts to an empty request, as tcpostgres.Run does after its own defaults.
func request(t *testing.T, opts []testcontainers.ContainerCustomizer) testcontainers.GenericContainerRequest {
	t.Helper()
	var req testcontainers.GenericContainerRequest
	for _, opt := range opts {
		require.NoError(t, opt.Customize(&req))
	}
	return req
}

func TestRunOptionsHostNetwork(t *testing.T) {
	req := request(t, runOptions("secret", 40123))

	assert.Equal(t, "secret", req.Env["POSTGRES_PASSWORD"])
	assert.Equal(t, "postgres", req.Env["POSTGRES_USER"])
	cmd := strings.Join(req.Cmd, " ")
	assert.Contains(t, cmd, "-c port=40123")
	assert.Contains(t, cmd, "-c listen_addresses=127.0.0.1")
	assert.Contains(t, cmd, "-c max_connections=300")

	var hc container.HostConfig
	req.HostConfigModifier(&hc)
	assert.Equal(t, container.NetworkMode("host"), hc.NetworkMode)

	es := map[string]*network.EndpointSettings{"reaper_default": {}}
	req.EndpointSettingsModifier(es)
	assert.Empty(t, es, "a container on the host's network must join no other network")

	var c container.Config
	req.ConfigModifier(&c)
	assert.Equal(t, "SIGINT", c.StopSignal)
}

func TestRunOptionsDefaultNetwork(t *testing.T) {
	req := request(t, runOptions("secret", 0))

	cmd := strings.Join(req.Cmd, " ")
	assert.NotContains(t, cmd, "listen_addresses", "the image's own listen_addresses must stay for a mapped port")
	assert.NotContains(t, cmd, "port=")
	assert.Nil(t, req.HostConfigModifier, "the network stays Docker's default")
	assert.Nil(t, req.EndpointSettingsModifier)
	assert.NotNil(t, req.WaitingFor)
}

// needDocker skips the test when no Docker engine answers, unless PGXLANES_TEST_DOCKER=1 asks
// for the Docker path (make test-containers sets it), and then fails it.
func needDocker(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dockerReady(ctx); err != nil {
		if os.Getenv(pgserver.EnvDocker) == "1" {
			t.Fatalf("%s=1 but Docker is not usable: %v", pgserver.EnvDocker, err)
		}
		t.Skipf("no Docker engine (make test-containers provides one): %v", err)
	}
}

// dsnPort returns the port of dsn.
func dsnPort(t *testing.T, dsn string) int {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	require.NoError(t, err)
	return int(cfg.Port)
}

func TestStartDocker(t *testing.T) {
	needDocker(t)
	host, err := hostNetwork()
	require.NoError(t, err)
	ctx := context.Background()

	s, err := startDocker(ctx)
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, pgserver.SourceDocker, s.Source())

	conn, err := pgx.Connect(ctx, s.DSN())
	require.NoError(t, err)
	var listen, fsync, syncCommit, maxConns, port string
	require.NoError(t, conn.QueryRow(ctx, "select current_setting('listen_addresses'), current_setting('fsync'), "+
		"current_setting('synchronous_commit'), current_setting('max_connections'), current_setting('port')").
		Scan(&listen, &fsync, &syncCommit, &maxConns, &port))
	require.NoError(t, conn.Close(ctx))
	assert.Equal(t, "off", fsync)
	assert.Equal(t, "off", syncCommit)
	assert.Equal(t, "300", maxConns)
	if host {
		assert.Equal(t, "127.0.0.1", listen, "on the host's network the server must listen on loopback only")
		assert.Equal(t, strconv.Itoa(dsnPort(t, s.DSN())), port)
		assert.Contains(t, s.DSN(), "@127.0.0.1:")
	}

	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "second Close")
	c, err := pgx.Connect(ctx, s.DSN())
	if err == nil {
		c.Close(ctx)
	}
	assert.Error(t, err, "the server still answers after Close")
}

// TestStartDockerParallel: parallel test processes each start a container; on the host's network
// they must get distinct ports.
func TestStartDockerParallel(t *testing.T) {
	needDocker(t)
	ctx := context.Background()
	var (
		wg      sync.WaitGroup
		servers [3]*pgserver.Server
		errs    [3]error
	)
	for i := range servers {
		wg.Go(func() { servers[i], errs[i] = startDocker(ctx) })
	}
	wg.Wait()
	for _, s := range servers {
		if s != nil {
			defer s.Close()
		}
	}
	var ports []int
	for i, s := range servers {
		require.NoError(t, errs[i])
		conn, err := pgx.Connect(ctx, s.DSN())
		require.NoError(t, err)
		require.NoError(t, conn.Ping(ctx))
		require.NoError(t, conn.Close(ctx))
		ports = append(ports, dsnPort(t, s.DSN()))
	}
	slices.Sort(ports)
	assert.Len(t, slices.Compact(ports), len(servers), "ports %v", ports)
}

// TestStartDockerRetriesTakenPort: on the host's network, a port taken between the check and the
// container's bind makes the step try another one.
func TestStartDockerRetriesTakenPort(t *testing.T) {
	needDocker(t)
	if host, _ := hostNetwork(); !host {
		t.Skipf("the port is chosen by the step only with %s=host", EnvNetwork)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port

	var picks []int
	pickPort = func() (int, error) {
		if len(picks) == 0 {
			picks = append(picks, takenPort)
			return takenPort, nil
		}
		p, err := freePort()
		picks = append(picks, p)
		return p, err
	}
	defer func() { pickPort = freePort }()

	t.Logf("the first start, on the taken port %d, fails on purpose (testcontainers shows its log)", takenPort)
	s, err := startDocker(context.Background())
	require.NoError(t, err)
	defer s.Close()
	require.Len(t, picks, 2, "one start on the taken port, one on a free one")
	assert.Equal(t, picks[1], dsnPort(t, s.DSN()))
}

// TestImageHonoursPostgresEnv: the image (the official one or ours) creates POSTGRES_USER with
// POSTGRES_PASSWORD, creates POSTGRES_DB and runs the init scripts in it, as testcontainers'
// Postgres module expects.
func TestImageHonoursPostgresEnv(t *testing.T) {
	needDocker(t)
	host, err := hostNetwork()
	require.NoError(t, err)
	ctx := context.Background()

	script := filepath.Join(t.TempDir(), "01-init.sql")
	require.NoError(t, os.WriteFile(script, []byte("create table seeded (id int); insert into seeded values (7);"), 0o644))

	port := 0
	if host {
		port, err = freePort()
		require.NoError(t, err)
	}
	opts := append(runOptions("alice-pw", port),
		tcpostgres.WithUsername("alice"),
		tcpostgres.WithDatabase("appdb"),
		tcpostgres.WithInitScripts(script))
	ctr, err := tcpostgres.Run(ctx, dockerImage(), opts...)
	defer func() { _ = testcontainers.TerminateContainer(ctr) }()
	require.NoError(t, err, logTail(ctr))

	dsn := strings.Replace(loopbackDSN(port, "alice-pw"), "postgres:alice-pw@", "alice:alice-pw@", 1)
	dsn = strings.Replace(dsn, "/postgres?", "/appdb?", 1)
	if !host {
		dsn, err = ctr.ConnectionString(ctx, "sslmode=disable")
		require.NoError(t, err)
	}
	require.NoError(t, pgserver.WaitReady(ctx, dsn, readyTimeout))
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var user, db string
	var super bool
	var seeded int
	require.NoError(t, conn.QueryRow(ctx, "select current_user, current_database(), "+
		"(select rolsuper from pg_roles where rolname = current_user), (select id from seeded)").
		Scan(&user, &db, &super, &seeded))
	assert.Equal(t, "alice", user)
	assert.Equal(t, "appdb", db)
	assert.True(t, super, "POSTGRES_USER is the superuser")
	assert.Equal(t, 7, seeded, "the init script ran in POSTGRES_DB")

	wrong := strings.Replace(dsn, "alice-pw@", "wrong@", 1)
	if c, err := pgx.Connect(ctx, wrong); err == nil {
		c.Close(ctx)
		t.Fatal("a wrong password is let in: POSTGRES_PASSWORD is not enforced")
	}
}
