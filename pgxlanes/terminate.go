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
// every lane is full, used to terminate sessions over budget and to look up lock holders. The
// fleet's slots live on sessions of their own (fleet.go), so that a Long caller never waits
// behind a terminate; every side session the pool opens is opened by connect.
//
// It gets its session when it can: it opens in the background with the pool's first lease (not at
// New, where pgxpool opens nothing and calls no hook), and again whenever it is found closed. While idle it pings at half the server's idle_session_timeout, so that the
// server does not close it. A terminate that finds it broken (a restart, a firewall) reconnects
// and tries again. If the server refuses it (max_connections), terminates fail and are reported
// as failed; size max_connections for the pools plus their side sessions (docs/scale-out.md).
//
// The session is used by one statement at a time: sem is taken for each, with the caller's
// context, and never across a wait (a terminate signals, then polls with sem released between
// polls), so that one lease's terminate never holds up another's for longer than a statement.
type terminator struct {
	base   *pgxpool.Config // the user's: the session opens as the pool's connections do (dial.go)
	values context.Context // the values of the ctx the pool was created with, for BeforeConnect
	logger *slog.Logger
	reporter

	sem    chan struct{} // a token in it means the session is free; held across a statement
	mu     sync.Mutex    // guards conn, keep and closed; never held across I/O
	conn   *pgx.Conn     // guarded by mu; used only by the holder of sem
	keep   *time.Timer   // the keep-alive ping; nil when none; guarded by mu
	closed bool          // guarded by mu
	warmed sync.Once
	wg     sync.WaitGroup
}

func newTerminator(ctx context.Context, base *pgxpool.Config, logger *slog.Logger) *terminator {
	t := &terminator{base: base.Copy(), values: context.WithoutCancel(ctx), logger: logger, sem: make(chan struct{}, 1)}
	t.sem <- struct{}{}
	return t
}

// connect opens a side session of the pool (the guard's, the fleet's) named name in
// pg_stat_activity, as the pool opens its connections (dial.go: the user's BeforeConnect, TLS,
// dialer and fallbacks). It is the one place where the pool opens a session outside pgxpool.
func (t *terminator) connect(ctx context.Context, name string) (*pgx.Conn, error) {
	return openSideSession(withValues{ctx, t.values}, t.base, name)
}

// withValues is a context with the values of vals wherever its own has none: the user's
// BeforeConnect sees, for a side session, the values of the ctx the pool was created with, as it
// does for pgxpool's background connections.
type withValues struct {
	context.Context
	vals context.Context
}

func (c withValues) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.vals.Value(key)
}

// warm opens the guard session in the background, once.
func (t *terminator) warm() {
	t.warmed.Do(func() {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), terminateTimeout)
			defer cancel()
			if err := t.with(ctx, func(*pgx.Conn) error { return nil }); err != nil {
				t.logger.LogAttrs(ctx, slog.LevelWarn, "pgxlanes: guard session not opened; terminates will retry",
					slog.String("error", err.Error()))
			}
		}()
	})
}

// with runs f on the guard session, opening it if needed, once the session is free or until ctx
// ends. A session that fails f with a connection error is closed, and f tried once more on a
// fresh one.
func (t *terminator) with(ctx context.Context, f func(*pgx.Conn) error) error {
	select {
	case <-t.sem:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the guard session: %w", ctx.Err())
	}
	defer func() { t.sem <- struct{}{} }()
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var c *pgx.Conn
		if c, err = t.session(ctx); err != nil {
			return err
		}
		if err = f(c); err == nil || !brokenConn(c, err) || ctx.Err() != nil {
			return err
		}
		t.drop(c)
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

// session returns the guard session, opening it if needed. Caller must hold sem.
func (t *terminator) session(ctx context.Context) (*pgx.Conn, error) {
	t.mu.Lock()
	closed, c := t.closed, t.conn
	t.mu.Unlock()
	if closed {
		return nil, errors.New("pgxlanes: guard session closed with the pool")
	}
	if c != nil && !c.IsClosed() {
		return c, nil
	}
	c, err := t.connect(ctx, "pgxlanes guard")
	if err != nil {
		return nil, fmt.Errorf("opening the guard session: %w", err)
	}
	var keep time.Duration
	var idle string
	if err := c.QueryRow(ctx, guardTag+"select current_setting('idle_session_timeout', true)").Scan(&idle); err == nil {
		keep = parseSetting(idle) / 2
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		closeConn(c)
		return nil, errors.New("pgxlanes: guard session closed with the pool")
	}
	t.conn = c
	if keep > 0 {
		t.keepAliveLocked(c, keep)
	}
	return c, nil
}

// keepAliveLocked pings the guard session c every d, on a timer (no goroutine while it waits). A
// ping skips its turn when the session is in use. Caller must hold t.mu.
func (t *terminator) keepAliveLocked(c *pgx.Conn, d time.Duration) {
	var ping func()
	ping = func() {
		select {
		case <-t.sem:
		default:
			t.mu.Lock()
			if !t.closed && t.conn == c {
				t.keep = time.AfterFunc(d, ping)
			}
			t.mu.Unlock()
			return
		}
		defer func() { t.sem <- struct{}{} }()
		t.mu.Lock()
		live := !t.closed && t.conn == c
		t.mu.Unlock()
		if !live {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx)
		cancel()
		if err != nil {
			t.drop(c)
			return
		}
		t.mu.Lock()
		if !t.closed && t.conn == c {
			t.keep = time.AfterFunc(d, ping)
		}
		t.mu.Unlock()
	}
	t.keep = time.AfterFunc(d, ping)
}

// drop closes c if it is still the guard session.
func (t *terminator) drop(c *pgx.Conn) {
	t.mu.Lock()
	if t.conn != c {
		t.mu.Unlock()
		return
	}
	t.conn = nil
	if t.keep != nil {
		t.keep.Stop()
		t.keep = nil
	}
	t.mu.Unlock()
	closeConn(c)
}

// closeConn closes a side session without waiting on a server that does not answer.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	_ = c.Close(ctx)
	cancel()
}

// terminate ends the session of backend pid and returns nil only once the server no longer lists
// it, so that its transaction is rolled back and its locks released. A broken guard session is
// replaced and the terminate tried again within ctx. The guard session is held for one
// statement at a time: other terminates and lookups run between the polls.
func (t *terminator) terminate(ctx context.Context, pid uint32) error {
	err := t.with(ctx, func(c *pgx.Conn) error {
		// Make sure pid is a backend of this server: behind a pooler, a client sees the
		// pooler's key, not the server's PID.
		var signalled *bool
		err := c.QueryRow(ctx, guardTag+`select case when exists (select from pg_stat_activity where pid = $1)
			then pg_terminate_backend($1) end`, int32(pid)).Scan(&signalled)
		if err == nil && signalled == nil {
			return fmt.Errorf("backend %d is not a session of this server (connected through a pooler?)", pid)
		}
		return err
	})
	if err == nil {
		err = t.waitGone(ctx, pid)
	}
	if err != nil {
		return fmt.Errorf("terminating backend %d: %w", pid, err)
	}
	return nil
}

// waitGone polls until the server no longer lists backend pid, holding the guard session only
// for each poll.
func (t *terminator) waitGone(ctx context.Context, pid uint32) error {
	for {
		var n int
		err := t.with(ctx, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, guardTag+"select count(*) from pg_stat_activity where pid = $1", int32(pid)).Scan(&n)
		})
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		tm := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			tm.Stop()
			return fmt.Errorf("backend still present: %w", ctx.Err())
		case <-tm.C:
		}
	}
}

// close closes the guard session and stops it from opening again, once the reports queued are
// done.
func (t *terminator) close() {
	t.wg.Wait()
	t.reporter.wait()
	<-t.sem // a keep-alive ping may be under way
	defer func() { t.sem <- struct{}{} }()
	t.mu.Lock()
	t.closed = true
	c := t.conn
	t.conn = nil
	if t.keep != nil {
		t.keep.Stop()
		t.keep = nil
	}
	t.mu.Unlock()
	if c != nil {
		closeConn(c)
	}
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
