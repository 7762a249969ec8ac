package pgxlanes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// guardTag starts every statement the pool runs for itself, so that it is recognisable in
// pg_stat_activity and server logs.
const guardTag = "/* pgxlanes guard */ "

// terminator is the pool's guard session: one connection outside the lanes, so that it works when
// every lane is full, used to terminate sessions over budget and to look up lock holders.
//
// It gets its session when it can: it opens in the background as soon as the server has accepted
// the pool's first connection (warm), and again whenever it is found closed. While idle it pings
// at half the server's idle_session_timeout, so that the server does not close it. A terminate
// that finds it broken (a restart, a firewall) reconnects and tries again. If the server refuses
// it (max_connections), terminates fail and are reported as failed; size max_connections for the
// pools plus one guard session per pool (docs/scale-out.md).
type terminator struct {
	base   *pgxpool.Config // the user's: the session opens as the pool's connections do (dial.go)
	logger *slog.Logger

	mu     sync.Mutex // serializes use of conn
	conn   *pgx.Conn
	keep   *time.Timer // the keep-alive ping; nil when none
	closed bool
	warmed sync.Once
	wg     sync.WaitGroup
}

func newTerminator(base *pgxpool.Config, logger *slog.Logger) *terminator {
	return &terminator{base: base.Copy(), logger: logger}
}

// warm opens the guard session in the background, once.
func (t *terminator) warm() {
	t.warmed.Do(func() {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), terminateTimeout)
			defer cancel()
			t.mu.Lock()
			defer t.mu.Unlock()
			if err := t.connectLocked(ctx); err != nil {
				t.logger.LogAttrs(ctx, slog.LevelWarn, "pgxlanes: guard session not opened; terminates will retry",
					slog.String("error", err.Error()))
			}
		}()
	})
}

// with runs f on the guard session, opening it if needed. A session that fails f with a
// connection error is closed, and f tried once more on a fresh one.
func (t *terminator) with(ctx context.Context, f func(*pgx.Conn) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if err = t.connectLocked(ctx); err != nil {
			return err
		}
		if err = f(t.conn); err == nil || !brokenConn(t.conn, err) || ctx.Err() != nil {
			return err
		}
		t.dropLocked()
	}
	return err
}

// brokenConn reports whether err means the session itself is gone, as opposed to a statement's
// failure.
func brokenConn(c *pgx.Conn, err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC") {
		return true
	}
	return c.IsClosed()
}

func (t *terminator) connectLocked(ctx context.Context) error {
	if t.closed {
		return errors.New("pgxlanes: guard session closed with the pool")
	}
	if t.conn != nil && !t.conn.IsClosed() {
		return nil
	}
	c, err := openSideSession(ctx, t.base, "pgxlanes guard")
	if err != nil {
		return fmt.Errorf("opening the guard session: %w", err)
	}
	t.conn = c
	var idle string
	if err := c.QueryRow(ctx, guardTag+"select current_setting('idle_session_timeout', true)").Scan(&idle); err == nil {
		if d := parseSetting(idle); d > 0 {
			t.keepAliveLocked(d / 2)
		}
	}
	return nil
}

// keepAliveLocked pings the guard session every d, on a timer (no goroutine while it waits).
func (t *terminator) keepAliveLocked(d time.Duration) {
	var ping func()
	ping = func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.closed || t.conn == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := t.conn.Ping(ctx)
		cancel()
		if err != nil {
			t.dropLocked()
			return
		}
		t.keep = time.AfterFunc(d, ping)
	}
	t.keep = time.AfterFunc(d, ping)
}

func (t *terminator) dropLocked() {
	if t.keep != nil {
		t.keep.Stop()
		t.keep = nil
	}
	if t.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		_ = t.conn.Close(ctx)
		cancel()
		t.conn = nil
	}
}

// terminate ends the session of backend pid and returns nil only once the server no longer lists
// it, so that its transaction is rolled back and its locks released. A broken guard session is
// replaced and the terminate tried again within ctx.
func (t *terminator) terminate(ctx context.Context, pid uint32) error {
	err := t.with(ctx, func(c *pgx.Conn) error {
		// Make sure pid is a backend of this server: behind a pooler, a client sees the
		// pooler's key, not the server's PID.
		var n int
		if err := c.QueryRow(ctx, guardTag+"select count(*) from pg_stat_activity where pid = $1", int32(pid)).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("backend %d is not a session of this server (connected through a pooler?)", pid)
		}
		wait := time.Until(deadlineOr(ctx, terminateTimeout))
		var ok bool
		// PostgreSQL 14+ waits for the backend to exit when given a timeout.
		err := c.QueryRow(ctx, guardTag+"select pg_terminate_backend($1, $2)", int32(pid), wait.Milliseconds()).Scan(&ok)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42883" { // undefined_function: before 14
			err = c.QueryRow(ctx, guardTag+"select pg_terminate_backend($1)", int32(pid)).Scan(&ok)
		}
		if err != nil {
			return err
		}
		return waitGone(ctx, c, pid)
	})
	if err != nil {
		return fmt.Errorf("terminating backend %d: %w", pid, err)
	}
	return nil
}

// waitGone polls until the server no longer lists backend pid.
func waitGone(ctx context.Context, c *pgx.Conn, pid uint32) error {
	for {
		var n int
		if err := c.QueryRow(ctx, guardTag+"select count(*) from pg_stat_activity where pid = $1", int32(pid)).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("backend still present: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// close closes the guard session and stops it from opening again.
func (t *terminator) close() {
	t.wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.dropLocked()
}

func deadlineOr(ctx context.Context, d time.Duration) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(d)
}

// parseSetting reads a time setting as current_setting shows it ("0", "500ms", "10s", "5min",
// "1h", "1d"); 0 for anything else.
func parseSetting(s string) time.Duration {
	units := []struct {
		suffix string
		d      time.Duration
	}{{"ms", time.Millisecond}, {"min", time.Minute}, {"s", time.Second}, {"h", time.Hour}, {"d", 24 * time.Hour}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				return 0
			}
			return time.Duration(v) * u.d
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0
	}
	return time.Duration(v) * time.Millisecond
}
