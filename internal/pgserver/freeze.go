package pgserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// stoppedTimeout bounds the wait for a process to reach the stopped state after SIGSTOP.
const stoppedTimeout = 5 * time.Second

// Freeze stops the postmaster and every process it started (backends, checkpointer, walwriter,
// autovacuum, ...) with SIGSTOP, and returns once all of them are stopped. The server's sockets
// stay open: new connections complete their TCP handshake and then hang, and queries on open
// sessions hang, as against a server that stalls. Freezing a frozen server does nothing.
//
// Thaw, Close, StopPostmaster and Restart end the freeze, and so does the death of the test
// process: a guard process (sh, in its own session) holds the frozen ids and sends them SIGCONT
// when the test process exits for any reason, so that a killed or timed-out test leaves no
// stopped server behind.
func (s *Server) Freeze() error {
	if runtime.GOOS != "linux" {
		// It finds the postmaster's children and waits for them to stop through /proc.
		return fmt.Errorf("harness: freeze: needs Linux's /proc, not %s", runtime.GOOS)
	}
	ls, err := s.localFor("freeze")
	if err != nil {
		return err
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch {
	case ls.closed:
		return errors.New("harness: freeze: the server is closed")
	case ls.proc == nil:
		return errors.New("harness: freeze: the server is stopped")
	case ls.frozen != nil:
		return nil
	}
	if err := ls.freezeLocked(); err != nil {
		return fmt.Errorf("harness: freeze: %w", err)
	}
	return nil
}

// Thaw resumes a frozen server with SIGCONT: its processes first, then the postmaster. It is
// safe to call more than once, and on a server that is not frozen (it does nothing then).
func (s *Server) Thaw() error {
	if s.local == nil {
		return nil
	}
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	if err := s.local.thawLocked(); err != nil {
		return fmt.Errorf("harness: thaw: %w", err)
	}
	return nil
}

// Frozen reports whether the server is frozen.
func (s *Server) Frozen() bool {
	if s.local == nil {
		return false
	}
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	return s.local.frozen != nil
}

// frozenSet is a frozen server: the postmaster's id and the guard that thaws it if this process
// dies.
type frozenSet struct {
	postmaster int
	guard      *thawGuard
}

// freezeLocked stops the postmaster, waits until it is stopped (so that it forks no more), then
// stops its children. Each id goes to the guard before its SIGSTOP. On failure it thaws what it
// froze. Caller must hold mu.
func (ls *localServer) freezeLocked() error {
	pm := ls.proc.cmd.Process.Pid
	g, err := startThawGuard()
	if err != nil {
		return err
	}
	ls.frozen = &frozenSet{postmaster: pm, guard: g}
	err = func() error {
		if err := g.stop(pm); err != nil {
			return err
		}
		if err := waitStopped(pm); err != nil {
			return err
		}
		kids, err := children(pm)
		if err != nil {
			return err
		}
		for _, k := range kids {
			if err := g.stop(k); err != nil {
				return err
			}
		}
		for _, k := range kids {
			if err := waitStopped(k); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		return errors.Join(err, ls.thawLocked())
	}
	return nil
}

// thawLocked sends SIGCONT to the children of a frozen postmaster, then to the postmaster, and
// stops the guard. It does nothing if the server is not frozen. Caller must hold mu.
func (ls *localServer) thawLocked() error {
	f := ls.frozen
	if f == nil {
		return nil
	}
	ls.frozen = nil
	var errs []error
	// A frozen postmaster neither forks nor reaps: its children now are the ones frozen.
	kids, err := children(f.postmaster)
	if err != nil {
		errs = append(errs, err)
	}
	for _, pid := range append(kids, f.postmaster) {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("SIGCONT %d: %w", pid, err))
		}
	}
	f.guard.close()
	return errors.Join(errs...)
}

// thawGuardScript reads process ids, one a line, until its input ends, then sends them SIGCONT.
// Its input ends when the guard's pipe is closed, which happens when this process exits, however
// it exits; Thaw kills the guard before.
const thawGuardScript = `pids=
while read pid; do pids="$pids $pid"; done
[ -n "$pids" ] && kill -CONT $pids 2>/dev/null
exit 0`

// thawGuard is a shell process that thaws frozen processes if this process dies.
type thawGuard struct {
	cmd *exec.Cmd
	w   *os.File // the write end of the guard's stdin; close-on-exec, so no child inherits it
}

func startThawGuard() (*thawGuard, error) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		sh = "/bin/sh"
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start thaw guard: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(sh, "-c", thawGuardScript)
	cmd.Stdin = r // an *os.File: no copying goroutine
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	// Its own session: a ^C to the test's process group does not kill it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start thaw guard %s: %w", sh, err)
	}
	return &thawGuard{cmd: cmd, w: w}, nil
}

// stop hands pid to the guard, then sends it SIGSTOP.
func (g *thawGuard) stop(pid int) error {
	if _, err := fmt.Fprintf(g.w, "%d\n", pid); err != nil {
		return fmt.Errorf("thaw guard: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGSTOP %d: %w", pid, err)
	}
	return nil
}

// close kills the guard before its input ends, so that it sends nothing, and reaps it.
func (g *thawGuard) close() {
	_ = g.cmd.Process.Kill()
	_ = g.cmd.Wait()
	_ = g.w.Close()
}

// procState returns the state letter and the parent id of a process from /proc/<pid>/stat.
func procState(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// "pid (comm) state ppid ...": comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 2 || len(fields[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	ppid, err = strconv.Atoi(string(fields[1]))
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	return fields[0][0], ppid, nil
}

// children lists the live child processes of pid, from /proc.
func children(pid int) ([]int, error) {
	entries, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, errors.New("/proc is not mounted")
	}
	var kids []int
	for _, e := range entries {
		id, err := strconv.Atoi(filepath.Base(e))
		if err != nil {
			continue
		}
		state, ppid, err := procState(id)
		if err != nil || ppid != pid || state == 'Z' || state == 'X' {
			continue // gone, or not a child
		}
		kids = append(kids, id)
	}
	return kids, nil
}

// waitStopped waits until pid is in the stopped state, or gone.
func waitStopped(pid int) error {
	deadline := time.Now().Add(stoppedTimeout)
	for {
		state, _, err := procState(pid)
		if err != nil || state == 'T' || state == 't' || state == 'Z' || state == 'X' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped %s after SIGSTOP (state %c)", pid, stoppedTimeout, state)
		}
		time.Sleep(time.Millisecond)
	}
}
