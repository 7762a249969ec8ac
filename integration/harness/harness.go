package harness

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
	// EnvDocker set to "0" skips the Docker step.
	EnvDocker = "PGXLANES_TEST_DOCKER"
	// EnvImage chooses the Docker image; the default is DefaultImage.
	EnvImage = "PGXLANES_TEST_IMAGE"
)

// Sources reported by Server.Source.
const (
	SourceEnv    = "env"
	SourceDocker = "docker"
	SourceLocal  = "local"
)

// readyTimeout bounds the wait for a started server to accept connections.
const readyTimeout = 30 * time.Second

// Server is a PostgreSQL server for tests. It is safe for concurrent use.
type Server struct {
	dsn     string
	source  string
	version string // e.g. "15.18", "" if unknown

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

	if err := dockerReady(ctx); err != nil {
		tried = append(tried, "docker: "+err.Error())
		if dockerHinted() && os.Getenv(EnvDocker) != "0" {
			logf("Docker is not usable, trying local binaries: %v", err)
		}
	} else {
		start := time.Now()
		s, err := startDocker(ctx)
		if err == nil {
			logf("using Docker image %s at %s (started in %s)", dockerImage(), redact(s.dsn), since(start))
			return s, nil
		}
		tried = append(tried, "docker: "+err.Error())
		logf("Docker failed, trying local binaries: %v", err)
	}

	bins, err := findPostgres()
	if err != nil {
		tried = append(tried, "local: "+err.Error())
		return nil, noServerError(tried)
	}
	start := time.Now()
	s, err := startLocal(ctx, bins)
	if err != nil {
		// PostgreSQL is installed: installing it is not the advice to give.
		return nil, fmt.Errorf("harness: local PostgreSQL (%s) did not start (%s): %w",
			bins.dir, strings.Join(tried, "; "), err)
	}
	logf("using local PostgreSQL %s (%s) at %s (started in %s)", s.version, bins.dir, redact(s.dsn), since(start))
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

// CreateDatabase creates a database with a unique name and returns its DSN. Tests use one database
// each, so that per-database statistics such as pg_stat_database.sessions belong to one test. The
// caller drops the database when done (NewDatabase does it in a cleanup).
func (s *Server) CreateDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("pgxlanes_%d_%d_%s", os.Getpid(), s.dbSeq.Add(1), randomHex(4))
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
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return errors.New("invalid DSN")
	}
	cfg.ConnectTimeout = 2 * time.Second
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // works through any pgbouncer mode

	var last error
	for delay := 10 * time.Millisecond; ; delay = min(delay*2, 200*time.Millisecond) {
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
