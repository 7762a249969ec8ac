package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Environment variables read by Start.
const (
	// EnvDatabase names a server to use as is, as a DSN (URL or keyword/value form).
	EnvDatabase = "PGXLANES_TEST_DATABASE"
	// EnvDocker set to "0" skips the Docker step; set to "1" it forces it: Start fails rather than
	// fall back to the local binaries.
	EnvDocker = "PGXLANES_TEST_DOCKER"
	// EnvImage chooses the Docker image of the Docker step.
	EnvImage = "PGXLANES_TEST_IMAGE"
)

// Sources reported by Server.Source.
const (
	SourceEnv    = "env"
	SourceDocker = "docker"
	SourceLocal  = "local"
)

// Docker is the Docker step of Start. The package github.com/pgxlanes/pgxlanes/pgxlanestest/containers
// registers one, so that programs that do not import it do not link testcontainers and moby.
type Docker interface {
	// Hinted reports whether something points at a Docker engine (DOCKER_HOST, a socket file).
	Hinted() bool
	// Ready returns nil if an engine answers.
	Ready(ctx context.Context) error
	// Start runs a PostgreSQL container and returns it as a Server.
	Start(ctx context.Context) (*Server, error)
}

var docker struct {
	mu sync.Mutex
	d  Docker
}

// RegisterDocker makes d the Docker step of Start.
func RegisterDocker(d Docker) {
	docker.mu.Lock()
	docker.d = d
	docker.mu.Unlock()
}

func dockerStep() Docker {
	docker.mu.Lock()
	defer docker.mu.Unlock()
	return docker.d
}

// NewServer returns a Server for dsn, started by a Docker step: source names it, and closeFn,
// which may be nil, stops it.
func NewServer(dsn, source string, closeFn func() error) *Server {
	return &Server{dsn: dsn, source: source, closeFn: closeFn}
}

// WaitReady polls until a connection to dsn answers a query or timeout passes.
func WaitReady(ctx context.Context, dsn string, timeout time.Duration) error {
	return waitReady(ctx, dsn, nil, timeout)
}

// RandomHex returns n random bytes in hex, for passwords and names.
func RandomHex(n int) string { return randomHex(n) }

// readyTimeout bounds the wait for a started server to accept connections.
const readyTimeout = 30 * time.Second

// Server is a PostgreSQL server for tests. It is safe for concurrent use.
type Server struct {
	dsn     string
	source  string
	version string // e.g. "15.18", "" if unknown

	local *localServer // nil unless started from local binaries

	closeFn   func() error // nil when Close has nothing to do
	closeOnce sync.Once
	closeErr  error

	dbSeq atomic.Int64 // for unique database names
}

// Start finds or starts a PostgreSQL server, in the order given in the package documentation.
// ctx bounds the search and the start; it does not bound the life of the server, which runs until
// Close. Start logs to stderr which source it used.
func Start(ctx context.Context) (*Server, error) {
	if dsn := os.Getenv(EnvDatabase); dsn != "" {
		if _, err := pgconn.ParseConfig(dsn); err != nil {
			// The parse error may quote the DSN, password included: do not wrap it.
			return nil, fmt.Errorf("harness: %s is not a valid DSN", EnvDatabase)
		}
		logf("using %s (%s)", EnvDatabase, redact(dsn))
		return &Server{dsn: dsn, source: SourceEnv}, nil
	}

	var tried []string

	switch d := dockerStep(); {
	case d == nil:
		tried = append(tried, "docker: not linked in (import github.com/pgxlanes/pgxlanes/pgxlanestest/containers)")
	case os.Getenv(EnvDocker) == "0":
		tried = append(tried, "docker: skipped ("+EnvDocker+"=0)")
	default:
		if err := d.Ready(ctx); err != nil {
			tried = append(tried, "docker: "+err.Error())
			if d.Hinted() {
				logf("Docker is not usable, trying local binaries: %v", err)
			}
			break
		}
		start := time.Now()
		s, err := d.Start(ctx)
		if err == nil {
			logf("using Docker at %s (started in %s)", redact(s.dsn), since(start))
			return s, nil
		}
		tried = append(tried, "docker: "+err.Error())
		logf("Docker failed, trying local binaries: %v", err)
	}
	if os.Getenv(EnvDocker) == "1" {
		return nil, fmt.Errorf("harness: %s=1 forces the Docker step, which failed:\n  %s", EnvDocker, strings.Join(tried, "\n  "))
	}

	bins, err := findPostgres()
	if err != nil {
		tried = append(tried, "local: "+err.Error())
		return nil, noServerError(tried)
	}
	start := time.Now()
	s, err := startLocal(ctx, bins, Options{})
	if err != nil {
		// PostgreSQL is installed: installing it is not the advice to give.
		return nil, fmt.Errorf("harness: local PostgreSQL (%s) did not start (%s): %w",
			bins.dir, strings.Join(tried, "; "), err)
	}
	logf("using local PostgreSQL %s (%s) at %s (started in %s)", s.version, bins.dir, redact(s.dsn), since(start))
	return s, nil
}

// StartLocal starts a new PostgreSQL server from the local binaries (as Start's third step does),
// with the options o, whatever PGXLANES_TEST_DATABASE and Docker offer: each call starts a server
// of its own, which runs until Close. Only such servers can be restarted, stopped and frozen. ctx
// bounds the start.
func StartLocal(ctx context.Context, o Options) (*Server, error) {
	if _, err := o.args(); err != nil {
		return nil, err
	}
	bins, err := findPostgres()
	if err != nil {
		return nil, fmt.Errorf("harness: StartLocal needs the PostgreSQL server binaries: %w; install them "+
			"(Debian/Ubuntu: apt-get install -y postgresql; the harness starts its own server and does not need the "+
			"system service)", err)
	}
	start := time.Now()
	s, err := startLocal(ctx, bins, o)
	if err != nil {
		return nil, fmt.Errorf("harness: local PostgreSQL (%s) did not start: %w", bins.dir, err)
	}
	logf("started local PostgreSQL %s at %s, data %s (in %s)", s.version, redact(s.dsn), s.DataDir(), since(start))
	return s, nil
}

func noServerError(tried []string) error {
	return fmt.Errorf("harness: no PostgreSQL server for the tests.\n"+
		"Install PostgreSQL (Debian/Ubuntu: apt-get install -y postgresql; the harness starts its own server "+
		"and does not need the system service), or set %s=postgres://user:password@host:port/db, "+
		"or start a Docker engine.\nTried:\n  %s", EnvDatabase, strings.Join(tried, "\n  "))
}

// DSN returns the server's connection string, with user and password, for the database postgres
// (or the database named in PGXLANES_TEST_DATABASE).
func (s *Server) DSN() string { return s.dsn }

// Source tells where the server comes from: "env", "docker" or "local".
func (s *Server) Source() string { return s.source }

// Version is the server's version as reported by the postgres binary, such as "15.18". It is
// empty for servers the harness did not start from local binaries.
func (s *Server) Version() string { return s.version }

// Close stops the server and removes its files. It does nothing for a server from
// PGXLANES_TEST_DATABASE. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.closeFn != nil {
			s.closeErr = s.closeFn()
		}
	})
	return s.closeErr
}

// DatabasePrefix is how the names of the databases CreateDatabase makes in this process begin
// (pgxlanes_<pid>_): on a server other processes' tests share, a test counts its own by it.
func DatabasePrefix() string { return fmt.Sprintf("pgxlanes_%d_", os.Getpid()) }

// CreateDatabase creates a database with a unique name and returns its DSN. Tests use one database
// each, so that per-database statistics such as pg_stat_database.sessions belong to one test. The
// caller drops the database when done (NewDatabase does it in a cleanup).
func (s *Server) CreateDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("%s%d_%s", DatabasePrefix(), s.dbSeq.Add(1), randomHex(4))
	if err := s.exec(ctx, "create database "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("harness: create database %s: %w", name, err)
	}
	dsn, err := withDatabase(s.dsn, name)
	if err != nil {
		return "", err
	}
	return dsn, nil
}

// DropDatabase drops the database named in dsn, closing its sessions first (WITH (FORCE)). It
// refuses to drop the server's own database.
func (s *Server) DropDatabase(ctx context.Context, dsn string) error {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return errors.New("harness: drop database: invalid DSN")
	}
	own, err := pgconn.ParseConfig(s.dsn)
	if err != nil {
		return errors.New("harness: drop database: invalid server DSN")
	}
	if cfg.Database == own.Database {
		return fmt.Errorf("harness: drop database: refusing to drop the server's own database %s", cfg.Database)
	}
	if err := s.exec(ctx, "drop database if exists "+pgx.Identifier{cfg.Database}.Sanitize()+" with (force)"); err != nil {
		return fmt.Errorf("harness: drop database %s: %w", cfg.Database, err)
	}
	return nil
}

// exec runs one statement on a fresh connection to the server's own database.
func (s *Server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// withDatabase returns dsn with its database replaced by name. It keeps the form of dsn: URL or
// keyword/value.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", errors.New("harness: server DSN is not a valid URL")
		}
		u.Path = "/" + name
		u.RawPath = ""
		q := u.Query()
		if q.Has("dbname") {
			q.Set("dbname", name)
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return dsn + " dbname='" + name + "'", nil
}

// waitReady polls until a connection to dsn answers a query, the process behind it exits (exited,
// if not nil, reports true), or the timeout passes. It returns the last connection error on
// failure.
func waitReady(ctx context.Context, dsn string, exited func() bool, timeout time.Duration) error {
	return waitReadyEvery(ctx, dsn, exited, timeout, readyPoll)
}

// waitReadyEvery is waitReady with the poll interval backing off from 10 ms (or maxDelay if
// shorter) to maxDelay.
func waitReadyEvery(ctx context.Context, dsn string, exited func() bool, timeout, maxDelay time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return errors.New("invalid DSN")
	}
	cfg.ConnectTimeout = 2 * time.Second
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // works through any pgbouncer mode

	var last error
	for delay := min(10*time.Millisecond, maxDelay); ; delay = min(delay*2, maxDelay) {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_, err = conn.Exec(ctx, "select 1")
			conn.Close(context.WithoutCancel(ctx))
			if err == nil {
				return nil
			}
		}
		last = err
		if exited != nil && exited() {
			return errors.New("process exited")
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("not ready after %s: %w", timeout, last)
		case <-t.C:
		}
	}
}

// redact returns dsn without its password, for logs and errors.
func redact(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "(invalid DSN)"
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "harness: "+format+"\n", args...)
}

func since(t time.Time) time.Duration {
	return time.Since(t).Round(time.Millisecond)
}
