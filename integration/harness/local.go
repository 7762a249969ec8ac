package harness

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// debianPostgresGlob is where Debian and Ubuntu install the server binaries, one directory per
// major version; they are not on PATH.
const debianPostgresGlob = "/usr/lib/postgresql/*/bin"

// postgresBins names the initdb and postgres binaries of one installation.
type postgresBins struct {
	dir      string // for logs
	initdb   string
	postgres string
}

// findPostgres finds initdb and postgres: first on PATH (both from one installation when PATH
// holds symbolic links), then under /usr/lib/postgresql/*/bin, highest major version first.
func findPostgres() (postgresBins, error) {
	if initdb, err := exec.LookPath("initdb"); err == nil {
		// Prefer the postgres next to the real initdb, so that the versions match.
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			if b, ok := binsIn(filepath.Dir(real)); ok {
				return b, nil
			}
		}
		if pg, err := exec.LookPath("postgres"); err == nil {
			return postgresBins{dir: filepath.Dir(initdb), initdb: initdb, postgres: pg}, nil
		}
	}

	dirs, _ := filepath.Glob(debianPostgresGlob)
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		if b, ok := binsIn(dir); ok {
			return b, nil
		}
	}
	return postgresBins{}, fmt.Errorf("initdb and postgres not found on PATH or in %s", debianPostgresGlob)
}

func binsIn(dir string) (postgresBins, bool) {
	b := postgresBins{dir: dir, initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
	for _, p := range []string{b.initdb, b.postgres} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o111 == 0 {
			return postgresBins{}, false
		}
	}
	return b, true
}

// versionOf turns /usr/lib/postgresql/15/bin into 15 (and 9.6 into 9.6) for sorting.
func versionOf(dir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64)
	return v
}

var versionRE = regexp.MustCompile(`\(PostgreSQL\) ([0-9][0-9.a-z]*)`)

// localServer is a postmaster started from local binaries.
type localServer struct {
	dir  string // temporary directory: data/, the socket, the log
	proc *process
}

// startLocal runs initdb in a new temporary directory and starts postgres on a free port. On any
// failure it leaves nothing behind.
func startLocal(ctx context.Context, bins postgresBins) (s *Server, err error) {
	run, err := currentRunAs()
	if err != nil {
		return nil, err
	}
	version := ""
	if out, err := exec.CommandContext(ctx, bins.postgres, "--version").Output(); err == nil {
		if m := versionRE.FindSubmatch(out); m != nil {
			version = string(m[1])
		}
	}

	dir, err := makeTempDir(run, "local")
	if err != nil {
		return nil, fmt.Errorf("make temporary directory: %w", err)
	}
	ls := &localServer{dir: dir}
	defer func() {
		if err != nil {
			ls.close()
		}
	}()

	password := randomHex(16)
	if err := initdb(ctx, run, bins, dir, password); err != nil {
		return nil, err
	}

	// The port is free only until postgres binds it: retry if another process took it.
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		if err := ls.startPostmaster(ctx, run, bins, port); err != nil {
			return nil, err
		}
		dsn := (&url.URL{
			Scheme:   "postgres",
			User:     url.UserPassword("postgres", password),
			Host:     fmt.Sprintf("127.0.0.1:%d", port),
			Path:     "/postgres",
			RawQuery: "sslmode=disable",
		}).String()
		err = waitReady(ctx, dsn, ls.proc.hasExited, readyTimeout)
		if err == nil {
			return &Server{dsn: dsn, source: SourceLocal, version: version, closeFn: ls.close}, nil
		}
		tail := ls.proc.logTail()
		_ = ls.proc.stop(syscall.SIGQUIT, 10*time.Second)
		if attempt < 3 && strings.Contains(tail, "Address already in use") {
			continue
		}
		return nil, fmt.Errorf("postgres did not start: %w\npostgres log (%s):\n%s", err, bins.postgres, tail)
	}
}

// initdb makes the data directory dir/data with the superuser postgres and the given password.
func initdb(ctx context.Context, run runAs, bins postgresBins, dir, password string) error {
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pwfile)
	if err := run.chown(pwfile); err != nil {
		return err
	}
	cmd := run.command(syscall.SIGKILL, bins.initdb,
		"-D", filepath.Join(dir, "data"),
		"-U", "postgres",
		"--auth-local=trust",
		"--auth-host=scram-sha-256",
		"--pwfile="+pwfile,
		"--encoding=UTF8",
		"--locale=C",
		"--no-sync", // the data is thrown away
	)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("initdb failed: %w\n%s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startPostmaster starts postgres as a child of this process, so that it dies with it (SIGQUIT
// makes the postmaster stop at once and take its backends with it).
func (ls *localServer) startPostmaster(ctx context.Context, run runAs, bins postgresBins, port int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cmd := run.command(syscall.SIGQUIT, bins.postgres,
		"-D", filepath.Join(ls.dir, "data"),
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+ls.dir,
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=300",
		"-c", "shared_buffers=128MB",
		"-c", "logging_collector=off",
		"-c", "log_min_messages=warning",
	)
	cmd.Dir = ls.dir
	p, err := startProcess(cmd, filepath.Join(ls.dir, "postgres.log"))
	if err != nil {
		return fmt.Errorf("start %s: %w", bins.postgres, err)
	}
	ls.proc = p
	return nil
}

// close stops the postmaster and removes the temporary directory.
func (ls *localServer) close() error {
	var errs []error
	if ls.proc != nil {
		// SIGQUIT is an immediate shutdown: no checkpoint, which is right for data thrown away.
		if err := ls.proc.stop(syscall.SIGQUIT, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(ls.dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("harness: close local server: %w", err)
	}
	return nil
}
