// Command entrypoint is the entrypoint of the PostgreSQL image that .ci/containers/build-image.sh
// makes with docker import from the machine's own PostgreSQL binaries, for machines that reach no
// image registry. It is a static binary, so the image needs no shell script; initdb still needs
// /bin/sh, which it runs through popen.
//
// It does what the official postgres image's docker-entrypoint.sh does for the testcontainers
// Postgres module:
//
//   - On first start (no $PGDATA/PG_VERSION) it runs initdb with POSTGRES_USER (default postgres) and
//     POSTGRES_PASSWORD (required unless POSTGRES_HOST_AUTH_METHOD=trust) and POSTGRES_INITDB_ARGS,
//     lets every address in with POSTGRES_HOST_AUTH_METHOD (default scram-sha-256) and listens on
//     every address, as the official image does.
//   - It starts a temporary server on a Unix socket only, creates POSTGRES_DB (default: the user's
//     name) and runs the *.sql files of /docker-entrypoint-initdb.d in name order, then stops it.
//     Like the official image, this logs "database system is ready to accept connections" once
//     before the real start logs it again: the module waits for both.
//   - It then replaces itself with postgres and the container's arguments (such as
//     "postgres -c fsync=off"). Arguments that start with "-" are postgres options; any other
//     command runs as given.
//
// The image runs it as the user postgres, never as root.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// initTimeout bounds the temporary server's start and the init SQL.
const initTimeout = 2 * time.Minute

// initDir holds the init scripts, as in the official image.
const initDir = "/docker-entrypoint-initdb.d"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	args = normalizeArgs(args)
	if args[0] != "postgres" {
		return execCommand(args)
	}
	if os.Geteuid() == 0 {
		return errors.New("running as root: run the image as the user postgres (its USER)")
	}
	cfg, err := configFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(cfg.dataDir, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := initialize(cfg, args[1:]); err != nil {
			return err
		}
	} else if err != nil {
		return err
	} else {
		fmt.Println("entrypoint: PostgreSQL data directory appears to contain a database; skipping initialization")
	}
	return execCommand(args)
}

// normalizeArgs makes the container's arguments a command line: none means "postgres", and
// options alone are options of postgres.
func normalizeArgs(args []string) []string {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return append([]string{"postgres"}, args...)
	}
	return args
}

// config is what the environment asks for.
type config struct {
	user       string
	password   string // empty only with authMethod trust
	database   string
	authMethod string
	initdbArgs []string
	dataDir    string
}

func configFromEnv(getenv func(string) string) (config, error) {
	c := config{
		user:       getenv("POSTGRES_USER"),
		password:   getenv("POSTGRES_PASSWORD"),
		database:   getenv("POSTGRES_DB"),
		authMethod: getenv("POSTGRES_HOST_AUTH_METHOD"),
		initdbArgs: strings.Fields(getenv("POSTGRES_INITDB_ARGS")),
		dataDir:    getenv("PGDATA"),
	}
	if c.user == "" {
		c.user = "postgres"
	}
	if c.database == "" {
		c.database = c.user
	}
	if c.authMethod == "" {
		c.authMethod = "scram-sha-256"
	}
	if c.dataDir == "" {
		c.dataDir = "/var/lib/postgresql/data"
	}
	if c.password == "" && c.authMethod != "trust" {
		return config{}, errors.New("POSTGRES_PASSWORD is empty: set it to the superuser's password " +
			"(or POSTGRES_HOST_AUTH_METHOD=trust to let every connection in without one)")
	}
	return c, nil
}

// initdbArgs is the initdb command line. The data is thrown away with the container: no sync.
func (c config) initdbCommand(pwfile string) []string {
	args := []string{"initdb", "-D", c.dataDir, "--username=" + c.user,
		"--encoding=UTF8", "--locale=C", "--no-sync", "--auth-local=trust"}
	if pwfile != "" {
		args = append(args, "--pwfile="+pwfile, "--auth-host="+c.authMethod)
	} else {
		args = append(args, "--auth-host=trust")
	}
	return append(args, c.initdbArgs...)
}

// initialize runs initdb, opens the server to every address, and runs the init SQL on a
// temporary server.
func initialize(c config, postgresArgs []string) error {
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "entrypoint-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	pwfile := ""
	if c.password != "" {
		pwfile = filepath.Join(tmp, "pwfile")
		if err := os.WriteFile(pwfile, []byte(c.password+"\n"), 0o600); err != nil {
			return err
		}
	}
	if err := runCommand(c.initdbCommand(pwfile)); err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	if err := appendFile(filepath.Join(c.dataDir, "pg_hba.conf"), "\nhost all all all "+c.authMethod+"\n"); err != nil {
		return err
	}
	if err := appendFile(filepath.Join(c.dataDir, "postgresql.conf"), "\nlisten_addresses = '*'\n"); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), initTimeout)
	defer cancel()
	return withTempServer(ctx, c.dataDir, tmp, c.user, postgresArgs, func(connect func(db string) (*pgconn.PgConn, error)) error {
		return setup(ctx, c, connect)
	})
}

// withTempServer runs postgres on dataDir with the container's options on a Unix socket in dir
// only, waits until user can connect, calls fn, and stops the server with a fast shutdown.
func withTempServer(ctx context.Context, dataDir, dir, user string, postgresArgs []string, fn func(connect func(db string) (*pgconn.PgConn, error)) error) error {
	postgres, err := exec.LookPath("postgres")
	if err != nil {
		return err
	}
	args := append(append([]string{}, postgresArgs...),
		"-c", "listen_addresses=", "-c", "unix_socket_directories="+dir, "-c", "port=5432")
	cmd := exec.Command(postgres, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the temporary server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	connect := func(db string) (*pgconn.PgConn, error) {
		cfg, err := pgconn.ParseConfig("sslmode=disable")
		if err != nil {
			return nil, err
		}
		cfg.Host, cfg.Port, cfg.User, cfg.Database = dir, 5432, user, db
		return pgconn.ConnectConfig(ctx, cfg)
	}
	err = func() error {
		var err error = errors.New("not ready")
		for {
			// As pg_ctl -w does: connect once the postmaster says it is ready.
			if postmasterReady(dataDir) {
				var conn *pgconn.PgConn
				if conn, err = connect("postgres"); err == nil {
					return conn.Close(ctx)
				}
			}
			select {
			case exitErr := <-exited:
				exited <- exitErr
				return fmt.Errorf("the temporary server exited: %v", exitErr)
			case <-ctx.Done():
				return fmt.Errorf("the temporary server does not accept connections: %w", err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	if err == nil {
		err = fn(connect)
	}
	// A fast shutdown, as pg_ctl -m fast does; a signal to a server that has exited fails.
	if sigErr := cmd.Process.Signal(syscall.SIGINT); sigErr == nil {
		if waitErr := <-exited; waitErr != nil && err == nil {
			err = fmt.Errorf("stop the temporary server: %w", waitErr)
		}
	}
	return err
}

// postmasterReady reports whether the postmaster.pid of dataDir says the server accepts
// connections: its eighth line is the postmaster's status.
func postmasterReady(dataDir string) bool {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	return len(lines) >= 8 && strings.TrimSpace(lines[7]) == "ready"
}

// setup creates the database and runs the init scripts.
func setup(ctx context.Context, c config, connect func(db string) (*pgconn.PgConn, error)) error {
	conn, err := connect("postgres")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if c.database != "postgres" {
		tag, err := conn.ExecParams(ctx, "select 1 from pg_database where datname = $1",
			[][]byte{[]byte(c.database)}, nil, nil, nil).Close()
		if err != nil {
			return fmt.Errorf("look for database %s: %w", c.database, err)
		}
		if tag.RowsAffected() == 0 {
			if _, err := conn.Exec(ctx, "create database "+quoteIdent(c.database)).ReadAll(); err != nil {
				return fmt.Errorf("create database %s: %w", c.database, err)
			}
		}
	}
	scripts, err := initScripts(initDir)
	if err != nil {
		return err
	}
	if len(scripts) == 0 {
		return nil
	}
	dbConn, err := connect(c.database)
	if err != nil {
		return err
	}
	defer dbConn.Close(context.WithoutCancel(ctx))
	for _, path := range scripts {
		sql, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fmt.Printf("entrypoint: running %s\n", path)
		if _, err := dbConn.Exec(ctx, string(sql)).ReadAll(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

// initScripts lists the init scripts in dir in name order. The image has no shell tools to run
// the official image's *.sh scripts: any file but *.sql is an error, not skipped silently.
func initScripts(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var scripts []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("%s: this image runs only *.sql init scripts", path)
		}
		scripts = append(scripts, path)
	}
	sort.Strings(scripts)
	return scripts, nil
}

// quoteIdent quotes name as an SQL identifier.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// runCommand runs args with the container's output.
func runCommand(args []string) error {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// execCommand replaces this process with args, found on PATH.
func execCommand(args []string) error {
	path, err := exec.LookPath(args[0])
	if err != nil {
		return err
	}
	return syscall.Exec(path, args, os.Environ())
}
