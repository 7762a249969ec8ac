package pgxguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// errClosed is a terminate's error once the guard is closed.
var errClosed = errors.New("pgxguard: guard closed")

// sideSession is the guard's own connection, outside the pool so that it works when the pool is
// full, used only to terminate backends. It opens on the first terminate, and again after it is
// found broken.
type sideSession struct {
	pc *pgxpool.Config // the user's configuration, as it was before the guard's tracer

	mu     sync.Mutex // serialises terminates; held across their I/O, by the guard's goroutines only
	conn   *pgx.Conn
	closed bool
}

func newSideSession(pc *pgxpool.Config) *sideSession { return &sideSession{pc: pc.Copy()} }

// connect opens a session as pgxpool opens its connections: the same ConnConfig (TLS, dialer,
// lookup, fallbacks, ValidateConnect and target_session_attrs) and the user's BeforeConnect on a
// copy, so that a rotating token (AWS IAM, Azure AD) logs the guard in too. The user's tracer and
// AfterConnect are left out: they are for the application's sessions.
func (s *sideSession) connect(ctx context.Context) (*pgx.Conn, error) {
	cc := s.pc.ConnConfig.Copy()
	cc.Tracer = nil
	cc.RuntimeParams["application_name"] = "pgxguard"
	if s.pc.BeforeConnect != nil {
		if err := s.pc.BeforeConnect(ctx, cc); err != nil {
			return nil, fmt.Errorf("pgxguard: BeforeConnect for the guard's session: %w", err)
		}
	}
	c, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("pgxguard: opening the guard's session: %w", err)
	}
	return c, nil
}

// terminate ends backend pid and reports nil only when the server says it is gone.
func (s *sideSession) terminate(pid uint32) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*terminateWait)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if s.closed {
			return errClosed
		}
		if s.conn == nil || s.conn.IsClosed() {
			if s.conn, err = s.connect(ctx); err != nil {
				return err
			}
		}
		var gone bool
		err = s.conn.QueryRow(ctx, "/* pgxguard */ select pg_terminate_backend($1, $2)",
			int32(pid), terminateWait.Milliseconds()).Scan(&gone)
		switch {
		case err == nil && gone:
			return nil
		case err == nil:
			return fmt.Errorf("pgxguard: backend %d was not terminated within %v (or was not found)", pid, terminateWait)
		case !s.conn.IsClosed() || ctx.Err() != nil:
			return fmt.Errorf("pgxguard: terminating backend %d: %w", pid, err)
		}
		// The session broke (a restart, a firewall): once more on a fresh one.
	}
	return fmt.Errorf("pgxguard: terminating backend %d: %w", pid, err)
}

// blockingPIDs returns pg_blocking_pids(pid): the sessions holding a lock that pid waits for.
func (s *sideSession) blockingPIDs(pid uint32) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(context.Background(), terminateWait)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if s.conn == nil || s.conn.IsClosed() {
		var err error
		if s.conn, err = s.connect(ctx); err != nil {
			return nil, err
		}
	}
	var pids []int32
	if err := s.conn.QueryRow(ctx, "/* pgxguard */ select pg_blocking_pids($1)", int32(pid)).Scan(&pids); err != nil {
		return nil, err
	}
	out := make([]uint32, len(pids))
	for i, p := range pids {
		out[i] = uint32(p)
	}
	return out, nil
}

func (s *sideSession) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.conn.Close(ctx)
		cancel()
		s.conn = nil
	}
}

// internalFrame reports whether a function belongs to pgx, this package or the runtime, which a
// call site skips.
func internalFrame(fn string) bool {
	for _, p := range []string{"github.com/jackc/pgx/", "github.com/pgxlanes/pgxlanes/txguard/pgxguard.", "runtime."} {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return false
}
