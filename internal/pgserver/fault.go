package pgserver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotLocal is the error of Restart, StopPostmaster, StartPostmaster and Freeze on a server the
// harness did not start from local binaries (PGXLANES_TEST_DATABASE, Docker). Use errors.Is.
var ErrNotLocal = errors.New("the server was not started by the harness from local binaries")

// stopGrace bounds a fast shutdown; then the postmaster is killed.
const stopGrace = 10 * time.Second

// StopMode says how StopPostmaster and Restart stop the postmaster, as pg_ctl stop -m does.
type StopMode int

const (
	// StopFast sends SIGINT: the postmaster terminates every session (SQLSTATE 57P01), rolls
	// back open transactions, writes a shutdown checkpoint and exits.
	StopFast StopMode = iota + 1
	// StopImmediate sends SIGQUIT: every process exits at once, as in a crash; the next start
	// runs crash recovery, which empties unlogged tables.
	StopImmediate
)

func (m StopMode) String() string {
	switch m {
	case StopFast:
		return "fast"
	case StopImmediate:
		return "immediate"
	}
	return fmt.Sprintf("StopMode(%d)", int(m))
}

func (m StopMode) signal() (syscall.Signal, error) {
	switch m {
	case StopFast:
		return syscall.SIGINT, nil
	case StopImmediate:
		return syscall.SIGQUIT, nil
	}
	return 0, fmt.Errorf("harness: mode: %v is not StopFast or StopImmediate", m)
}

// RestartStats tells what a Restart did and how long the server was down.
type RestartStats struct {
	Mode StopMode
	// OldPID and NewPID are the process ids of the postmaster before and after.
	OldPID, NewPID int
	// Stopping is the time from the stop signal until the old postmaster had exited.
	Stopping time.Duration
	// Down is the time from the stop signal until the new postmaster accepted a connection
	// (measured by polling every 5 ms).
	Down time.Duration
}

// localFor returns the local server behind s, or an error wrapping ErrNotLocal for op.
func (s *Server) localFor(op string) (*localServer, error) {
	if s.local == nil {
		return nil, fmt.Errorf("harness: %s: %w (source %q)", op, ErrNotLocal, s.source)
	}
	return s.local, nil
}

// PID is the process id of the postmaster, or 0 if the server is stopped, closed, or not started
// by the harness from local binaries. It changes with every restart.
func (s *Server) PID() int {
	if s.local == nil {
		return 0
	}
	s.local.mu.Lock()
	defer s.local.mu.Unlock()
	if s.local.proc == nil {
		return 0
	}
	return s.local.proc.cmd.Process.Pid
}

// Port is the TCP port of the server, from its DSN, or 0 if the DSN names none. A local server
// keeps its port across restarts.
func (s *Server) Port() int {
	if s.local != nil {
		return s.local.port
	}
	cfg, err := pgconn.ParseConfig(s.dsn)
	if err != nil {
		return 0
	}
	return int(cfg.Port)
}

// DataDir is the server's data directory, or "" if the harness did not start it from local
// binaries. Close removes it.
func (s *Server) DataDir() string {
	if s.local == nil {
		return ""
	}
	return filepath.Join(s.local.dir, "data")
}

// StopPostmaster stops the server in mode and waits for the postmaster to exit (a fast stop that
// takes longer than 10 s ends with SIGKILL). A frozen server is thawed first. The server keeps its
// port and data directory; StartPostmaster starts it again. Stopping a stopped server does
// nothing.
func (s *Server) StopPostmaster(mode StopMode) error {
	ls, err := s.localFor("stop")
	if err != nil {
		return err
	}
	sig, err := mode.signal()
	if err != nil {
		return err
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return errors.New("harness: stop: the server is closed")
	}
	_, err = ls.stopLocked(sig)
	return err
}

// StartPostmaster starts a server stopped by StopPostmaster, on the same port and data directory,
// and waits until it accepts connections or ctx ends. Starting a running server does nothing.
func (s *Server) StartPostmaster(ctx context.Context) error {
	ls, err := s.localFor("start")
	if err != nil {
		return err
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch {
	case ls.closed:
		return errors.New("harness: start: the server is closed")
	case ls.proc != nil:
		return nil
	}
	if err := ls.startLocked(ctx, restartPoll); err != nil {
		return fmt.Errorf("harness: start: %w", err)
	}
	return nil
}

// Restart stops the server in mode, starts it again on the same port and data directory, and
// waits until it accepts connections or ctx ends. A frozen server is thawed first. Every session
// is closed by the stop; DSN stays valid. It fails on a stopped server, and if another process
// took the port while the server was down (the server then stays stopped).
func (s *Server) Restart(ctx context.Context, mode StopMode) (RestartStats, error) {
	ls, err := s.localFor("restart")
	if err != nil {
		return RestartStats{}, err
	}
	sig, err := mode.signal()
	if err != nil {
		return RestartStats{}, err
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch {
	case ls.closed:
		return RestartStats{}, errors.New("harness: restart: the server is closed")
	case ls.proc == nil:
		return RestartStats{}, errors.New("harness: restart: the server is stopped; use StartPostmaster")
	}
	st := RestartStats{Mode: mode, OldPID: ls.proc.cmd.Process.Pid}
	sent, err := ls.stopLocked(sig)
	if err != nil {
		return st, err
	}
	st.Stopping = time.Since(sent)
	if err := ls.startLocked(ctx, restartPoll); err != nil {
		return st, fmt.Errorf("harness: restart: %w", err)
	}
	st.Down = time.Since(sent)
	st.NewPID = ls.proc.cmd.Process.Pid
	return st, nil
}

// stopLocked thaws the postmaster, sends it sig and waits for it to exit. It returns when the
// signal was sent. Caller must hold mu.
func (ls *localServer) stopLocked(sig syscall.Signal) (time.Time, error) {
	if ls.proc == nil {
		return time.Now(), nil
	}
	if err := ls.thawLocked(); err != nil {
		return time.Time{}, fmt.Errorf("harness: stop: %w", err)
	}
	sent := time.Now()
	err := ls.proc.stop(sig, stopGrace)
	ls.proc = nil
	if err != nil {
		return sent, fmt.Errorf("harness: stop: %w", err)
	}
	return sent, nil
}
