package pgserver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tempPrefix starts the name of every directory the harness makes; the owning process id follows,
// so that a later run can remove what a killed run left behind.
const tempPrefix = "pgxlanes-harness-"

// runAs says which user the server binaries run as. As root it is the user postgres, because
// initdb, postgres and pgbouncer refuse to run as root; otherwise the current user (cred is nil).
type runAs struct {
	cred     *syscall.Credential
	uid, gid int
}

func currentRunAs() (runAs, error) {
	if os.Geteuid() != 0 {
		return runAs{}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return runAs{}, errors.New("running as root, and there is no user postgres to run the server as " +
			"(apt-get install -y postgresql creates it, or: useradd --system postgres)")
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return runAs{}, fmt.Errorf("user postgres has a non-numeric uid %q or gid %q", u.Uid, u.Gid)
	}
	return runAs{
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		uid:  uid,
		gid:  gid,
	}, nil
}

// chown gives path to the run-as user. It does nothing when not root.
func (r runAs) chown(path string) error {
	if r.cred == nil {
		return nil
	}
	return os.Chown(path, r.uid, r.gid)
}

// command makes a command for a server binary: run as r, with PG* variables removed from the
// environment so that they cannot change the server's settings, and signalled with deathSig when
// this process dies.
func (r runAs) command(deathSig syscall.Signal, path string, args ...string) *exec.Cmd {
	cmd := exec.Command(path, args...)
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "LC_ALL=C")
	cmd.SysProcAttr = sysProcAttr(r.cred, deathSig)
	return cmd
}

// makeTempDir makes a directory for one server, owned by the run-as user. Its name carries the
// process id so that removeStale can find it after a crash.
func makeTempDir(r runAs, kind string) (string, error) {
	removeStale()
	dir, err := os.MkdirTemp(tempBase(r), fmt.Sprintf("%s%d-%s-", tempPrefix, os.Getpid(), kind))
	if err != nil {
		return "", err
	}
	if err := r.chown(dir); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// tempBase is os.TempDir, or /tmp if that is too long for a Unix socket path (about 100 bytes)
// or, as root, not reachable by the user postgres.
func tempBase(r runAs) string {
	base := os.TempDir()
	if len(base) > 60 {
		return "/tmp"
	}
	if r.cred != nil {
		for d := base; d != "/" && d != "."; d = filepath.Dir(d) {
			fi, err := os.Stat(d)
			if err != nil || fi.Mode().Perm()&0o001 == 0 {
				return "/tmp"
			}
		}
	}
	return base
}

// removeStale removes directories left by harness processes that no longer exist, such as a test
// binary killed by a timeout. On Linux their servers died with them (Pdeathsig); only files remain.
// Elsewhere a server may live on: a directory whose postmaster lives is kept (a PgBouncer's, which
// has no postmaster.pid, is not).
func removeStale() {
	for _, base := range []string{os.TempDir(), "/tmp"} {
		matches, _ := filepath.Glob(filepath.Join(base, tempPrefix+"*"))
		for _, dir := range matches {
			rest := strings.TrimPrefix(filepath.Base(dir), tempPrefix)
			pidText, _, _ := strings.Cut(rest, "-")
			pid, err := strconv.Atoi(pidText)
			if err != nil || pid == os.Getpid() || alive(pid) {
				continue
			}
			if pm := postmasterPID(dir); pm > 0 && alive(pm) {
				continue
			}
			os.RemoveAll(dir)
		}
	}
}

// alive reports whether a process with this id exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: trust kill
	}
	// The state follows the command name, which is in parentheses and may contain spaces.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// postmasterPID reads the postmaster's process id from the data directory under dir, or 0.
func postmasterPID(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another process may take it
// before the server binds it; callers retry on "Address already in use".
// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago; whoever binds it should
// retry if another process took it meanwhile.
func FreePort() (int, error) { return freePort() }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// process is a started server process whose output goes to a log file. It has no goroutine of
// its own (tests check for leaked goroutines with goleak): exit is found by polling wait4 with
// WNOHANG.
type process struct {
	cmd     *exec.Cmd
	logPath string

	mu     sync.Mutex
	exited bool // the process has been reaped; guarded by mu
}

// startProcess starts cmd with its output appended to logPath.
func startProcess(cmd *exec.Cmd, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own copy
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &process{cmd: cmd, logPath: logPath}, nil
}

// hasExited reports whether the process has exited, reaping it if so. It does not block.
func (p *process) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return true
	}
	pid := p.cmd.Process.Pid
	var ws syscall.WaitStatus
	got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	if errors.Is(err, syscall.EINTR) {
		return false
	}
	if got == pid || err != nil { // err is ECHILD: nothing left to wait for
		p.exited = true
		_ = p.cmd.Process.Release()
	}
	return p.exited
}

// waitExit polls until the process has exited or d has passed, and reports whether it exited.
func (p *process) waitExit(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		if p.hasExited() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(delay)
	}
}

// stop sends sig, waits up to grace for the process to exit, then kills it.
func (p *process) stop(sig syscall.Signal, grace time.Duration) error {
	if p.hasExited() {
		return nil
	}
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(pid, sig) // the pid stays ours until we reap it
	if p.waitExit(grace) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	if !p.waitExit(10 * time.Second) {
		return fmt.Errorf("%s (pid %d) survived SIGKILL", filepath.Base(p.cmd.Path), pid)
	}
	return fmt.Errorf("%s did not stop within %s after %s; killed", filepath.Base(p.cmd.Path), grace, sig)
}

// logTail returns the last lines of the process's log, for error messages.
func (p *process) logTail() string {
	return fileTail(p.logPath, 20)
}

func fileTail(path string, lines int) string {
	return fileTailFrom(path, 0, lines)
}

// fileTailFrom is fileTail of the part of the file after offset.
func fileTailFrom(path string, offset int64, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if offset > 0 && offset <= int64(len(b)) {
		b = b[offset:]
	}
	parts := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return string(bytes.Join(parts, []byte("\n")))
}

// fileSize is the size of the file at path, 0 if it does not exist.
func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// findBinary looks for name on PATH, then in the directories extra.
func findBinary(name string, extra ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range extra {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or in %s", name, strings.Join(extra, ", "))
}
