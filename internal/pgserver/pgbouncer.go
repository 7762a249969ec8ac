package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// StartPgBouncer runs pgbouncer in front of the server of upstreamDSN, listening on a free
// 127.0.0.1 port, with pool_mode poolMode ("session", "transaction" or "statement"). It returns a
// DSN for the same user, password and database through pgbouncer, and stop, which stops pgbouncer
// and removes its files (safe to call more than once). ctx bounds the start only.
//
// Clients authenticate to pgbouncer with SCRAM against an auth_file holding the upstream user and
// password (a made-up one if upstreamDSN has none, for a server that asks none), and pgbouncer logs
// in upstream with the same. Every database of the upstream server is
// reachable, by its name. The database "pgbouncer" is the admin console (simple protocol only).
//
// pgbouncer before 1.21 does not support prepared statements in transaction and statement mode:
// use pgx.QueryExecModeExec or QueryExecModeSimpleProtocol with those.
func StartPgBouncer(ctx context.Context, upstreamDSN string, poolMode string) (dsn string, stop func(), err error) {
	switch poolMode {
	case "session", "transaction", "statement":
	default:
		return "", nil, fmt.Errorf("harness: pgbouncer: pool mode %q is not session, transaction or statement", poolMode)
	}
	bin, err := FindTool("pgbouncer", "pgbouncer")
	if err != nil {
		return "", nil, err
	}
	up, err := pgconn.ParseConfig(upstreamDSN)
	if err != nil {
		// The parse error may quote the DSN, password included: do not wrap it.
		return "", nil, errors.New("harness: pgbouncer: invalid upstream DSN")
	}
	// Clients log in to pgbouncer with SCRAM, which needs a password. An upstream DSN without one
	// names a role that its server lets in without (PGXLANES_TEST_DATABASE may; pgconn has read
	// PGPASSWORD and the passfile into up already): clients get a made-up one, which pgbouncer
	// offers upstream only if asked, and the server does not ask.
	Password(up)
	run, err := currentRunAs()
	if err != nil {
		return "", nil, fmt.Errorf("harness: pgbouncer: %w", err)
	}
	dir, err := makeTempDir(run, "pgbouncer")
	if err != nil {
		return "", nil, fmt.Errorf("harness: pgbouncer: make temporary directory: %w", err)
	}
	var proc *process
	stopOnce := sync.OnceFunc(func() {
		if proc != nil {
			// SIGINT is a safe shutdown: pgbouncer waits for transactions to end, so bound it.
			_ = proc.stop(syscall.SIGINT, 5*time.Second)
		}
		os.RemoveAll(dir)
	})
	defer func() {
		if err != nil {
			stopOnce()
		}
	}()

	authFile := filepath.Join(dir, "userlist.txt")
	if err := writeOwned(run, authFile, fmt.Sprintf("%s %s\n", quoteAuth(up.User), quoteAuth(up.Password))); err != nil {
		return "", nil, fmt.Errorf("harness: pgbouncer: %w", err)
	}

	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return "", nil, fmt.Errorf("harness: pgbouncer: find a free port: %w", err)
		}
		ini := filepath.Join(dir, "pgbouncer.ini")
		if err := writeOwned(run, ini, pgbouncerINI(up, port, poolMode, authFile)); err != nil {
			return "", nil, fmt.Errorf("harness: pgbouncer: %w", err)
		}
		cmd := run.command(syscall.SIGTERM, bin, ini)
		cmd.Dir = dir
		proc, err = startProcess(cmd, filepath.Join(dir, "pgbouncer.log"))
		if err != nil {
			return "", nil, fmt.Errorf("harness: pgbouncer: start %s: %w", bin, err)
		}
		dsn = (&url.URL{
			Scheme:   "postgres",
			User:     url.UserPassword(up.User, up.Password),
			Host:     fmt.Sprintf("127.0.0.1:%d", port),
			Path:     "/" + up.Database,
			RawQuery: "sslmode=disable",
		}).String()
		err = waitReady(ctx, dsn, proc.hasExited, readyTimeout)
		if err == nil {
			return dsn, stopOnce, nil
		}
		tail := proc.logTail()
		_ = proc.stop(syscall.SIGINT, 5*time.Second)
		proc = nil
		if attempt < 3 && strings.Contains(tail, "Address already in use") {
			continue
		}
		return "", nil, fmt.Errorf("harness: pgbouncer did not start: %w\npgbouncer log:\n%s", err, tail)
	}
}

// pgbouncerINI is the configuration of a test pgbouncer. The database "*" forwards every database
// name to the upstream server.
func pgbouncerINI(up *pgconn.Config, port int, poolMode, authFile string) string {
	var b strings.Builder
	b.WriteString("[databases]\n")
	fmt.Fprintf(&b, "* = host=%s port=%d\n", up.Host, up.Port)
	b.WriteString("\n[pgbouncer]\n")
	for _, kv := range [][2]string{
		{"listen_addr", "127.0.0.1"},
		{"listen_port", strconv.Itoa(port)},
		{"unix_socket_dir", ""},
		{"auth_type", "scram-sha-256"},
		{"auth_file", authFile},
		{"admin_users", up.User},
		{"pool_mode", poolMode},
		{"max_client_conn", "1000"},
		{"default_pool_size", "50"},
		{"ignore_startup_parameters", "extra_float_digits"},
		{"server_login_retry", "1"},
	} {
		fmt.Fprintf(&b, "%s = %s\n", kv[0], kv[1])
	}
	return b.String()
}

// quoteAuth quotes s for a pgbouncer auth_file: in double quotes, with double quotes doubled.
func quoteAuth(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// writeOwned writes a private file that the run-as user can read.
func writeOwned(run runAs, path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	return run.chown(path)
}
