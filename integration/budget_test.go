package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// logBuffer is a goroutine-safe slog JSON sink.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func newGuardedPool(t *testing.T, dsn, params string, mod func(*pgxlanes.Config)) (*pgxlanes.Pool, *logBuffer) {
	t.Helper()
	cfg, err := pgxlanes.ParseConfig(withParams(dsn, params))
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if mod != nil {
		mod(cfg)
	}
	p, err := pgxlanes.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, logs
}

func backendAlive(t *testing.T, pid uint32) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, sharedDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", int32(pid)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// TestTerminateIdleTransaction: a transaction that sits on a row lock past its budget is
// terminated: its backend is gone, the lock is free for a short UPDATE, its slot is back, and the
// application's next statement and its Commit fail with ErrBudgetExceeded.
func TestTerminateIdleTransaction(t *testing.T) {
	ctx := context.Background()
	const budget = time.Second
	var violations []pgxlanes.Violation
	var vmu sync.Mutex
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=4&lane_tx_budget=1s&lane_tx_over_budget=terminate", func(c *pgxlanes.Config) {
		c.OnViolation = func(v pgxlanes.Violation) {
			vmu.Lock()
			violations = append(violations, v)
			vmu.Unlock()
		}
	})
	tx, err := p.Begin(pgxlanes.WithTag(ctx, "checkout"))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	pid := tx.Conn().PgConn().PID()
	if _, err := tx.Exec(ctx, "select v from items where id = 1 for update"); err != nil {
		t.Fatal(err)
	}
	// A second writer waits on the row lock (Long lane: lock_timeout 30s); when it gets through,
	// the lock was released.
	unlocked := make(chan time.Time, 1)
	go func() {
		_, err := p.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "update items set v = v + 100 where id = 1")
		if err != nil {
			t.Error(err)
		}
		unlocked <- time.Now()
	}()
	var released time.Time
	select {
	case released = <-unlocked:
	case <-time.After(budget + 5*time.Second):
		t.Fatal("the row lock was not released")
	}
	reaction := released.Sub(began.Add(budget))
	t.Logf("budget %s exceeded → lock released after %s", budget, reaction.Round(time.Millisecond))
	if reaction < 0 || reaction > 2*time.Second {
		t.Fatalf("lock released %s after the budget ran out, want within (0, 2s]", reaction)
	}
	// The guard frees the slot once the server confirms the backend is gone.
	pgserver.Eventually(t, time.Second, "backend gone and slot freed", func() bool {
		return !backendAlive(t, pid) && p.Stat().Lane(pgxlanes.Tx).InUse == 0
	})
	// A short UPDATE of the row succeeds right away.
	if _, err := p.Exec(ctx, "update items set v = 7 where id = 1"); err != nil {
		t.Fatal(err)
	}
	// The application learns it on its next call and on Commit.
	_, err = tx.Exec(ctx, "update items set v = 8 where id = 1")
	var be *pgxlanes.BudgetError
	if !errors.Is(err, pgxlanes.ErrBudgetExceeded) || !errors.As(err, &be) {
		t.Fatalf("next statement: %v, want ErrBudgetExceeded", err)
	}
	if be.Lane != pgxlanes.Tx || be.Tag != "checkout" || be.Budget != budget || be.Action != pgxlanes.ActionTerminate || be.Elapsed < budget {
		t.Fatalf("budget error %+v", be)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgxlanes.ErrBudgetExceeded) {
		t.Fatalf("Commit: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("Rollback after termination: %v", err)
	}
	lanesIdle(t, p, "after the terminated transaction ended")
	var v int
	if err := p.QueryRow(ctx, "select v from items where id = 1").Scan(&v); err != nil || v != 7 {
		t.Fatalf("v = %d (%v): the terminated transaction's write must not land", v, err)
	}
	vmu.Lock()
	defer vmu.Unlock()
	if len(violations) != 2 || violations[0].Action != pgxlanes.ActionFlag || violations[1].Action != pgxlanes.ActionTerminate ||
		violations[1].PID != pid || violations[1].Tag != "checkout" {
		t.Fatalf("violations %+v, want a flag then a terminate", violations)
	}
}

// TestCancelRunningStatement: a transaction running pg_sleep past its budget is cancelled; the
// connection survives and is reused after the rollback.
func TestCancelRunningStatement(t *testing.T) {
	ctx := context.Background()
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=2&lane_tx_budget=300ms&lane_tx_over_budget=cancel",
		func(c *pgxlanes.Config) { c.CancelGrace = 200 * time.Millisecond })
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := tx.Conn().PgConn().PID()
	start := time.Now()
	_, err = tx.Exec(ctx, "select pg_sleep(10)")
	took := time.Since(start)
	if !errors.Is(err, pgxlanes.ErrBudgetExceeded) || sqlState(err) != "57014" {
		t.Fatalf("pg_sleep: %v, want ErrBudgetExceeded wrapping SQLSTATE 57014", err)
	}
	t.Logf("cancelled after %s (budget 300ms)", took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Fatalf("cancel took %s", took)
	}
	if _, err := tx.Exec(ctx, "select 1"); !errors.Is(err, pgxlanes.ErrBudgetExceeded) {
		t.Fatalf("next statement: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lanesIdle(t, p, "after rollback")
	// The same connection serves the next transaction, after the socket deadline the guard set
	// as a backstop would have expired had release not taken it back.
	time.Sleep(400 * time.Millisecond)
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if got := tx.Conn().PgConn().PID(); got != pid {
			t.Errorf("next transaction on backend %d, want the cancelled one's %d", got, pid)
		}
		_, err := tx.Exec(ctx, "select 1")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := p.Stat().NewConnsCount(); n != 1 {
		t.Fatalf("%d connections opened, want 1", n)
	}
}

// TestShortBudgetCancels: the client-side bound of a short statement is the guard's budget. With
// the server's statement_timeout off, a runaway statement is cancelled at the budget, and its
// connection is kept.
func TestShortBudgetCancels(t *testing.T) {
	ctx := context.Background()
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=2&lane_short_statement_timeout=0&lane_short_budget=300ms", nil)
	if err := p.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := p.Exec(ctx, "select pg_sleep(10)")
	took := time.Since(start)
	if !errors.Is(err, pgxlanes.ErrBudgetExceeded) || sqlState(err) != "57014" || took > 3*time.Second {
		t.Fatalf("after %s: %v, want ErrBudgetExceeded wrapping 57014 at about 300ms", took, err)
	}
	// The caller got control back at once; the connection is cleaned in the background, its
	// slot held meanwhile, and then kept.
	lanesIdle(t, p, "after the cancelled statement")
	if err := p.QueryRow(ctx, "select 1").Scan(new(int)); err != nil {
		t.Fatal(err)
	}
	// Rows report the cancel only when read: Rows.Err carries the budget error too.
	rows, err := p.Query(ctx, "select 1 from pg_sleep(10)")
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	took = time.Since(start)
	var be *pgxlanes.BudgetError
	if !errors.As(err, &be) || be.Lane != pgxlanes.Short || sqlState(err) != "57014" || took > 3*time.Second {
		t.Fatalf("rows after %s: %v, want a Short-lane BudgetError wrapping 57014 at about 300ms", took, err)
	}
	lanesIdle(t, p, "after the cancelled rows")
	// And so do a batch's results.
	b := &pgx.Batch{}
	b.Queue("select pg_sleep(10)")
	if err := p.SendBatch(ctx, b).Close(); !errors.As(err, &be) || sqlState(err) != "57014" {
		t.Fatalf("batch: %v, want a BudgetError wrapping 57014", err)
	}
	lanesIdle(t, p, "after the cancelled batch")
	if n := p.Stat().NewConnsCount(); n != 1 {
		t.Fatalf("%d connections opened, want the one", n)
	}
}

// TestCancelRowsOfTx: rows of a transaction's query that the guard cancels report the budget
// error from Rows.Err; the rollback frees the lane.
func TestCancelRowsOfTx(t *testing.T) {
	ctx := context.Background()
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=2&lane_tx_budget=300ms&lane_tx_over_budget=cancel",
		func(c *pgxlanes.Config) { c.CancelGrace = 200 * time.Millisecond })
	tx, err := p.Begin(pgxlanes.WithTag(ctx, "export"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "select 1 from pg_sleep(10)")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	took := time.Since(start)
	var be *pgxlanes.BudgetError
	if !errors.As(err, &be) || be.Tag != "export" || sqlState(err) != "57014" || took > 3*time.Second {
		t.Fatalf("rows after %s: %v, want a BudgetError (tag export) wrapping 57014", took, err)
	}
	if err := rows.Err(); !errors.Is(err, pgxlanes.ErrBudgetExceeded) {
		t.Fatalf("Rows.Err again: %v", err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgxlanes.ErrBudgetExceeded) {
		t.Fatalf("Commit: %v, want ErrBudgetExceeded", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lanesIdle(t, p, "after the cancelled transaction")
}

// TestFlagOnly: with flag, the work goes on; exactly one warning names the call site, and a
// "returned" line follows when the transaction ends.
func TestFlagOnly(t *testing.T) {
	ctx := context.Background()
	p, logs := newGuardedPool(t, newDB(t, 10), "pool_max_conns=2&lane_tx_budget=200ms&lane_tx_over_budget=flag",
		func(c *pgxlanes.Config) { c.CaptureCallSites = true })
	tx, err := p.Begin(pgxlanes.WithTag(ctx, "slow-report"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if _, err := tx.Exec(ctx, "update items set v = 42 where id = 3"); err != nil {
		t.Fatalf("flag must not stop the work: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	recs := logs.records(t)
	var warns, returned []map[string]any
	for _, r := range recs {
		switch r["msg"] {
		case "pgxlanes: lease over budget":
			warns = append(warns, r)
		case "pgxlanes: flagged lease returned":
			returned = append(returned, r)
		}
	}
	if len(warns) != 1 || len(returned) != 1 {
		t.Fatalf("logs %v: want one warning and one returned line", recs)
	}
	w := warns[0]
	cs, _ := w["call_site"].(string)
	if w["lane"] != "tx" || w["tag"] != "slow-report" || w["action"] != "flag" || !strings.Contains(cs, "budget_test.go") || w["pid"] == nil {
		t.Fatalf("warning %v", w)
	}
	if !strings.Contains(returned[0]["call_site"].(string), "budget_test.go") {
		t.Fatalf("returned line %v", returned[0])
	}
	t.Logf("warning: %v", w)
}

// TestBudgetLogLinesSayWhatHappened: on a cancel or terminate lane, the half-budget warning says
// that it is a warning and what the lane does at the budget, and a lease that was cancelled or
// terminated is not logged as a flagged lease returned.
func TestBudgetLogLinesSayWhatHappened(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 1)
	for _, action := range []string{"cancel", "terminate"} {
		p, logs := newGuardedPool(t, dsn, "pool_max_conns=2&lane_tx_budget=200ms&lane_tx_over_budget="+action, nil)
		tx, err := p.Begin(ctx)
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
		_, err = tx.Exec(ctx, "select 1")
		require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
		require.NoError(t, tx.Rollback(ctx))
		lanesIdle(t, p, "after the "+action)
		var lines []string
		pgserver.Eventually(t, 5*time.Second, "the "+action+" logged", func() bool {
			lines = lines[:0]
			done := false
			for _, r := range logs.records(t) {
				line := fmt.Sprintf("%v action=%v at_budget=%v", r["msg"], r["action"], r["at_budget"])
				lines = append(lines, line)
				done = done || r["msg"] == "pgxlanes: lease over budget"
			}
			return done
		})
		assert.Equal(t, []string{
			"pgxlanes: lease past half its budget action=warn at_budget=" + action,
			"pgxlanes: lease over budget action=" + action + " at_budget=<nil>",
		}, lines, action)
	}
}

// TestLeakedConnectionFlagged: a connection from Acquire never released is flagged as a leak with
// the call site that acquired it.
func TestLeakedConnectionFlagged(t *testing.T) {
	ctx := context.Background()
	p, logs := newGuardedPool(t, newDB(t, 10), "pool_max_conns=2&lane_tx_budget=200ms&lane_tx_over_budget=flag",
		func(c *pgxlanes.Config) { c.CaptureCallSites = true })
	c, err := p.Acquire(ctx) // "forgotten"
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var found map[string]any
		for _, r := range logs.records(t) {
			if r["msg"] == "pgxlanes: lease over budget" {
				found = r
			}
		}
		if found != nil {
			if cs, _ := found["call_site"].(string); !strings.Contains(cs, "TestLeakedConnectionFlagged") {
				t.Fatalf("leak warning without the acquiring call site: %v", found)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("leaked connection never flagged")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Release()
}

// TestTerminateWhenEveryLaneIsFull: the guard's connection lives outside the lanes, so it can
// terminate transactions when no lane has a connection left.
func TestTerminateWhenEveryLaneIsFull(t *testing.T) {
	ctx := context.Background()
	// 3 connections: short reserves 1, tx may hold 2.
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=3&lane_tx_budget=800ms&lane_tx_over_budget=terminate&lane_short_statement_timeout=10s&lane_short_budget=1m", nil)
	var txs []pgx.Tx
	for i := range 2 {
		tx, err := p.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "select v from items where id = $1 for update", i+1); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	shortDone := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, "select pg_sleep(3)") // the last connection
		shortDone <- err
	}()
	for p.Stat().AcquiredConns() != 3 {
		time.Sleep(5 * time.Millisecond)
	}
	// Every connection is taken; a new transaction waits, and gets one once the guard frees it.
	start := time.Now()
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatalf("Begin while the guard frees the lane: %v", err)
	}
	t.Logf("a new transaction got a connection after %s (budget 800ms)", time.Since(start).Round(time.Millisecond))
	_ = tx.Rollback(ctx)
	for i, tx := range txs {
		// The second transaction began a little after the first: its budget may be due a moment
		// after the new transaction got the first one's connection.
		var err error
		pgserver.Eventually(t, 5*time.Second, "transaction terminated", func() bool {
			_, err = tx.Exec(ctx, "select 1")
			return err != nil
		})
		if !errors.Is(err, pgxlanes.ErrBudgetExceeded) {
			t.Fatalf("terminated transaction %d: %v", i, err)
		}
		_ = tx.Rollback(ctx)
	}
	if err := <-shortDone; err != nil {
		t.Fatal(err)
	}
	lanesIdle(t, p, "at the end")
}

// TestGuardRacesNormalEnd: transactions end at about the instant the guard terminates them. Each
// ends one way or the other, with the right error, never a double release (which panics) or a
// leaked slot. Run under -race.
func TestGuardRacesNormalEnd(t *testing.T) {
	ctx := context.Background()
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=4&lane_tx_budget=40ms&lane_tx_over_budget=terminate", nil)
	var committed, terminated atomic.Int64
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				tx, err := p.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(30*time.Millisecond + time.Duration((g*7+i*3)%20)*time.Millisecond)
				// The guard stores its verdict before it asks the server to terminate, so an error
				// caused by the termination is always reported as a budget error.
				switch err = tx.Commit(ctx); {
				case err == nil:
					committed.Add(1)
				case errors.Is(err, pgxlanes.ErrBudgetExceeded):
					terminated.Add(1)
				default:
					t.Errorf("commit: %v", err)
				}
				_ = tx.Rollback(ctx)
			}
		}()
	}
	wg.Wait()
	t.Logf("committed %d, terminated %d", committed.Load(), terminated.Load())
	if committed.Load()+terminated.Load() != 45 {
		t.Fatalf("%d outcomes for 45 transactions", committed.Load()+terminated.Load())
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Stat().AcquiredConns() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	lanesIdle(t, p, "after the race")
	if err := p.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLockTimeoutNamesHolder: when a short statement gives up on a row lock, the pool logs the
// likely holder, naming its lane, tag and call site when it is one of the pool's own leases.
func TestLockTimeoutNamesHolder(t *testing.T) {
	ctx := context.Background()
	p, logs := newGuardedPool(t, newDB(t, 10), "pool_max_conns=4&lane_short_lock_timeout=100ms",
		func(c *pgxlanes.Config) { c.CaptureCallSites = true })
	tx, err := p.Begin(pgxlanes.WithTag(ctx, "checkout"))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "select v from items where id = 1 for update"); err != nil {
		t.Fatal(err)
	}
	holderPID := tx.Conn().PgConn().PID()
	if _, err := p.Exec(ctx, "update items set v = 0 where id = 1"); sqlState(err) != "55P03" {
		t.Fatalf("update: %v, want a lock timeout", err)
	}
	var rec map[string]any
	pgserver.Eventually(t, 5*time.Second, "a lock-holder log line", func() bool {
		for _, r := range logs.records(t) {
			if r["msg"] == "pgxlanes: lock timeout; likely holders" {
				rec = r
				return true
			}
		}
		return false
	})
	h, _ := rec["holder1"].(map[string]any)
	cs, _ := h["call_site"].(string)
	if h == nil || h["lane"] != "tx" || h["tag"] != "checkout" || uint32(h["pid"].(float64)) != holderPID ||
		!strings.Contains(cs, "TestLockTimeoutNamesHolder") || !strings.Contains(h["tables"].(string), "items") {
		t.Fatalf("log %v: want holder1 = the checkout transaction", rec)
	}
	t.Logf("%v", rec)
	// Rate-limited: a second timeout within a second logs nothing more.
	if _, err := p.Exec(ctx, "update items set v = 0 where id = 1"); sqlState(err) != "55P03" {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	n := 0
	for _, r := range logs.records(t) {
		if r["msg"] == "pgxlanes: lock timeout; likely holders" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d lock-holder lines, want 1 (rate-limited)", n)
	}
}

// TestLockTimeoutNamesShortHolder: a lock held by one of the pool's own Short statements is named
// as the Short lane's, and one held by another client as "not this pool".
func TestLockTimeoutNamesShortHolder(t *testing.T) {
	ctx := context.Background()
	dsn := newDB(t, 10)
	for _, who := range []string{"short", "not this pool"} {
		p, logs := newGuardedPool(t, dsn, "pool_max_conns=4&lane_tx_lock_timeout=100ms", nil)
		var holder uint32
		done := make(chan error, 1)
		if who == "short" {
			go func() {
				_, err := p.Exec(ctx, "with u as (update items set v = v where id = 1 returning 1) select pg_sleep(1.5) from u")
				done <- err
			}()
		} else {
			other := adminConn(t, dsn)
			tx, err := other.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "update items set v = v where id = 1")
			require.NoError(t, err)
			holder = other.PgConn().PID()
			go func() {
				time.Sleep(1500 * time.Millisecond)
				done <- tx.Rollback(ctx)
			}()
		}
		time.Sleep(300 * time.Millisecond)
		tx, err := p.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "update items set v = 0 where id = 1")
		require.Equal(t, "55P03", sqlState(err), "%v", err)
		_ = tx.Rollback(ctx)
		var rec map[string]any
		pgserver.Eventually(t, 5*time.Second, "a lock-holder log line", func() bool {
			for _, r := range logs.records(t) {
				if r["msg"] == "pgxlanes: lock timeout; likely holders" {
					rec = r
					return true
				}
			}
			return false
		})
		h, _ := rec["holder1"].(map[string]any)
		require.NotNil(t, h, "%v", rec)
		assert.Equal(t, who, h["lane"], "%v", rec)
		if holder != 0 {
			assert.EqualValues(t, holder, h["pid"])
		}
		require.NoError(t, <-done)
	}
}

// TestLockTimeoutBlamedOnEveryPath: the lock-holder line is written whichever call met the lock
// timeout: the rows of a pool query (where the error only shows when they are read), a
// transaction's statement, rows and row, and a batch sent by the pool, a transaction or on a held
// connection.
func TestLockTimeoutBlamedOnEveryPath(t *testing.T) {
	ctx := context.Background()
	p, logs := newGuardedPool(t, newDB(t, 10), "pool_max_conns=6&lane_short_lock_timeout=100ms&lane_tx_lock_timeout=100ms", nil)
	holder, err := p.Begin(pgxlanes.WithTag(ctx, "checkout"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, "select v from items where id = 1 for update"); err != nil {
		t.Fatal(err)
	}
	const lockSQL = "select v from items where id = 1 for update"
	lockBatch := func() *pgx.Batch {
		b := &pgx.Batch{}
		b.Queue(lockSQL)
		return b
	}
	paths := []struct {
		tag string
		run func(ctx context.Context) error
	}{
		{"pool-rows", func(ctx context.Context) error {
			rows, _ := p.Query(ctx, lockSQL)
			_, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			return err
		}},
		{"tx-exec", func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, lockSQL)
				return err
			})
		}},
		{"tx-rows", func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
				rows, _ := tx.Query(ctx, lockSQL)
				_, err := pgx.CollectRows(rows, pgx.RowTo[int32])
				return err
			})
		}},
		{"tx-row", func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
				return tx.QueryRow(ctx, lockSQL).Scan(new(int32))
			})
		}},
		{"batch", func(ctx context.Context) error {
			return p.SendBatch(ctx, lockBatch()).Close()
		}},
		{"tx-batch", func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error { return tx.SendBatch(ctx, lockBatch()).Close() })
		}},
		{"conn-batch", func(ctx context.Context) error {
			return p.AcquireFunc(ctx, func(c *pgxlanes.Conn) error { return c.SendBatch(ctx, lockBatch()).Close() })
		}},
	}
	for i, path := range paths {
		if i > 0 {
			time.Sleep(1100 * time.Millisecond) // the lookup is rate-limited to one a second
		}
		if err := path.run(pgxlanes.WithTag(ctx, path.tag)); sqlState(err) != "55P03" {
			t.Fatalf("%s: %v, want a lock timeout", path.tag, err)
		}
		pgserver.Eventually(t, 5*time.Second, path.tag+": a lock-holder line", func() bool {
			for _, r := range logs.records(t) {
				if r["msg"] != "pgxlanes: lock timeout; likely holders" || r["tag"] != path.tag {
					continue
				}
				h, _ := r["holder1"].(map[string]any)
				if h == nil || h["tag"] != "checkout" {
					t.Fatalf("%s: log %v, want holder1 = the checkout transaction", path.tag, r)
				}
				return true
			}
			return false
		})
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lanesIdle(t, p, "after the lock timeouts")
}
