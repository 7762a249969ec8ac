package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pgxlanes/pgxlanes/integration/harness"
	"github.com/pgxlanes/pgxlanes/metrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

func TestMain(m *testing.M) { harness.Main(m) }

// TestAcquireTimeouts holds the Long lane's only connection, makes n more Long acquires time out,
// and checks the counters, the wait histogram and the in-use gauges.
func TestAcquireTimeouts(t *testing.T) {
	t.Parallel()
	pool := newPool(t, harness.NewDatabase(t), "pool_max_conns=2", "lane_long_max_conns=1", "lane_long_acquire_timeout=50ms")
	reg := registry(t, metrics.NewCollector(pool))
	long := pgxlanes.WithLane(ctxTimeout(t, time.Minute), pgxlanes.Long)

	held, err := pool.Acquire(long)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	start := time.Now()
	const n = 5
	for range n {
		c, err := pool.Acquire(long)
		if !errors.Is(err, pgxlanes.ErrAcquireTimeout) {
			if c != nil {
				c.Release()
			}
			t.Fatalf("acquire on a full Long lane: err = %v, want ErrAcquireTimeout", err)
		}
	}

	if got := value(t, reg, "pgxlanes_acquire_timeouts_total", lane(pgxlanes.Long)); got != n {
		t.Errorf("timeouts{lane=long} = %v, want %d", got, n)
	}
	if got := value(t, reg, "pgxlanes_acquires_total", lane(pgxlanes.Long)); got != 1 {
		t.Errorf("acquires{lane=long} = %v, want 1", got)
	}
	count, sum := histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Long))
	if count != n+1 {
		t.Errorf("acquire wait{lane=long}: %d samples, want %d (1 acquire + %d timeouts)", count, n+1, n)
	}
	if min := n * 0.050; sum < min {
		t.Errorf("acquire wait{lane=long}: sum %.3fs, want at least %.3fs (%d timeouts of 50ms)", sum, min, n)
	}
	if got := value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Long)); got != 1 {
		t.Errorf("in use{lane=long} = %v, want 1", got)
	}
	if got := value(t, reg, "pgxlanes_pool_acquired_connections", nil); got != 1 {
		t.Errorf("pool acquired = %v, want 1", got)
	}
	for _, l := range []pgxlanes.Lane{pgxlanes.Short, pgxlanes.Tx} {
		if got := value(t, reg, "pgxlanes_acquire_timeouts_total", lane(l)); got != 0 {
			t.Errorf("timeouts{lane=%s} = %v, want 0", l, got)
		}
	}

	heldFor := time.Since(start) // a lower bound: the lease began before start and ends in Release
	held.Release()
	count, sum = histogram(t, reg, "pgxlanes_hold_seconds", lane(pgxlanes.Long))
	if count != 1 || sum < heldFor.Seconds() {
		t.Errorf("hold{lane=long}: count %d sum %.3fs, want 1 and at least %.3fs", count, sum, heldFor.Seconds())
	}
	if got := value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Long)); got != 0 {
		t.Errorf("in use{lane=long} after release = %v, want 0", got)
	}
}

// TestQueueFigures puts a caller in the Long lane's queue and checks the waiters and oldest-wait
// gauges, then a rejection (the queue holds one) and the waiter's cancellation.
func TestQueueFigures(t *testing.T) {
	t.Parallel()
	pool := newPool(t, harness.NewDatabase(t), "pool_max_conns=2", "lane_long_max_conns=1",
		"lane_long_acquire_timeout=20s", "lane_long_max_waiters=1")
	reg := registry(t, metrics.NewCollector(pool))
	ctx := ctxTimeout(t, time.Minute)
	long := pgxlanes.WithLane(ctx, pgxlanes.Long)

	held, err := pool.Acquire(long)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()

	waitCtx, cancelWait := context.WithCancel(long)
	defer cancelWait()
	waited := make(chan error, 1)
	go func() {
		c, err := pool.Acquire(waitCtx)
		if c != nil {
			c.Release()
		}
		waited <- err
	}()
	harness.Eventually(t, 10*time.Second, "the waiter never queued", func() bool { return pool.Stat().Lane(pgxlanes.Long).Waiting == 1 })
	const age = 30 * time.Millisecond
	time.Sleep(age) // let the waiter age

	if got := value(t, reg, "pgxlanes_lane_waiters", lane(pgxlanes.Long)); got != 1 {
		t.Errorf("waiters{lane=long} = %v, want 1", got)
	}
	if got := value(t, reg, "pgxlanes_lane_oldest_wait_seconds", lane(pgxlanes.Long)); got < age.Seconds() || got > 20 {
		t.Errorf("oldest wait{lane=long} = %vs, want between %v and 20s", got, age.Seconds())
	}
	if got := value(t, reg, "pgxlanes_lane_waiters", lane(pgxlanes.Short)); got != 0 {
		t.Errorf("waiters{lane=short} = %v, want 0", got)
	}

	if c, err := pool.Acquire(long); !errors.Is(err, pgxlanes.ErrLaneFull) {
		if c != nil {
			c.Release()
		}
		t.Fatalf("acquire beyond a full queue: err = %v, want ErrLaneFull", err)
	}
	if got := value(t, reg, "pgxlanes_acquire_rejections_total", lane(pgxlanes.Long)); got != 1 {
		t.Errorf("rejections{lane=long} = %v, want 1", got)
	}

	cancelWait()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: err = %v, want context.Canceled", err)
	}
	if got := value(t, reg, "pgxlanes_acquire_cancellations_total", lane(pgxlanes.Long)); got != 1 {
		t.Errorf("cancellations{lane=long} = %v, want 1", got)
	}
	if got := value(t, reg, "pgxlanes_lane_waiters", lane(pgxlanes.Long)); got != 0 {
		t.Errorf("waiters{lane=long} after the cancel = %v, want 0", got)
	}
	if got := value(t, reg, "pgxlanes_lane_oldest_wait_seconds", lane(pgxlanes.Long)); got != 0 {
		t.Errorf("oldest wait{lane=long} with nobody waiting = %v, want 0", got)
	}
	if count, _ := histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Long)); count != 3 {
		t.Errorf("acquire wait{lane=long}: %d samples, want 3 (acquire, rejection, cancel)", count)
	}
}

// TestWorkload runs queries, transactions and tagged calls, then checks the counts per lane and
// tag, the pool figures, and that the result passes the linter and a pedantic registry.
func TestWorkload(t *testing.T) {
	t.Parallel()
	pool := newPool(t, harness.NewDatabase(t), "pool_max_conns=4")
	c := metrics.NewCollector(pool, metrics.WithTags("checkout"), metrics.WithPoolName("orders"))
	reg := registry(t, c)
	ctx := ctxTimeout(t, time.Minute)

	const queries, txs = 20, 4
	for i := range queries {
		qctx := ctx
		if i%2 == 0 {
			qctx = pgxlanes.WithTag(ctx, "checkout")
		}
		var n int
		if err := pool.QueryRow(qctx, "select $1::int", i).Scan(&n); err != nil || n != i {
			t.Fatalf("query %d: %v (got %d)", i, err, n)
		}
	}
	for range txs {
		tx, err := pool.Begin(pgxlanes.WithTag(ctx, "user-1234"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "select pg_sleep(0.002)"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}

	short := func(tag string) map[string]string { return map[string]string{"lane": "short", "tag": tag} }
	for _, tc := range []struct {
		labels map[string]string
		want   uint64
	}{
		{short("checkout"), queries / 2},
		{short("none"), queries / 2},
		{map[string]string{"lane": "tx", "tag": "other"}, txs},
		{map[string]string{"lane": "tx", "tag": "checkout"}, 0},
		{map[string]string{"lane": "long", "tag": "none"}, 0},
	} {
		if got := value(t, reg, "pgxlanes_acquires_total", tc.labels); got != float64(tc.want) {
			t.Errorf("acquires%v = %v, want %d", tc.labels, got, tc.want)
		}
		if n, _ := histogram(t, reg, "pgxlanes_acquire_wait_seconds", tc.labels); n != tc.want {
			t.Errorf("acquire wait%v: %d samples, want %d", tc.labels, n, tc.want)
		}
		if n, _ := histogram(t, reg, "pgxlanes_hold_seconds", tc.labels); n != tc.want {
			t.Errorf("hold%v: %d samples, want %d", tc.labels, n, tc.want)
		}
	}
	if _, sum := histogram(t, reg, "pgxlanes_hold_seconds", map[string]string{"lane": "tx", "tag": "other"}); sum < txs*0.002 {
		t.Errorf("hold{tx,other}: sum %.4fs, want at least %.4fs (each transaction sleeps 2ms)", sum, txs*0.002)
	}
	for _, l := range pgxlanes.Lanes() {
		if got := value(t, reg, "pgxlanes_lane_in_use_connections", lane(l)); got != 0 {
			t.Errorf("in use{lane=%s} when idle = %v, want 0", l, got)
		}
	}
	open := value(t, reg, "pgxlanes_pool_open_connections", nil)
	if open < 1 || open > 4 {
		t.Errorf("open connections = %v, want 1 to 4", open)
	}
	if idle := value(t, reg, "pgxlanes_pool_idle_connections", nil); idle != open {
		t.Errorf("idle connections = %v, want all %v open ones", idle, open)
	}
	if got := value(t, reg, "pgxlanes_pool_new_connections_total", nil); got != open {
		t.Errorf("new connections = %v, want %v (none closed yet)", got, open)
	}
	if got := value(t, reg, "pgxlanes_pool_acquired_connections", nil); got != 0 {
		t.Errorf("acquired connections = %v, want 0", got)
	}

	// Two held connections on Short, whose reserve is one: one of them is borrowed.
	shortCtx := pgxlanes.WithLane(ctx, pgxlanes.Short)
	for range 2 {
		conn, err := pool.Acquire(shortCtx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
	}
	for name, want := range map[string]float64{
		"pgxlanes_lane_in_use_connections":   2,
		"pgxlanes_lane_borrowed_connections": 1,
		"pgxlanes_lane_reserved_connections": 1,
	} {
		if got := value(t, reg, name, lane(pgxlanes.Short)); got != want {
			t.Errorf("%s{lane=short} with two held = %v, want %v", name, got, want)
		}
	}
	if got := value(t, reg, "pgxlanes_pool_acquired_connections", nil); got != 2 {
		t.Errorf("acquired connections with two held = %v, want 2", got)
	}

	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestBudgetViolations lets a transaction outlive the budget of a terminate lane and a held
// connection outlive that of a flag lane, and checks the warnings and violations the guard
// reports.
func TestBudgetViolations(t *testing.T) {
	t.Parallel()
	pool := newPool(t, harness.NewDatabase(t), "pool_max_conns=4",
		"lane_tx_budget=300ms", "lane_tx_over_budget=terminate",
		"lane_long_budget=100ms", "lane_long_over_budget=flag")
	reg := registry(t, metrics.NewCollector(pool))
	ctx := ctxTimeout(t, time.Minute)
	violations := func(l pgxlanes.Lane, a pgxlanes.Action) float64 {
		return value(t, reg, "pgxlanes_budget_violations_total", map[string]string{"lane": l.String(), "action": a.String()})
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	conn, err := pool.Acquire(pgxlanes.WithLane(ctx, pgxlanes.Long))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	harness.Eventually(t, 10*time.Second, "no terminate violation on the tx lane", func() bool {
		return violations(pgxlanes.Tx, pgxlanes.ActionTerminate) == 1
	})
	harness.Eventually(t, 10*time.Second, "no flag violation on the long lane", func() bool {
		return violations(pgxlanes.Long, pgxlanes.ActionFlag) == 1
	})

	if got := value(t, reg, "pgxlanes_budget_warnings_total", lane(pgxlanes.Tx)); got != 1 {
		t.Errorf("warnings{lane=tx} = %v, want 1 (at half the budget, before the termination)", got)
	}
	if got := value(t, reg, "pgxlanes_budget_warnings_total", lane(pgxlanes.Long)); got != 0 {
		t.Errorf("warnings{lane=long} = %v, want 0 (a flag lane only flags, at its budget)", got)
	}
	for _, a := range []pgxlanes.Action{pgxlanes.ActionFlag, pgxlanes.ActionCancel} {
		if got := violations(pgxlanes.Tx, a); got != 0 {
			t.Errorf("violations{lane=tx,action=%s} = %v, want 0", a, got)
		}
	}
	// The termination freed the transaction's slot at once; the flagged connection keeps its own.
	if got := value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Tx)); got != 0 {
		t.Errorf("in use{lane=tx} after the termination = %v, want 0", got)
	}
	if n, sum := histogram(t, reg, "pgxlanes_hold_seconds", lane(pgxlanes.Tx)); n != 1 || sum < 0.3 {
		t.Errorf("hold{lane=tx}: count %d sum %.3fs, want 1 lease held at least 300ms", n, sum)
	}
	if got := value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Long)); got != 1 {
		t.Errorf("in use{lane=long} while flagged = %v, want 1", got)
	}
	if _, err := tx.Exec(ctx, "select 1"); !errors.Is(err, pgxlanes.ErrBudgetExceeded) {
		t.Errorf("the terminated transaction's next call: err = %v, want ErrBudgetExceeded", err)
	}
	if _, err := conn.Exec(ctx, "select 1"); err != nil {
		t.Errorf("the flagged connection: %v, want it still usable", err)
	}
	conn.Release()
	_ = tx.Rollback(ctx)
	if n, _ := histogram(t, reg, "pgxlanes_hold_seconds", lane(pgxlanes.Tx)); n != 1 {
		t.Errorf("hold{lane=tx} after Rollback: count %d, want still 1 (the termination ended the lease)", n)
	}
}
