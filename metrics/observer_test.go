package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/metrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// These tests feed the collector's observer directly: it is the unit that turns events into
// series. The tests in metrics_test.go check the same series after real work on PostgreSQL.

func TestObserveAcquireOutcomes(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c, obs := metrics.NewCollectorWithObserver(pool)
	reg := registry(t, c)

	acquireErr := func(err error) error {
		return &pgxlanes.AcquireError{Lane: pgxlanes.Tx, Waited: time.Second, Err: err}
	}
	events := []struct {
		err  error
		wait time.Duration
	}{
		{nil, time.Millisecond},
		{nil, 2 * time.Millisecond},
		{acquireErr(pgxlanes.ErrAcquireTimeout), 5 * time.Second},
		{acquireErr(pgxlanes.ErrLaneFull), 0},
		{acquireErr(context.Canceled), time.Second},
		{acquireErr(context.DeadlineExceeded), time.Second},
		{acquireErr(pgxlanes.ErrClosed), 0},
		{fmt.Errorf("pgxlanes: tx lane: %w", io.ErrUnexpectedEOF), 0},
	}
	var sum time.Duration
	for _, e := range events {
		obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Tx, Wait: e.wait, Err: e.err})
		sum += e.wait
	}
	// Another lane's event must not leak into Tx's series.
	obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Wait: time.Hour})

	n, s := histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Tx))
	assert.Equal(t, uint64(len(events)), n, "acquire wait{lane=tx}: every attempt, failed ones too")
	assert.Equal(t, sum.Seconds(), s, "acquire wait{lane=tx}")
	n, _ = histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Long))
	assert.Zero(t, n, "acquire wait{lane=long}")
	// The counters come from the pool, not from events: this offline pool counted nothing.
	assert.Zero(t, value(t, reg, "pgxlanes_acquires_total", lane(pgxlanes.Tx)), "acquires{lane=tx} fed by events")
	assert.Zero(t, value(t, reg, "pgxlanes_acquire_timeouts_total", lane(pgxlanes.Tx)), "timeouts{lane=tx} fed by events")
}

func TestObserveRelease(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c, obs := metrics.NewCollectorWithObserver(pool)
	reg := registry(t, c)
	for _, d := range []time.Duration{time.Millisecond, 3 * time.Millisecond, 20 * time.Minute} {
		obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Long, Hold: d})
	}
	n, s := histogram(t, reg, "pgxlanes_hold_seconds", lane(pgxlanes.Long))
	if want := (20*time.Minute + 4*time.Millisecond).Seconds(); n != 3 || s != want {
		t.Errorf("hold{lane=long}: count %d sum %v, want 3 and %v", n, s, want)
	}
	// The 20-minute hold lies beyond every classic bucket but the implicit +Inf.
	h := find(t, reg, "pgxlanes_hold_seconds", lane(pgxlanes.Long)).GetHistogram()
	if b := h.GetBucket(); b[len(b)-1].GetCumulativeCount() != 2 {
		t.Errorf("hold{lane=long}: %d samples ≤ %vs, want 2", b[len(b)-1].GetCumulativeCount(), b[len(b)-1].GetUpperBound())
	}
	// The native histogram is there too.
	if h.Schema == nil || len(h.GetPositiveSpan()) == 0 {
		t.Errorf("hold{lane=long}: no native histogram (schema %d, %d spans)", h.GetSchema(), len(h.GetPositiveSpan()))
	}
}

func TestTagsAllowList(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c, obs := metrics.NewCollectorWithObserver(pool, metrics.WithTags("checkout", "report", "checkout", ""), metrics.WithPoolName("orders"))
	reg := registry(t, c)
	for _, tag := range []string{"checkout", "checkout", "report", "", "user-42", "user-43", "user-44"} {
		obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Tag: tag, Wait: time.Millisecond})
		obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short, Tag: tag, Hold: time.Millisecond})
	}
	for tag, want := range map[string]uint64{"checkout": 2, "report": 1, "none": 1, "other": 3} {
		labels := map[string]string{"pool": "orders", "lane": "short", "tag": tag}
		n, _ := histogram(t, reg, "pgxlanes_acquire_wait_seconds", labels)
		assert.Equal(t, want, n, "acquire wait%v count", labels)
		n, _ = histogram(t, reg, "pgxlanes_hold_seconds", labels)
		assert.Equal(t, want, n, "hold%v count", labels)
	}
	// Four tag values (checkout, report, none, other) per lane, whatever the callers sent.
	assert.Equal(t, 3*4, testutil.CollectAndCount(c, "pgxlanes_hold_seconds"), "3 lanes × 4 tag values")
	// Only the histograms and RetryTx's counters (fed by events) have a tag label: the counters
	// from Stat are per lane.
	for name, labels := range familyLabels(t, reg) {
		hasTag := strings.Contains(","+labels+",", ",tag,")
		isHist := name == "pgxlanes_acquire_wait_seconds" || name == "pgxlanes_hold_seconds" || strings.HasPrefix(name, "pgxlanes_retry_")
		assert.Equal(t, isHist, hasTag, "%s has labels %s", name, labels)
	}
}

// The tags "none" and "other" on the list share the series of the calls without a tag and of
// the tags off the list, as WithTags says: no second series with the same labels (which the
// registry would refuse), and no sample lost.
func TestTagsNamedNoneAndOther(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c, obs := metrics.NewCollectorWithObserver(pool, metrics.WithTags("none", "other", "checkout"))
	reg := registry(t, c)
	for _, tag := range []string{"none", "", "other", "user-42", "checkout"} {
		obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short, Tag: tag, Hold: time.Millisecond})
	}
	for tag, want := range map[string]uint64{"none": 2, "other": 2, "checkout": 1} {
		n, _ := histogram(t, reg, "pgxlanes_hold_seconds", map[string]string{"lane": "short", "tag": tag})
		assert.Equal(t, want, n, "hold{tag=%q} count", tag)
	}
	assert.Equal(t, 3*3, testutil.CollectAndCount(c, "pgxlanes_hold_seconds"), "3 lanes × 3 tag values")
}

// A tag of WithTags that is not valid UTF-8 (a tag list read from configuration) neither panics
// nor loses its samples: its label value has U+FFFD in place of the bad bytes, and calls tagged
// with it are counted there, in the histograms and in RetryTx's counters.
func TestTagsNotValidUTF8(t *testing.T) {
	pool := newPool(t, offlineDSN)
	var (
		c   prometheus.Collector
		obs pgxlanes.Observer
	)
	require.NotPanics(t, func() {
		c, obs = metrics.NewCollectorWithObserver(pool, metrics.WithTags("checkout", "r\xe9ports", "r\xe9ports"))
	})
	reg := registry(t, c)
	retries, ok := obs.(pgxlanes.RetryObserver)
	require.True(t, ok, "the observer counts RetryTx's attempts")
	for _, tag := range []string{"r\xe9ports", "r\xe9ports", "checkout", "x\xff"} {
		obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Tag: tag, Wait: time.Millisecond})
		obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short, Tag: tag, Hold: time.Millisecond})
		retries.ObserveRetry(pgxlanes.RetryEvent{Lane: pgxlanes.Tx, Tag: tag, Attempt: 1,
			Outcome: pgxlanes.RetryWillRetry, Code: "40001"})
	}
	for tag, want := range map[string]uint64{"r\uFFFDports": 2, "checkout": 1, "other": 1, "none": 0} {
		labels := map[string]string{"lane": "short", "tag": tag}
		n, _ := histogram(t, reg, "pgxlanes_acquire_wait_seconds", labels)
		assert.Equal(t, want, n, "acquire wait%v count", labels)
		n, _ = histogram(t, reg, "pgxlanes_hold_seconds", labels)
		assert.Equal(t, want, n, "hold%v count", labels)
		labels = map[string]string{"lane": "tx", "tag": tag, "code": "40001"}
		assert.Equal(t, float64(want), value(t, reg, "pgxlanes_retry_retries_total", labels), "retries%v", labels)
	}
	assert.Equal(t, 3*4, testutil.CollectAndCount(c, "pgxlanes_hold_seconds"), "3 lanes × 4 tag values")
}

func TestNoTagLabelByDefault(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c, obs := metrics.NewCollectorWithObserver(pool)
	reg := registry(t, c)
	obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Tag: "checkout"})
	for name, labels := range familyLabels(t, reg) {
		if strings.Contains(","+labels+",", ",tag,") {
			t.Errorf("%s has a tag label (%s) without WithTags", name, labels)
		}
	}
	assert.Equal(t, 3, testutil.CollectAndCount(c, "pgxlanes_acquire_wait_seconds"), "one series per lane")
}

// TestObserveAllocs fails if recording an event allocates: the observer runs on every acquire
// and release.
func TestObserveAllocs(t *testing.T) {
	pool := newPool(t, offlineDSN)
	_, obs := metrics.NewCollectorWithObserver(pool, metrics.WithTags("checkout"))
	timeout := &pgxlanes.AcquireError{Lane: pgxlanes.Short, Err: pgxlanes.ErrAcquireTimeout}
	cancelled := &pgxlanes.AcquireError{Lane: pgxlanes.Short, Err: context.Canceled}
	acquire := func(l pgxlanes.Lane, tag string, wait time.Duration, err error) func() {
		return func() { obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: l, Tag: tag, Wait: wait, Err: err}) }
	}
	for name, f := range map[string]func(){
		"acquire":           acquire(pgxlanes.Short, "checkout", 300*time.Microsecond, nil),
		"acquire/other-tag": acquire(pgxlanes.Tx, "x", time.Millisecond, nil),
		"acquire/timeout":   acquire(pgxlanes.Short, "", time.Second, timeout),
		"acquire/cancelled": acquire(pgxlanes.Short, "", time.Second, cancelled),
		"release": func() {
			obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Long, Tag: "checkout", Hold: 2 * time.Second})
		},
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations per event, want 0", name, n)
		}
	}
}

// BenchmarkObserve measures one acquire and one release event, as a query costs.
func BenchmarkObserve(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []metrics.Option
		tag  string
	}{
		{"Tags=off", nil, ""},
		{"Tags=allowed", []metrics.Option{metrics.WithTags("checkout", "report")}, "report"},
		{"Tags=other", []metrics.Option{metrics.WithTags("checkout", "report")}, "user-42"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pool := newPool(b, offlineDSN)
			_, obs := metrics.NewCollectorWithObserver(pool, bc.opts...)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// Vary the durations over a few buckets, as real waits do.
				d := time.Duration(i&1023) * time.Microsecond
				obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Tag: bc.tag, Wait: d})
				obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short, Tag: bc.tag, Hold: d})
				i++
			}
		})
	}
	b.Run("Tags=off/Parallel", func(b *testing.B) {
		pool := newPool(b, offlineDSN)
		_, obs := metrics.NewCollectorWithObserver(pool)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				d := time.Duration(i&1023) * time.Microsecond
				obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Wait: d})
				obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short, Hold: d})
				i++
			}
		})
	})
}

func TestLintClean(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c, obs := metrics.NewCollectorWithObserver(pool, metrics.WithTags("checkout"))
	obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Wait: time.Millisecond})
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestSeveralPools registers two pools' collectors with one registry, which works because their
// pool labels differ, and a second collector of the same name, which the registry refuses.
func TestSeveralPools(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a, b := newPool(t, offlineDSN), newPool(t, withParams(t, offlineDSN, "pool_max_conns=7"))
	if err := reg.Register(metrics.NewCollector(a, metrics.WithPoolName("orders"))); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(metrics.NewCollector(b, metrics.WithPoolName("reports"))); err != nil {
		t.Fatalf("second pool under another name: %v", err)
	}
	var are prometheus.AlreadyRegisteredError
	if err := reg.Register(metrics.NewCollector(b, metrics.WithPoolName("reports"))); !errors.As(err, &are) {
		t.Fatalf("same pool name twice: err = %v, want AlreadyRegisteredError", err)
	}
	if got := value(t, reg, "pgxlanes_pool_max_connections", map[string]string{"pool": "reports"}); got != 7 {
		t.Errorf("pgxlanes_pool_max_connections{pool=reports} = %v, want 7", got)
	}
	if got := value(t, reg, "pgxlanes_pool_max_connections", map[string]string{"pool": "orders"}); got != float64(a.Config().MaxConns) {
		t.Errorf("pgxlanes_pool_max_connections{pool=orders} = %v, want %d", got, a.Config().MaxConns)
	}
}

// TestConfigGauges checks the gauges that come from the lanes' configuration, in full.
func TestConfigGauges(t *testing.T) {
	pool := newPool(t, withParams(t, offlineDSN, "pool_max_conns=8", "lane_long_max_conns=1",
		"lane_long_acquire_timeout=50ms", "lane_tx_budget=0", "lane_short_max_waiters=0", "lane_short_slow_threshold=250ms"))
	c := metrics.NewCollector(pool, metrics.WithPoolName("p"))
	want := `
# HELP pgxlanes_lane_acquire_timeout_seconds The lane's acquire timeout; 0 means none.
# TYPE pgxlanes_lane_acquire_timeout_seconds gauge
pgxlanes_lane_acquire_timeout_seconds{lane="long",pool="p"} 0.05
pgxlanes_lane_acquire_timeout_seconds{lane="short",pool="p"} 1
pgxlanes_lane_acquire_timeout_seconds{lane="tx",pool="p"} 10
# HELP pgxlanes_lane_budget_seconds The lane's default budget for a transaction or held connection; 0 means none.
# TYPE pgxlanes_lane_budget_seconds gauge
pgxlanes_lane_budget_seconds{lane="long",pool="p"} 600
pgxlanes_lane_budget_seconds{lane="short",pool="p"} 6
pgxlanes_lane_budget_seconds{lane="tx",pool="p"} 0
# HELP pgxlanes_lane_max_connections The lane's cap: the most connections it may hold at once.
# TYPE pgxlanes_lane_max_connections gauge
pgxlanes_lane_max_connections{lane="long",pool="p"} 1
pgxlanes_lane_max_connections{lane="short",pool="p"} 8
pgxlanes_lane_max_connections{lane="tx",pool="p"} 6
# HELP pgxlanes_lane_max_waiters The lane's queue bound; a caller beyond it is refused at once. 0 means unbounded.
# TYPE pgxlanes_lane_max_waiters gauge
pgxlanes_lane_max_waiters{lane="long",pool="p"} 32
pgxlanes_lane_max_waiters{lane="short",pool="p"} 0
pgxlanes_lane_max_waiters{lane="tx",pool="p"} 192
# HELP pgxlanes_lane_reserved_connections Connections reserved for the lane, which no other lane's unbounded work may take.
# TYPE pgxlanes_lane_reserved_connections gauge
pgxlanes_lane_reserved_connections{lane="long",pool="p"} 0
pgxlanes_lane_reserved_connections{lane="short",pool="p"} 2
pgxlanes_lane_reserved_connections{lane="tx",pool="p"} 3
# HELP pgxlanes_pool_max_connections The pool's size, shared by the lanes.
# TYPE pgxlanes_pool_max_connections gauge
pgxlanes_pool_max_connections{pool="p"} 8
# HELP pgxlanes_learning_slow_threshold_seconds The run time past which an unannotated Short statement counts as slow; 0 means learning is off.
# TYPE pgxlanes_learning_slow_threshold_seconds gauge
pgxlanes_learning_slow_threshold_seconds{pool="p"} 0.25
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"pgxlanes_lane_acquire_timeout_seconds", "pgxlanes_lane_budget_seconds", "pgxlanes_lane_max_connections",
		"pgxlanes_lane_max_waiters", "pgxlanes_lane_reserved_connections", "pgxlanes_pool_max_connections",
		"pgxlanes_learning_slow_threshold_seconds"))
}

// TestCountersFromZero checks, on a pool that has done nothing, that every counter series of
// every lane (and action) exists at 0, so that rate() and increase() see the first event.
func TestCountersFromZero(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c := metrics.NewCollector(pool, metrics.WithPoolName("p"))
	var want strings.Builder
	counters := []struct{ name, help string }{
		{"pgxlanes_acquires_total", "Successful acquires."},
		{"pgxlanes_acquires_queued_total", "Successful acquires that had to queue for a slot."},
		{"pgxlanes_acquires_wait_seconds_total", "Total time successful acquires waited, from the call to a ready connection."},
		{"pgxlanes_acquire_timeouts_total", "Acquires that failed because the lane's acquire timeout ran out (ErrAcquireTimeout)."},
		{"pgxlanes_acquire_rejections_total", "Acquires refused at once because the lane's wait queue was full (ErrLaneFull)."},
		{"pgxlanes_acquire_cancellations_total", "Acquires abandoned because the caller's context was cancelled or its deadline passed."},
		{"pgxlanes_acquire_errors_total", "Acquires that failed for any other reason: pool closed, a connection that could not be opened."},
		{"pgxlanes_budget_warnings_total", "Leases of a cancel or terminate lane that passed half their budget: the warning before the action."},
		{"pgxlanes_budget_terminate_failures_total", "Terminations of leases over budget that could not be verified; the pool closed its own socket to the session instead."},
		{"pgxlanes_lane_cleaning_connections", "Of the connections the lane holds, those being cleaned after an interrupted request (cancel request sent, replies drained); each keeps its slot until it is clean."},
	}
	var names []string
	for _, m := range counters {
		typ := "counter"
		if !strings.HasSuffix(m.name, "_total") {
			typ = "gauge"
		}
		fmt.Fprintf(&want, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, typ)
		for _, l := range []string{"long", "short", "tx"} {
			fmt.Fprintf(&want, "%s{lane=%q,pool=\"p\"} 0\n", m.name, l)
		}
		names = append(names, m.name)
	}
	want.WriteString("# HELP pgxlanes_budget_violations_total Leases that exceeded their budget, by the action taken (flag, cancel, terminate; terminate counts verified terminations only). A lease that is cancelled and later terminated counts once for each.\n")
	want.WriteString("# TYPE pgxlanes_budget_violations_total counter\n")
	for _, a := range []string{"cancel", "flag", "terminate"} {
		for _, l := range []string{"long", "short", "tx"} {
			fmt.Fprintf(&want, "pgxlanes_budget_violations_total{action=%q,lane=%q,pool=\"p\"} 0\n", a, l)
		}
	}
	names = append(names, "pgxlanes_budget_violations_total")
	for _, m := range []struct{ name, help, typ string }{
		{"pgxlanes_learning_demoted_statements", "Statements learned as slow now: they take Long's capacity under Short's timeouts.", "gauge"},
		{"pgxlanes_learning_tracked_statements", "Statements the pool keeps figures for (bounded): proven fast ones and those with a slow history; texts that differ only in literals count once.", "gauge"},
		{"pgxlanes_learning_demotions_total", "Statements learned as slow.", "counter"},
		{"pgxlanes_learning_promotions_total", "Demoted statements learned as fast again.", "counter"},
		{"pgxlanes_pool_new_connections_total", "Connections opened.", "counter"},
	} {
		fmt.Fprintf(&want, "# HELP %s %s\n# TYPE %s %s\n%s{pool=\"p\"} 0\n", m.name, m.help, m.name, m.typ, m.name)
		names = append(names, m.name)
	}
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want.String()), names...))
}

// BenchmarkScrape measures one scrape of a pool's collector through a pedantic registry (the
// exposition's encoding left out): one Stat snapshot and every series.
func BenchmarkScrape(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []metrics.Option
	}{
		{"Tags=off", nil},
		{"Tags=4", []metrics.Option{metrics.WithTags("checkout", "report")}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			pool := newPool(b, offlineDSN)
			reg := prometheus.NewRegistry()
			reg.MustRegister(metrics.NewCollector(pool, bc.opts...))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
