package txguard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Terminator ends server sessions over a connection of its own, outside any pool, so that it works
// even when every pool connection is taken. The connection is opened on first use and kept.
type Terminator struct {
	config *pgx.ConnConfig

	mu     sync.Mutex // serializes use of conn
	conn   *pgx.Conn
	closed bool // after Close, the connection is not opened again
}

// ErrTerminatorClosed is returned by a Terminator used after Close.
var ErrTerminatorClosed = errors.New("txguard: guard connection closed")

// NewTerminator returns a Terminator that connects with a copy of config.
func NewTerminator(config *pgx.ConnConfig) *Terminator {
	return &Terminator{config: config.Copy()}
}

// With runs f on the guard connection, opening it if needed. Calls are serialized.
func (t *Terminator) With(ctx context.Context, f func(*pgx.Conn) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.connectLocked(ctx); err != nil {
		return err
	}
	return f(t.conn)
}

func (t *Terminator) connectLocked(ctx context.Context) error {
	if t.closed {
		return ErrTerminatorClosed
	}
	if t.conn == nil || t.conn.IsClosed() {
		c, err := pgx.ConnectConfig(ctx, t.config)
		if err != nil {
			return fmt.Errorf("txguard: opening the guard connection: %w", err)
		}
		t.conn = c
	}
	return nil
}

// Terminate ends the session of backend pid and waits until the server has removed it, so that
// its transaction is rolled back and its locks are released when Terminate returns nil.
func (t *Terminator) Terminate(ctx context.Context, pid uint32) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.connectLocked(ctx); err != nil {
		return err
	}
	// Make sure pid is a backend of this server: behind a pooler, a client sees the pooler's
	// key, not the server's PID.
	var n int
	if err := t.conn.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", int32(pid)).Scan(&n); err != nil {
		return fmt.Errorf("txguard: terminating backend %d: %w", pid, err)
	}
	if n == 0 {
		return fmt.Errorf("txguard: backend %d is not a session of this server (connected through a pooler?)", pid)
	}
	wait := time.Until(deadlineOr(ctx, 5*time.Second))
	var ok bool
	// PostgreSQL 14+ waits for the backend to exit when given a timeout.
	err := t.conn.QueryRow(ctx, "select pg_terminate_backend($1, $2)", int32(pid), wait.Milliseconds()).Scan(&ok)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function: before 14
		err = t.conn.QueryRow(ctx, "select pg_terminate_backend($1)", int32(pid)).Scan(&ok)
		if err == nil && ok {
			err = t.waitGone(ctx, pid)
		}
	}
	if err != nil {
		return fmt.Errorf("txguard: terminating backend %d: %w", pid, err)
	}
	if !ok {
		// The backend is already gone, or it did not exit in time.
		if err := t.waitGone(ctx, pid); err != nil {
			return fmt.Errorf("txguard: terminating backend %d: %w", pid, err)
		}
	}
	return nil
}

func (t *Terminator) waitGone(ctx context.Context, pid uint32) error {
	for {
		var n int
		if err := t.conn.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", int32(pid)).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("backend still present: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Close closes the guard connection.
func (t *Terminator) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = t.conn.Close(ctx)
		cancel()
		t.conn = nil
	}
}

func deadlineOr(ctx context.Context, d time.Duration) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(d)
}
