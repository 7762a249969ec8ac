package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// DefaultImage is the Docker image used unless PGXLANES_TEST_IMAGE names another.
const DefaultImage = "postgres:17-alpine"

// dockerPingTimeout bounds the check that a Docker engine answers.
const dockerPingTimeout = 2 * time.Second

func dockerImage() string {
	if img := os.Getenv(EnvImage); img != "" {
		return img
	}
	return DefaultImage
}

// dockerReady returns nil if a Docker engine answers a ping within dockerPingTimeout. It looks
// for a sign of an engine first (DOCKER_HOST or a socket file), so that machines without Docker
// pay nothing.
func dockerReady(ctx context.Context) (err error) {
	if os.Getenv(EnvDocker) == "0" {
		return fmt.Errorf("skipped (%s=0)", EnvDocker)
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

// startDocker runs a PostgreSQL container with the test settings and a random password.
// testcontainers' reaper (Ryuk) removes the container if this process dies without Close.
func startDocker(ctx context.Context) (s *Server, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers panicked: %v", r)
		}
	}()
	password := randomHex(16)
	ctr, err := tcpostgres.Run(ctx, dockerImage(),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword(password),
		tcpostgres.WithDatabase("postgres"),
		// The module's command is "postgres -c fsync=off"; add the other settings.
		testcontainers.WithCmdArgs(
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
			"-c", "max_connections=300",
			"-c", "shared_buffers=128MB",
		),
		tcpostgres.BasicWaitStrategies(),
	)
	terminate := func() error {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := testcontainers.TerminateContainer(ctr, testcontainers.StopContext(stopCtx)); err != nil {
			return fmt.Errorf("harness: terminate container: %w", err)
		}
		return nil
	}
	if err != nil {
		_ = terminate() // Run may return a container that started but never became ready
		return nil, err
	}
	dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = terminate()
		return nil, err
	}
	if err := waitReady(ctx, dsn, nil, readyTimeout); err != nil {
		_ = terminate()
		return nil, fmt.Errorf("container started but does not accept connections: %w", err)
	}
	return &Server{dsn: dsn, source: SourceDocker, closeFn: terminate}, nil
}
