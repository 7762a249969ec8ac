// Package containers adds a Docker step to the PostgreSQL search of pgxlanestest (and of the
// project's own test harness): when a Docker engine answers, a throwaway server runs in a
// container through testcontainers-go. Import it for its side effect:
//
//	import _ "github.com/pgxlanes/pgxlanes/pgxlanestest/containers"
//
// The container runs on Docker's default network with its port 5432 mapped, or, with
// PGXLANES_TEST_DOCKER_NETWORK=host, on the host's network with PostgreSQL on a free 127.0.0.1 port
// only: for engines that make no bridge and map no port. `make test-containers` runs the tests
// that way, on an engine of its own, with an image built from the local PostgreSQL binaries
// (.ci/containers).
//
// It is a module of its own, so that programs that do not import it do not pull testcontainers and
// moby into their module graph.
package containers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

func init() { pgserver.RegisterDocker(step{}) }

type step struct{}

func (step) Hinted() bool                                        { return dockerHinted() }
func (step) Ready(ctx context.Context) error                     { return dockerReady(ctx) }
func (step) Start(ctx context.Context) (*pgserver.Server, error) { return startDocker(ctx) }

// readyTimeout bounds the wait for a started container to accept connections.
const readyTimeout = 30 * time.Second

// DefaultImage is the Docker image used unless PGXLANES_TEST_IMAGE names another.
const DefaultImage = "postgres:17-alpine"

// dockerPingTimeout bounds the check that a Docker engine answers.
const dockerPingTimeout = 2 * time.Second

func dockerImage() string {
	if img := os.Getenv(pgserver.EnvImage); img != "" {
		return img
	}
	return DefaultImage
}

// dockerReady returns nil if a Docker engine answers a ping within dockerPingTimeout. It looks
// for a sign of an engine first (DOCKER_HOST or a socket file), so that machines without Docker
// pay nothing.
func dockerReady(ctx context.Context) (err error) {
	if os.Getenv(pgserver.EnvDocker) == "0" {
		return fmt.Errorf("skipped (%s=0)", pgserver.EnvDocker)
	}
	if !dockerHinted() {
		return errors.New("no engine (DOCKER_HOST is unset and there is no Docker socket)")
	}
	// testcontainers panics in some discovery paths; a panic here means no usable engine.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("no usable engine: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, dockerPingTimeout)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("no engine answers: %w", err)
	}
	defer cli.Close()
	if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
		return fmt.Errorf("engine does not answer a ping within %s: %w", dockerPingTimeout, err)
	}
	return nil
}

// dockerHinted reports whether something points at a Docker engine: the variables and socket
// paths that testcontainers itself looks at.
func dockerHinted() bool {
	for _, env := range []string{"DOCKER_HOST", "TESTCONTAINERS_HOST_OVERRIDE", "TESTCONTAINERS_DOCKER_SOCKET_OVERRIDE"} {
		if os.Getenv(env) != "" {
			return true
		}
	}
	sockets := []string{"/var/run/docker.sock"}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		sockets = append(sockets, filepath.Join(dir, "docker.sock"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		sockets = append(sockets,
			filepath.Join(home, ".docker", "run", "docker.sock"),
			filepath.Join(home, ".docker", "desktop", "docker.sock"),
			filepath.Join(home, ".testcontainers.properties"),
		)
	}
	for _, p := range sockets {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// EnvNetwork chooses the container's network. Empty (or "bridge") is Docker's default: the
// container's port 5432 is mapped to a port of the Docker host, and the DSN is testcontainers'.
// "host" runs the container in the host's network namespace, for engines that must not make
// bridges or forward ports: PostgreSQL listens on a free 127.0.0.1 port of its own (there is no
// port mapping, so parallel test processes need distinct ports), and the DSN names that port.
const EnvNetwork = "PGXLANES_TEST_DOCKER_NETWORK"

// startupTimeout bounds a container's start up to its readiness log line: initdb runs first, and
// the machine may be busy.
const startupTimeout = 2 * time.Minute

// portAttempts bounds the starts on host networking: a port found free may be taken by another
// process before the container's postgres binds it.
const portAttempts = 3

// errPortInUse marks a start that failed because another process took the port first.
var errPortInUse = errors.New("port already in use")

// pickPort finds a free 127.0.0.1 port; a variable so that tests can hand out a taken one.
var pickPort = freePort

// hostNetwork reports whether EnvNetwork asks for host networking.
func hostNetwork() (bool, error) {
	switch v := os.Getenv(EnvNetwork); v {
	case "", "bridge":
		return false, nil
	case "host":
		return true, nil
	default:
		return false, fmt.Errorf("containers: %s=%q: want host, bridge or empty", EnvNetwork, v)
	}
}

// startDocker runs a PostgreSQL container with the test settings and a random password, on the
// network EnvNetwork chooses. On host networking it tries another port if the one it picked was
// taken before postgres bound it.
func startDocker(ctx context.Context) (*pgserver.Server, error) {
	host, err := hostNetwork()
	if err != nil {
		return nil, err
	}
	if !host {
		return startContainer(ctx, 0)
	}
	for attempt := 1; ; attempt++ {
		port, err := pickPort()
		if err != nil {
			return nil, fmt.Errorf("containers: find a free 127.0.0.1 port: %w", err)
		}
		s, err := startContainer(ctx, port)
		if err == nil || attempt == portAttempts || !errors.Is(err, errPortInUse) {
			return s, err
		}
	}
}

// freePort returns a port that is free on 127.0.0.1 now.
func freePort() (int, error) { return pgserver.FreePort() }

// testSettings are the server settings of every test server, as the local harness uses them.
var testSettings = []string{
	"-c", "synchronous_commit=off",
	"-c", "full_page_writes=off",
	"-c", "max_connections=300",
	"-c", "shared_buffers=128MB",
}

// hostNetworkArgs are the postgres arguments on host networking: its own port, loopback only.
func hostNetworkArgs(port int) []string {
	return []string{"-c", "port=" + strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1"}
}

// loopbackDSN is the DSN of a server on 127.0.0.1:port.
func loopbackDSN(port int, password string) string {
	return (&url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword("postgres", password),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}).String()
}

// runOptions are the testcontainers options of a server with password: on host networking
// (port > 0) on 127.0.0.1:port, else on Docker's default network with a mapped port.
func runOptions(password string, port int) []testcontainers.ContainerCustomizer {
	opts := []testcontainers.ContainerCustomizer{
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword(password),
		tcpostgres.WithDatabase("postgres"),
		// The module's command is "postgres -c fsync=off"; add the other settings.
		testcontainers.WithCmdArgs(testSettings...),
		// A fast shutdown, as the official image asks for: SIGTERM would wait for the clients.
		testcontainers.WithConfigModifier(func(c *container.Config) { c.StopSignal = "SIGINT" }),
	}
	if port == 0 {
		return append(opts, tcpostgres.BasicWaitStrategies())
	}
	return append(opts,
		testcontainers.WithCmdArgs(hostNetworkArgs(port)...),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
		// testcontainers attaches the container to its default network (a bridge it makes when
		// the engine has none); a container on the host's network joins no other.
		testcontainers.WithEndpointSettingsModifier(func(es map[string]*network.EndpointSettings) {
			clear(es)
		}),
		// The module's port check would look at port 5432; pgserver.WaitReady below checks the
		// real one. The official image, and ours, log readiness twice: after the init scripts'
		// temporary server, and for real.
		testcontainers.WithWaitStrategyAndDeadline(startupTimeout,
			wait.ForLog("database system is ready to accept connections").WithOccurrence(2)),
	)
}

// startContainer runs one container: on host networking on 127.0.0.1:port when port > 0.
func startContainer(ctx context.Context, port int) (s *pgserver.Server, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers panicked: %v", r)
		}
	}()
	image := dockerImage()
	password := pgserver.RandomHex(16)
	ctr, err := tcpostgres.Run(ctx, image, runOptions(password, port)...)
	terminate := func() error {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := testcontainers.TerminateContainer(ctr, testcontainers.StopContext(stopCtx)); err != nil {
			return fmt.Errorf("containers: terminate container: %w", err)
		}
		return nil
	}
	fail := func(err error) (*pgserver.Server, error) {
		tail := logTail(ctr)
		_ = terminate() // Run may return a container that started but never became ready
		if port > 0 && strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w (127.0.0.1:%d): %w", errPortInUse, port, err)
		}
		if tail != "" {
			err = fmt.Errorf("%w\ncontainer log (%s):\n%s", err, image, tail)
		}
		return nil, err
	}
	if err != nil {
		return fail(err)
	}
	var dsn, where string
	if port > 0 {
		dsn, where = loopbackDSN(port, password), "host network"
	} else {
		if dsn, err = ctr.ConnectionString(ctx, "sslmode=disable"); err != nil {
			return fail(err)
		}
		where = "default network, mapped port"
	}
	if err := pgserver.WaitReady(ctx, dsn, readyTimeout); err != nil {
		return fail(fmt.Errorf("container started but does not accept connections: %w", err))
	}
	fmt.Fprintf(os.Stderr, "containers: PostgreSQL container %.12s from image %s on the %s\n", ctr.GetContainerID(), image, where)
	return pgserver.NewServer(dsn, pgserver.SourceDocker, terminate), nil
}

// logTail returns the last lines of the container's log, or "" if there is none.
func logTail(ctr *tcpostgres.PostgresContainer) string {
	if ctr == nil || ctr.Container == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := ctr.Logs(ctx)
	if err != nil {
		return ""
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 1<<20))
	if err != nil && len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}
