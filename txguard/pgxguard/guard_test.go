package pgxguard_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/txguard"
	"github.com/pgxlanes/pgxlanes/txguard/pgxguard"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

// recorder is a slog handler that keeps every record's message and attributes.
type recorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	})
	r.mu.Lock()
	r.lines = append(r.lines, b.String())
	r.mu.Unlock()
	return nil
}

func (r *recorder) find(sub string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// guarded returns a one-connection pgxpool with a guard on it, both closed at the test's end.
func guarded(t *testing.T, c pgxguard.Config, tune ...func(*pgxpool.Config)) (*pgxpool.Pool, *pgxguard.Guard) {
	t.Helper()
	pc, err := pgxpool.ParseConfig(pgserver.NewDatabase(t))
	require.NoError(t, err)
	pc.MaxConns = 1
	for _, f := range tune {
		f(pc)
	}
	g, err := pgxguard.New(pc, c)
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(func() {
		pool.Close()
		g.Close()
	})
	return pool, g
}

func backendPID(t *testing.T, pool *pgxpool.Pool) uint32 {
	t.Helper()
	c, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer c.Release()
	return c.Conn().PgConn().PID()
}

func TestFlagLogsAndKeepsTheStatementAndConnection(t *testing.T) {
	rec := &recorder{}
	pool, g := guarded(t, pgxguard.Config{Budget: 100 * time.Millisecond, Logger: slog.New(rec), CallSites: true})
	ctx := context.Background()
	pid := backendPID(t, pool)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "select pg_sleep(0.4)")
	require.NoError(t, err, "a flag must not touch the statement")
	require.NoError(t, tx.Commit(ctx))

	assert.EqualValues(t, 1, g.Stats().Flagged)
	assert.Zero(t, g.Stats().Cancelled+g.Stats().Terminated+g.Stats().Failed)
	flags := rec.find("over budget: flag")
	require.Len(t, flags, 1)
	assert.Contains(t, flags[0], "pid="+itoa(pid))
	assert.Contains(t, flags[0], "guard_test.go", "the call site is the test's Begin")
	assert.Len(t, rec.find("flagged connection returned"), 1)
	assert.Equal(t, pid, backendPID(t, pool), "a flagged connection is kept")
	assert.Zero(t, g.Stats().Watched)
}

func TestCancelStopsTheStatementAndRetiresTheConnection(t *testing.T) {
	var seen []pgxguard.Violation
	var mu sync.Mutex
	// The ladder: flag at Budget/2, cancel at Budget, terminate at 2×Budget. A budget of 1 s
	// leaves the cancel a second to take effect before the terminate, on a loaded machine too
	// (with 200 ms, a cancel that took over 200 ms was overtaken by the terminate: 57P01).
	pool, g := guarded(t, pgxguard.Config{Budget: time.Second, Action: txguard.Cancel,
		Logger: slog.New(&recorder{}),
		OnViolation: func(v pgxguard.Violation) {
			mu.Lock()
			seen = append(seen, v)
			mu.Unlock()
		}})
	ctx := context.Background()
	pid := backendPID(t, pool)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	start := time.Now()
	_, err = tx.Exec(ctx, "select pg_sleep(10)")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "57014", pgErr.Code)
	assert.Less(t, time.Since(start), 5*time.Second, "the cancel came at the budget, not the statement's end")
	require.NoError(t, tx.Rollback(ctx))

	counted(t, func() int64 { return g.Stats().Cancelled })
	assert.NotEqual(t, pid, backendPID(t, pool), "a connection a cancel was aimed at is never handed out again")
	mu.Lock()
	defer mu.Unlock()
	var cancels int
	for _, v := range seen {
		if v.Action == txguard.Cancel {
			cancels++
			assert.NoError(t, v.Err)
			assert.Equal(t, pid, v.PID)
		}
	}
	assert.Equal(t, 1, cancels)
}

func TestTerminateEndsTheBackendVerified(t *testing.T) {
	pool, g := guarded(t, pgxguard.Config{Budget: 200 * time.Millisecond, Action: txguard.Terminate,
		Logger: slog.New(&recorder{})})
	ctx := context.Background()

	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	pid := c.Conn().PgConn().PID()
	_, err = c.Exec(ctx, "select pg_sleep(10)")
	require.Error(t, err)
	c.Release()
	counted(t, func() int64 { return g.Stats().Terminated })

	// Seen from a session of its own, not the pool's.
	other, err := pgx.Connect(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	defer other.Close(ctx)
	var n int
	require.NoError(t, other.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", int32(pid)).Scan(&n))
	assert.Zero(t, n, "the terminated backend is gone")
	var ok int
	require.NoError(t, pool.QueryRow(ctx, "select 1").Scan(&ok), "the pool goes on with a new connection")
}

func TestWithBudgetOffLeavesALongHoldAlone(t *testing.T) {
	pool, g := guarded(t, pgxguard.Config{Budget: 100 * time.Millisecond, Action: txguard.Cancel,
		Logger: slog.New(&recorder{})})
	ctx := pgxguard.WithBudget(context.Background(), 0)
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = c.Exec(ctx, "select pg_sleep(0.4)")
	require.NoError(t, err)
	c.Release()
	assert.Equal(t, pgxguard.Stats{}, g.Stats())

	// A tighter budget for one call.
	c, err = pool.Acquire(pgxguard.WithBudget(context.Background(), 50*time.Millisecond))
	require.NoError(t, err)
	_, err = c.Exec(context.Background(), "select pg_sleep(5)")
	require.Error(t, err)
	c.Release()
	counted(t, func() int64 { return g.Stats().Cancelled })
}

// A cancel aimed at one lease never stops a later caller's statement on the same connection:
// leases that overrun a 1 ms budget alternate with leases without a budget on a one-connection
// pool, so that cancels race the end of the lease they were meant for.
func TestStaleCancelNeverHitsTheNextCaller(t *testing.T) {
	pool, g := guarded(t, pgxguard.Config{Budget: time.Millisecond, Action: txguard.Cancel,
		Logger: slog.New(&recorder{})})
	ctx := context.Background()
	bystander := pgxguard.WithBudget(ctx, 0)
	var spurious, victims atomic.Int64
	deadline := time.Now().Add(8 * time.Second)
	for i := 0; i < 600 && time.Now().Before(deadline); i++ {
		if _, err := pool.Exec(ctx, "select pg_sleep(0.001)"); err != nil {
			victims.Add(1)
		}
		for j := 0; j < 3; j++ {
			if _, err := pool.Exec(bystander, "select pg_sleep(0.002)"); err != nil {
				spurious.Add(1)
				t.Logf("bystander failed: %v", err)
			}
		}
	}
	t.Logf("victims cancelled %d, cancels sent %d, bystanders failed %d", victims.Load(), g.Stats().Cancelled, spurious.Load())
	assert.Zero(t, spurious.Load(), "a cancel reached a caller it was not aimed at")
	assert.Positive(t, g.Stats().Cancelled, "the test raced nothing")
}

func TestGuardSessionLogsInThroughBeforeConnect(t *testing.T) {
	var guardLogins atomic.Int64
	pool, g := guarded(t, pgxguard.Config{Budget: 150 * time.Millisecond, Action: txguard.Terminate,
		Logger: slog.New(&recorder{})}, func(pc *pgxpool.Config) {
		pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			if cc.RuntimeParams["application_name"] == "pgxguard" {
				guardLogins.Add(1)
			}
			return nil
		}
	})
	ctx := context.Background()
	_, err := pool.Exec(ctx, "select pg_sleep(5)")
	require.Error(t, err)
	counted(t, func() int64 { return g.Stats().Terminated })
	assert.EqualValues(t, 1, guardLogins.Load(), "the guard's session went through the user's BeforeConnect")
}

func TestGuardSessionLoginFailureIsReported(t *testing.T) {
	pool, g := guarded(t, pgxguard.Config{Budget: 100 * time.Millisecond, Action: txguard.Terminate,
		Logger: slog.New(&recorder{})}, func(pc *pgxpool.Config) {
		pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			if cc.RuntimeParams["application_name"] == "pgxguard" {
				return errors.New("no token today")
			}
			return nil
		}
	})
	_, err := pool.Exec(pgxguard.WithBudget(context.Background(), 100*time.Millisecond), "select pg_sleep(0.5)")
	require.NoError(t, err, "a terminate that could not be carried out leaves the statement alone")
	counted(t, func() int64 { return g.Stats().Failed })
	assert.Zero(t, g.Stats().Terminated, "a terminate is counted only when it happened")
}

func TestUserTracerIsKept(t *testing.T) {
	tr := &countingTracer{}
	pool, _ := guarded(t, pgxguard.Config{Logger: slog.New(&recorder{})}, func(pc *pgxpool.Config) {
		pc.ConnConfig.Tracer = tr
	})
	_, err := pool.Exec(context.Background(), "select 1")
	require.NoError(t, err)
	assert.EqualValues(t, 1, tr.queries.Load())
	assert.EqualValues(t, 1, tr.acquires.Load())
}

func TestConfigErrorsNameTheField(t *testing.T) {
	pc, err := pgxpool.ParseConfig("host=127.0.0.1 password=hunter2")
	require.NoError(t, err)
	_, err = pgxguard.New(pc, pgxguard.Config{Budget: -time.Second})
	require.ErrorContains(t, err, "Config.Budget")
	_, err = pgxguard.New(pc, pgxguard.Config{Action: txguard.Mark})
	require.ErrorContains(t, err, "Config.Action")
	_, err = pgxguard.New(&pgxpool.Config{}, pgxguard.Config{})
	require.ErrorContains(t, err, "ParseConfig")
	_, err = pgxguard.New(nil, pgxguard.Config{})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2")
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pc, err := pgxpool.ParseConfig(pgserver.NewDatabase(t))
	require.NoError(t, err)
	g, err := pgxguard.New(pc, pgxguard.Config{Budget: 50 * time.Millisecond, Action: txguard.Terminate,
		Logger: slog.New(&recorder{})})
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), "select pg_sleep(2)")
	require.Error(t, err)
	pool.Close()
	g.Close()
	g.Close() // safe twice
}

// counted waits until n reports one action: the guard counts an action once its I/O is done,
// which may be just after the caller saw its effect.
func counted(t *testing.T, n func() int64) {
	t.Helper()
	pgserver.Eventually(t, 10*time.Second, "the action to be counted", func() bool { return n() >= 1 })
	assert.EqualValues(t, 1, n())
}

type countingTracer struct{ queries, acquires atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *countingTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	c.acquires.Add(1)
	return ctx
}
func (c *countingTracer) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {
}

func itoa(u uint32) string {
	var b [10]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			return string(b[i:])
		}
	}
}

// A flagged lease that waits for a lock names the session holding it: here another lease of the
// same pool, with the call site that acquired it.
func TestFlagNamesTheLockHolder(t *testing.T) {
	var mu sync.Mutex
	var seen []pgxguard.Violation
	pool, _ := guarded(t, pgxguard.Config{Budget: 300 * time.Millisecond, CallSites: true, Logger: slog.New(&recorder{}),
		OnViolation: func(v pgxguard.Violation) {
			mu.Lock()
			seen = append(seen, v)
			mu.Unlock()
		}}, func(pc *pgxpool.Config) { pc.MaxConns = 2 })
	ctx := context.Background()
	_, err := pool.Exec(pgxguard.WithBudget(ctx, 0), "create table items (id int primary key, v int); insert into items values (1, 0)")
	require.NoError(t, err)

	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) // a failed assertion must not leave Close waiting for it
	_, err = holder.Exec(ctx, "select v from items where id = 1 for update")
	require.NoError(t, err)
	holderPID := holder.Conn().PgConn().PID()

	waiter, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer waiter.Rollback(ctx)
	waiterPID := waiter.Conn().PgConn().PID()
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "update items set v = v + 1 where id = 1")
		done <- err
	}()
	var named pgxguard.Violation
	pgserver.Eventually(t, 10*time.Second, "the waiter flagged with its blocker", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, v := range seen {
			if v.PID == waiterPID && len(v.BlockedBy) > 0 {
				named = v
				return true
			}
		}
		return false
	})
	require.NoError(t, holder.Commit(ctx))
	require.NoError(t, <-done)
	require.NoError(t, waiter.Commit(ctx))
	require.Len(t, named.BlockedBy, 1)
	b := named.BlockedBy[0]
	assert.Equal(t, holderPID, b.PID)
	assert.True(t, b.OfThisPool)
	assert.Contains(t, b.CallSite, "guard_test.go", "the holder's acquiring call site")
}

// ServerBackstop puts idle_in_transaction_session_timeout just past the ladder's last step in
// the startup packet, unless the connection string sets one; Flag never interrupts, so it gets
// none.
func TestServerBackstop(t *testing.T) {
	show := func(pool *pgxpool.Pool) string {
		var v string
		require.NoError(t, pool.QueryRow(context.Background(), "show idle_in_transaction_session_timeout").Scan(&v))
		return v
	}
	pool, _ := guarded(t, pgxguard.Config{Budget: 200 * time.Millisecond, Action: txguard.Cancel, ServerBackstop: true,
		Logger: slog.New(&recorder{})})
	assert.Equal(t, "1400ms", show(pool), "twice the budget (the terminate of the Cancel ladder) plus a second")

	pool, _ = guarded(t, pgxguard.Config{Budget: 200 * time.Millisecond, Action: txguard.Cancel, ServerBackstop: true,
		Logger: slog.New(&recorder{})}, func(pc *pgxpool.Config) {
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "5000"
	})
	assert.Equal(t, "5s", show(pool), "the user's own value is kept")

	pool, _ = guarded(t, pgxguard.Config{Budget: 200 * time.Millisecond, ServerBackstop: true, Logger: slog.New(&recorder{})})
	assert.Equal(t, "0", show(pool), "Flag sets no backstop")
}
