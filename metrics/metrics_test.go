package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/internal/promtest"
	"github.com/pgxlanes/pgxlanes/metrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

// warm opens n connections at once and releases them, so that later acquires find them idle and
// do not dial within a short acquire timeout.
func warm(t *testing.T, pool *pgxlanes.Pool, n int) {
	t.Helper()
	ctx := ctxTimeout(t, 30*time.Second)
	var conns []*pgxlanes.Conn
	for range n {
		c, err := pool.Acquire(pgxlanes.WithLane(ctx, pgxlanes.Short))
		require.NoError(t, err, "warming the pool")
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// TestAcquireTimeouts holds the Long lane's only connection, makes n more Long acquires time out,
// and checks the counters, the wait histogram and the in-use gauges.
func TestAcquireTimeouts(t *testing.T) {
	t.Parallel()
	pool := newPool(t, pgserver.NewDatabase(t), "pool_max_conns=2", "lane_long_max_conns=1", "lane_long_acquire_timeout=50ms")
	// The first Long acquire must not have to dial within its 50ms acquire timeout.
	warm(t, pool, 1)
	reg := registry(t, metrics.NewCollector(pool))
	long := pgxlanes.WithLane(ctxTimeout(t, time.Minute), pgxlanes.Long)

	held, err := pool.Acquire(long)
	require.NoError(t, err)
	defer held.Release()
	start := time.Now()
	const n = 5
	for range n {
		c, err := pool.Acquire(long)
		if c != nil {
			c.Release()
		}
		require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout, "acquire on a full Long lane")
	}

	assert.Equal(t, float64(n), value(t, reg, "pgxlanes_acquire_timeouts_total", lane(pgxlanes.Long)))
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_acquires_total", lane(pgxlanes.Long)))
	count, sum := histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Long))
	assert.Equal(t, uint64(n+1), count, "acquire wait{lane=long}: 1 acquire + %d timeouts", n)
	assert.GreaterOrEqual(t, sum, n*0.050, "acquire wait{lane=long}: %d timeouts of 50ms", n)
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Long)))
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_pool_acquired_connections", nil))
	want := `
# HELP pgxlanes_acquire_timeouts_total Acquires that failed because the lane's acquire timeout ran out (ErrAcquireTimeout).
# TYPE pgxlanes_acquire_timeouts_total counter
pgxlanes_acquire_timeouts_total{lane="long",pool="default"} 5
pgxlanes_acquire_timeouts_total{lane="short",pool="default"} 0
pgxlanes_acquire_timeouts_total{lane="tx",pool="default"} 0
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "pgxlanes_acquire_timeouts_total"))

	heldFor := time.Since(start) // a lower bound: the lease began before start and ends in Release
	held.Release()
	count, sum = histogram(t, reg, "pgxlanes_hold_seconds", lane(pgxlanes.Long))
	assert.Equal(t, uint64(1), count, "hold{lane=long}")
	assert.GreaterOrEqual(t, sum, heldFor.Seconds(), "hold{lane=long}")
	assert.Equal(t, 0.0, value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Long)), "after release")
}

// TestQueueFigures puts a caller in the Long lane's queue and checks the waiters and oldest-wait
// gauges, then a rejection (the queue holds one) and the waiter's cancellation.
func TestQueueFigures(t *testing.T) {
	t.Parallel()
	pool := newPool(t, pgserver.NewDatabase(t), "pool_max_conns=2", "lane_long_max_conns=1",
		"lane_long_acquire_timeout=20s", "lane_long_max_waiters=1")
	reg := registry(t, metrics.NewCollector(pool))
	long := pgxlanes.WithLane(ctxTimeout(t, time.Minute), pgxlanes.Long)

	held, err := pool.Acquire(long)
	require.NoError(t, err)
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
	pgserver.Eventually(t, 10*time.Second, "the waiter never queued", func() bool { return pool.Stat().Lane(pgxlanes.Long).Waiting == 1 })
	const age = 30 * time.Millisecond
	time.Sleep(age) // let the waiter age: the gauge reads the real clock

	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_lane_waiters", lane(pgxlanes.Long)))
	oldest := value(t, reg, "pgxlanes_lane_oldest_wait_seconds", lane(pgxlanes.Long))
	assert.True(t, oldest >= age.Seconds() && oldest <= 20, "oldest wait{lane=long} = %vs, want between %v and 20s", oldest, age.Seconds())
	assert.Equal(t, 0.0, value(t, reg, "pgxlanes_lane_waiters", lane(pgxlanes.Short)))

	c, err := pool.Acquire(long)
	if c != nil {
		c.Release()
	}
	require.ErrorIs(t, err, pgxlanes.ErrLaneFull, "acquire beyond a full queue")
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_acquire_rejections_total", lane(pgxlanes.Long)))

	cancelWait()
	require.ErrorIs(t, <-waited, context.Canceled, "cancelled waiter")
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_acquire_cancellations_total", lane(pgxlanes.Long)))
	assert.Equal(t, 0.0, value(t, reg, "pgxlanes_lane_waiters", lane(pgxlanes.Long)), "after the cancel")
	assert.Equal(t, 0.0, value(t, reg, "pgxlanes_lane_oldest_wait_seconds", lane(pgxlanes.Long)), "with nobody waiting")
	count, _ := histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Long))
	assert.Equal(t, uint64(3), count, "acquire wait{lane=long}: acquire, rejection, cancel")
}

// TestWorkload runs queries, transactions and tagged calls, then checks the counts per lane, the
// histograms per tag, the pool figures, and that the result passes the linter and a pedantic
// registry.
func TestWorkload(t *testing.T) {
	t.Parallel()
	pool := newPool(t, pgserver.NewDatabase(t), "pool_max_conns=4")
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
		require.NoError(t, pool.QueryRow(qctx, "select $1::int", i).Scan(&n))
		require.Equal(t, i, n)
	}
	for range txs {
		tx, err := pool.Begin(pgxlanes.WithTag(ctx, "user-1234"))
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "select pg_sleep(0.002)")
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}

	// The counters are per lane; the histograms per lane and tag.
	for l, want := range map[pgxlanes.Lane]float64{pgxlanes.Short: queries, pgxlanes.Tx: txs, pgxlanes.Long: 0} {
		assert.Equal(t, want, value(t, reg, "pgxlanes_acquires_total", lane(l)), "acquires{lane=%s}", l)
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
		n, _ := histogram(t, reg, "pgxlanes_acquire_wait_seconds", tc.labels)
		assert.Equal(t, tc.want, n, "acquire wait%v", tc.labels)
		n, _ = histogram(t, reg, "pgxlanes_hold_seconds", tc.labels)
		assert.Equal(t, tc.want, n, "hold%v", tc.labels)
	}
	_, sum := histogram(t, reg, "pgxlanes_hold_seconds", map[string]string{"lane": "tx", "tag": "other"})
	assert.GreaterOrEqual(t, sum, txs*0.002, "hold{tx,other}: each transaction sleeps 2ms")
	for _, l := range pgxlanes.Lanes() {
		assert.Equal(t, 0.0, value(t, reg, "pgxlanes_lane_in_use_connections", lane(l)), "in use{lane=%s} when idle", l)
	}
	open := value(t, reg, "pgxlanes_pool_open_connections", nil)
	assert.True(t, open >= 1 && open <= 4, "open connections = %v, want 1 to 4", open)
	assert.Equal(t, open, value(t, reg, "pgxlanes_pool_idle_connections", nil), "every open connection idle")
	assert.Equal(t, open, value(t, reg, "pgxlanes_pool_new_connections_total", nil), "none closed yet")
	assert.Equal(t, 0.0, value(t, reg, "pgxlanes_pool_acquired_connections", nil))

	// Two held connections on Short, whose reserve is one: one of them is borrowed.
	shortCtx := pgxlanes.WithLane(ctx, pgxlanes.Short)
	for range 2 {
		conn, err := pool.Acquire(shortCtx)
		require.NoError(t, err)
		defer conn.Release()
	}
	for name, want := range map[string]float64{
		"pgxlanes_lane_in_use_connections":   2,
		"pgxlanes_lane_borrowed_connections": 1,
		"pgxlanes_lane_reserved_connections": 1,
	} {
		assert.Equal(t, want, value(t, reg, name, lane(pgxlanes.Short)), "%s{lane=short} with two held", name)
	}
	assert.Equal(t, 2.0, value(t, reg, "pgxlanes_pool_acquired_connections", nil), "with two held")

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems, "lint")
}

// statCounters maps each counter the collector exports per lane to the LaneStat field it must
// equal. It is written here independently of the collector, so that a counter wired to the wrong
// field fails TestCountersEqualStat.
var statCounters = map[string]func(pgxlanes.LaneStat) float64{
	"pgxlanes_acquires_total":                  func(s pgxlanes.LaneStat) float64 { return float64(s.Acquires) },
	"pgxlanes_acquires_queued_total":           func(s pgxlanes.LaneStat) float64 { return float64(s.EmptyAcquires) },
	"pgxlanes_acquires_wait_seconds_total":     func(s pgxlanes.LaneStat) float64 { return s.AcquireWait.Seconds() },
	"pgxlanes_acquire_timeouts_total":          func(s pgxlanes.LaneStat) float64 { return float64(s.Timeouts) },
	"pgxlanes_acquire_rejections_total":        func(s pgxlanes.LaneStat) float64 { return float64(s.Rejections) },
	"pgxlanes_acquire_cancellations_total":     func(s pgxlanes.LaneStat) float64 { return float64(s.Canceled) },
	"pgxlanes_acquire_errors_total":            func(s pgxlanes.LaneStat) float64 { return float64(s.Errors) },
	"pgxlanes_budget_warnings_total":           func(s pgxlanes.LaneStat) float64 { return float64(s.BudgetWarnings) },
	"pgxlanes_budget_terminate_failures_total": func(s pgxlanes.LaneStat) float64 { return float64(s.BudgetTerminateFailures) },
	"pgxlanes_lane_cleaning_connections":       func(s pgxlanes.LaneStat) float64 { return float64(s.Cleaning) },
	"pgxlanes_lane_in_use_connections":         func(s pgxlanes.LaneStat) float64 { return float64(s.InUse) },
	"pgxlanes_lane_waiters":                    func(s pgxlanes.LaneStat) float64 { return float64(s.Waiting) },
}

// violationCounts maps the action label of pgxlanes_budget_violations_total to its LaneStat field.
var violationCounts = map[string]func(pgxlanes.LaneStat) int64{
	"flag":      func(s pgxlanes.LaneStat) int64 { return s.BudgetFlags },
	"cancel":    func(s pgxlanes.LaneStat) int64 { return s.BudgetCancels },
	"terminate": func(s pgxlanes.LaneStat) int64 { return s.BudgetTerminates },
}

// assertEqualsStat checks every per-lane counter and count gauge of g against one Stat snapshot
// of pool, and the learning figures. The pool must be quiet.
func assertEqualsStat(t *testing.T, g prometheus.Gatherer, pool *pgxlanes.Pool) {
	t.Helper()
	fams := promtest.Gather(t, g)
	st := pool.Stat()
	for _, l := range pgxlanes.Lanes() {
		ls := st.Lane(l)
		for name, field := range statCounters {
			assert.Equal(t, field(ls), promtest.Value(t, fams, name, lane(l)), "%s{lane=%s}", name, l)
		}
		for action, field := range violationCounts {
			got := promtest.Value(t, fams, "pgxlanes_budget_violations_total", map[string]string{"lane": l.String(), "action": action})
			assert.Equal(t, float64(field(ls)), got, "violations{lane=%s,action=%s}", l, action)
		}
	}
	learn := st.Learning()
	assert.Equal(t, float64(learn.Demoted), promtest.Value(t, fams, "pgxlanes_learning_demoted_statements", nil))
	assert.Equal(t, float64(learn.Demotions), promtest.Value(t, fams, "pgxlanes_learning_demotions_total", nil))
	assert.Equal(t, float64(learn.Promotions), promtest.Value(t, fams, "pgxlanes_learning_promotions_total", nil))
	assert.Equal(t, float64(learn.Tracked), promtest.Value(t, fams, "pgxlanes_learning_tracked_statements", nil))
	assert.Equal(t, float64(st.NewConnsCount()), promtest.Value(t, fams, "pgxlanes_pool_new_connections_total", nil))
}

// TestCountersEqualStat makes every kind of acquire outcome BEFORE the collector exists, then
// more after it, and checks that the exported counters are Stat's figures (from the pool's
// start) while the histograms count only what they saw.
func TestCountersEqualStat(t *testing.T) {
	t.Parallel()
	proxy := pgserver.NewProxy(t, pgserver.NewDatabase(t))
	pool := newPool(t, proxy.DSN(), "pool_max_conns=4",
		"lane_long_max_conns=1", "lane_long_max_waiters=1", "lane_long_acquire_timeout=20s",
		"lane_tx_max_conns=1", "lane_tx_acquire_timeout=50ms")
	ctx := ctxTimeout(t, time.Minute)
	long := pgxlanes.WithLane(ctx, pgxlanes.Long)

	// An error: the pool cannot open its first connection.
	require.NoError(t, proxy.SetRefuse(true))
	_, err := pool.Exec(ctx, "select 1")
	require.Error(t, err, "a query while the server refuses connections")
	require.NoError(t, proxy.Normal())
	warm(t, pool, 3)

	const queries = 7
	for range queries {
		_, err := pool.Exec(ctx, "select 1")
		require.NoError(t, err)
	}
	// A Tx timeout: the lane's only connection is held.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = pool.Begin(ctx)
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout)
	require.NoError(t, tx.Rollback(ctx))
	// Long: a queued acquire that succeeds, a rejection, a cancelled waiter.
	held, err := pool.Acquire(long)
	require.NoError(t, err)
	waitLong := func(ctx context.Context) <-chan error {
		done := make(chan error, 1)
		go func() {
			c, err := pool.Acquire(ctx)
			if c != nil {
				c.Release()
			}
			done <- err
		}()
		pgserver.Eventually(t, 10*time.Second, "the Long waiter never queued", func() bool { return pool.Stat().Lane(pgxlanes.Long).Waiting == 1 })
		return done
	}
	queued := waitLong(long)
	_, err = pool.Acquire(long)
	require.ErrorIs(t, err, pgxlanes.ErrLaneFull)
	held.Release()
	require.NoError(t, <-queued)
	held, err = pool.Acquire(long)
	require.NoError(t, err)
	cancelCtx, cancel := context.WithCancel(long)
	abandoned := waitLong(cancelCtx)
	cancel()
	require.ErrorIs(t, <-abandoned, context.Canceled)
	held.Release()

	// Only now the collector: its counters still count everything above.
	reg := registry(t, metrics.NewCollector(pool))
	const later = 3
	for range later {
		_, err := pool.Exec(ctx, "select 1")
		require.NoError(t, err)
	}
	assertEqualsStat(t, reg, pool)

	st := pool.Stat()
	short, txl, longl := st.Lane(pgxlanes.Short), st.Lane(pgxlanes.Tx), st.Lane(pgxlanes.Long)
	assert.Equal(t, int64(1), short.Errors, "Short: the refused connection")
	assert.Equal(t, int64(3+queries+later), short.Acquires, "Short: 3 warming acquires and the queries")
	assert.Equal(t, []int64{1, 1}, []int64{txl.Acquires, txl.Timeouts}, "Tx: one transaction, one timeout")
	assert.Equal(t, []int64{3, 1, 1, 1}, []int64{longl.Acquires, longl.EmptyAcquires, longl.Rejections, longl.Canceled},
		"Long: acquires, queued, rejected, cancelled")
	assert.Positive(t, longl.AcquireWait, "Long: the queued acquire waited")
	assert.Equal(t, float64(3), value(t, reg, "pgxlanes_acquires_total", lane(pgxlanes.Long)))

	// The histograms saw only the acquires after NewCollector.
	n, _ := histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Short))
	assert.Equal(t, uint64(later), n, "acquire wait{lane=short}: only the acquires after NewCollector")
	n, _ = histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Long))
	assert.Zero(t, n, "acquire wait{lane=long}: nothing after NewCollector")
}

// TestBudgetFigures lets a transaction outlive the budget of a terminate lane, a held connection
// that of a flag lane and a query that of a cancel lane, and checks the warnings, violations and
// cleaning connections against what happened and against Stat.
func TestBudgetFigures(t *testing.T) {
	t.Parallel()
	pool := newPool(t, pgserver.NewDatabase(t), "pool_max_conns=4",
		"lane_tx_budget=300ms", "lane_tx_over_budget=terminate",
		"lane_long_budget=100ms", "lane_long_over_budget=flag",
		"lane_short_budget=200ms", "lane_short_over_budget=cancel")
	reg := registry(t, metrics.NewCollector(pool))
	ctx := ctxTimeout(t, time.Minute)
	violations := func(l pgxlanes.Lane, a pgxlanes.Action) float64 {
		return value(t, reg, "pgxlanes_budget_violations_total", map[string]string{"lane": l.String(), "action": a.String()})
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	conn, err := pool.Acquire(pgxlanes.WithLane(ctx, pgxlanes.Long))
	require.NoError(t, err)
	defer conn.Release()
	_, err = pool.Exec(ctx, "select pg_sleep(30)")
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded, "a query past Short's budget")

	pgserver.Eventually(t, 10*time.Second, "no terminate violation on the tx lane", func() bool {
		return violations(pgxlanes.Tx, pgxlanes.ActionTerminate) == 1
	})
	pgserver.Eventually(t, 10*time.Second, "no flag violation on the long lane", func() bool {
		return violations(pgxlanes.Long, pgxlanes.ActionFlag) == 1
	})
	pgserver.Eventually(t, 10*time.Second, "the cancelled query's connection is still being cleaned", func() bool {
		return value(t, reg, "pgxlanes_lane_cleaning_connections", lane(pgxlanes.Short)) == 0
	})
	assert.Equal(t, 1.0, violations(pgxlanes.Short, pgxlanes.ActionCancel))
	for l, want := range map[pgxlanes.Lane]float64{pgxlanes.Tx: 1, pgxlanes.Short: 1, pgxlanes.Long: 0} {
		assert.Equal(t, want, value(t, reg, "pgxlanes_budget_warnings_total", lane(l)),
			"warnings{lane=%s}: at half the budget of a cancel or terminate lane only", l)
	}
	for _, a := range []pgxlanes.Action{pgxlanes.ActionFlag, pgxlanes.ActionCancel} {
		assert.Zero(t, violations(pgxlanes.Tx, a), "violations{lane=tx,action=%s}", a)
	}
	assert.Zero(t, value(t, reg, "pgxlanes_budget_terminate_failures_total", lane(pgxlanes.Tx)))
	// The termination freed the transaction's slot at once; the flagged connection keeps its own.
	assert.Zero(t, value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Tx)), "after the termination")
	n, sum := histogram(t, reg, "pgxlanes_hold_seconds", lane(pgxlanes.Tx))
	assert.True(t, n == 1 && sum >= 0.3, "hold{lane=tx}: count %d sum %.3fs, want 1 lease held at least 300ms", n, sum)
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Long)), "while flagged")
	assertEqualsStat(t, reg, pool)

	_, err = tx.Exec(ctx, "select 1")
	assert.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded, "the terminated transaction's next call")
	_, err = conn.Exec(ctx, "select 1")
	assert.NoError(t, err, "the flagged connection is still usable")
}

// TestStuckCleaningAndTerminateFailure cuts the link to the server (a blackhole: the sockets stay
// open, nothing arrives) while a query is interrupted and a transaction is over its budget: the
// query's connection stays in cleaning until Config.CancelGrace, and the termination cannot be
// carried out, so it counts as a failure.
func TestStuckCleaningAndTerminateFailure(t *testing.T) {
	t.Parallel()
	proxy := pgserver.NewProxy(t, pgserver.NewDatabase(t))
	cfg, err := pgxlanes.ParseConfig(withParams(t, proxy.DSN(), "pool_max_conns=4",
		"lane_tx_budget=300ms", "lane_tx_over_budget=terminate"))
	require.NoError(t, err)
	const grace = 3 * time.Second
	cfg.CancelGrace = grace
	pool, err := pgxlanes.NewWithConfig(ctxTimeout(t, 30*time.Second), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reg := registry(t, metrics.NewCollector(pool))
	warm(t, pool, 2) // the query and the transaction must not dial through the blackhole
	ctx := ctxTimeout(t, time.Minute)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, proxy.SetBlackhole(faultproxy.Both, true))
	defer func() { assert.NoError(t, proxy.Normal()) }()

	qctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = pool.Exec(qctx, "select 1")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a query whose server does not answer")
	cleaning := func() float64 { return value(t, reg, "pgxlanes_lane_cleaning_connections", lane(pgxlanes.Short)) }
	pgserver.Eventually(t, grace, "the interrupted query's connection was never counted as cleaning", func() bool { return cleaning() == 1 })
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_lane_in_use_connections", lane(pgxlanes.Short)), "and keeps its slot")
	assert.Equal(t, float64(pool.Stat().Lane(pgxlanes.Short).Cleaning), cleaning())

	pgserver.Eventually(t, 15*time.Second, "no terminate failure counted", func() bool {
		return value(t, reg, "pgxlanes_budget_terminate_failures_total", lane(pgxlanes.Tx)) == 1
	})
	assert.Zero(t, value(t, reg, "pgxlanes_budget_violations_total", map[string]string{"lane": "tx", "action": "terminate"}),
		"a failed termination is not a verified one")
	pgserver.Eventually(t, 2*grace, "the connection stayed in cleaning past CancelGrace", func() bool { return cleaning() == 0 })
	assertEqualsStat(t, reg, pool)
}

// TestLearningFigures makes the pool learn a statement as slow, then as fast again, and checks
// the learning figures.
func TestLearningFigures(t *testing.T) {
	t.Parallel()
	// 200 ms: lookups stay far below it on a loaded machine with -race, so the slow statement
	// stands out from the lane (20 ms failed in a full run at load ~20).
	pool := newPool(t, pgserver.NewDatabase(t), "pool_max_conns=4", "lane_short_slow_threshold=200ms")
	reg := registry(t, metrics.NewCollector(pool))
	ctx := ctxTimeout(t, time.Minute)
	run := func(sleep float64) {
		_, err := pool.Exec(ctx, "select pg_sleep($1)", sleep)
		require.NoError(t, err)
	}
	assert.Equal(t, 0.2, value(t, reg, "pgxlanes_learning_slow_threshold_seconds", nil))
	// Fast lookups first: a statement is demoted when it is slow relative to the rest of Short.
	for range 200 {
		_, err := pool.Exec(ctx, "select 1")
		require.NoError(t, err)
	}
	for range 3 { // the first slow run demotes a statement with no fast run on record
		run(0.3)
	}
	pgserver.Eventually(t, 10*time.Second, "the statement was not demoted", func() bool {
		return value(t, reg, "pgxlanes_learning_demoted_statements", nil) == 1
	})
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_learning_demotions_total", nil))
	assert.Equal(t, 0.0, value(t, reg, "pgxlanes_learning_promotions_total", nil))
	// Fast runs promote it back once MinPeriod (2 s here) has passed since its demotion.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && value(t, reg, "pgxlanes_learning_promotions_total", nil) == 0; {
		run(0)
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, 1.0, value(t, reg, "pgxlanes_learning_promotions_total", nil), "fast runs promote it back")
	assert.Equal(t, 0.0, value(t, reg, "pgxlanes_learning_demoted_statements", nil))
	assert.GreaterOrEqual(t, value(t, reg, "pgxlanes_learning_tracked_statements", nil), 1.0)
	assertEqualsStat(t, reg, pool)
}
