package pgserver

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
	"sync"
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

// localServer is a postmaster started from local binaries. Restart, StopPostmaster, Freeze and
// their kin change it (fault.go, freeze.go).
type localServer struct {
	dir  string // temporary directory: data/, the socket, the log
	run  runAs
	bins postgresBins
	opts []string // the postgres arguments from Options
	port int
	dsn  string

	mu     sync.Mutex // serializes lifecycle changes, and guards the fields below
	proc   *process   // the postmaster; nil before the first start and after a stop
	frozen *frozenSet // the frozen processes; nil unless frozen
	ca     *CA        // the CA of the server's certificate; nil without Options.TLS
	closed bool
}

// startLocal runs initdb in a new temporary directory and starts postgres on a free port. On any
// failure it leaves nothing behind.
func startLocal(ctx context.Context, bins postgresBins, o Options) (s *Server, err error) {
	opts, err := o.args()
	if err != nil {
		return nil, err
	}
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
	ls := &localServer{dir: dir, run: run, bins: bins, opts: opts}
	defer func() {
		if err != nil {
			ls.close()
		}
	}()

	password := randomHex(16)
	if err := initdb(ctx, run, bins, dir, password); err != nil {
		return nil, err
	}
	query := "sslmode=disable"
	if o.TLS {
		ca, caFile, args, err := setupTLS(run, dir, o.HostSSLOnly)
		if err != nil {
			return nil, fmt.Errorf("set up TLS: %w", err)
		}
		ls.ca, ls.opts = ca, append(ls.opts, args...)
		query = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {caFile}}.Encode()
	}

	// The port is free only until postgres binds it: retry if another process took it.
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls.port = port
		ls.dsn = (&url.URL{
			Scheme:   "postgres",
			User:     url.UserPassword("postgres", password),
			Host:     fmt.Sprintf("127.0.0.1:%d", port),
			Path:     "/postgres",
			RawQuery: query,
		}).String()
		ls.mu.Lock()
		err = ls.startLocked(ctx, readyPoll)
		ls.mu.Unlock()
		if err == nil {
			s := &Server{dsn: ls.dsn, source: SourceLocal, version: version, local: ls}
			s.closeFn = func() error {
				forget(s)
				return ls.close()
			}
			remember(s)
			return s, nil
		}
		if attempt < 3 && errors.Is(err, errPortTaken) {
			continue
		}
		return nil, err
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

// errPortTaken is the error of startLocked when another process holds the port.
var errPortTaken = errors.New("port taken")

// Poll intervals of startLocked: the first start backs off to readyPoll, a restart polls every
// restartPoll so that the downtime it reports is not inflated by the polling.
const (
	readyPoll   = 200 * time.Millisecond
	restartPoll = 5 * time.Millisecond
)

// startLocked starts the postmaster on ls.port and waits until it accepts connections, polling
// at most every poll. On failure the postmaster is stopped and the error carries the end of its
// log. Caller must hold mu.
func (ls *localServer) startLocked(ctx context.Context, poll time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// postgres as a child of this process, so that it dies with it: SIGQUIT makes the postmaster
	// stop at once and take its backends with it.
	args := append([]string{
		"-D", filepath.Join(ls.dir, "data"),
		"-p", strconv.Itoa(ls.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + ls.dir,
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=128MB",
		"-c", "logging_collector=off",
		"-c", "log_min_messages=warning",
	}, ls.opts...)
	cmd := ls.run.command(syscall.SIGQUIT, ls.bins.postgres, args...)
	cmd.Dir = ls.dir
	logPath := filepath.Join(ls.dir, "postgres.log")
	logStart := fileSize(logPath)
	p, err := startProcess(cmd, logPath)
	if err != nil {
		return fmt.Errorf("start %s: %w", ls.bins.postgres, err)
	}
	err = waitReadyEvery(ctx, ls.dsn, p.hasExited, readyTimeout, poll)
	if err == nil {
		ls.proc = p
		return nil
	}
	tail := fileTailFrom(logPath, logStart, 20)
	_ = p.stop(syscall.SIGQUIT, 10*time.Second)
	if strings.Contains(tail, "Address already in use") {
		return fmt.Errorf("postgres did not start: %w: %w\npostgres log (%s):\n%s", errPortTaken, err, ls.bins.postgres, tail)
	}
	return fmt.Errorf("postgres did not start: %w\npostgres log (%s):\n%s", err, ls.bins.postgres, tail)
}

// close thaws and stops the postmaster and removes the temporary directory.
func (ls *localServer) close() error {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return nil
	}
	ls.closed = true
	var errs []error
	if err := ls.thawLocked(); err != nil {
		errs = append(errs, err)
	}
	if ls.proc != nil {
		// SIGQUIT is an immediate shutdown: no checkpoint, which is right for data thrown away.
		if err := ls.proc.stop(syscall.SIGQUIT, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
		ls.proc = nil
	}
	if err := os.RemoveAll(ls.dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("harness: close local server: %w", err)
	}
	return nil
}

// openServers holds the local servers not yet closed, for Main.
var openServers struct {
	mu      sync.Mutex
	servers map[*Server]struct{}
}

func remember(s *Server) {
	openServers.mu.Lock()
	defer openServers.mu.Unlock()
	if openServers.servers == nil {
		openServers.servers = make(map[*Server]struct{})
	}
	openServers.servers[s] = struct{}{}
}

func forget(s *Server) {
	openServers.mu.Lock()
	defer openServers.mu.Unlock()
	delete(openServers.servers, s)
}

// openLocal returns the local servers not yet closed.
func openLocal() []*Server {
	openServers.mu.Lock()
	defer openServers.mu.Unlock()
	servers := make([]*Server, 0, len(openServers.servers))
	for s := range openServers.servers {
		servers = append(servers, s)
	}
	return servers
}
