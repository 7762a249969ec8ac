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
		{acquireErr(pgxlanes.ErrAcquireTimeout), 5 * time.Second},
		{acquireErr(pgxlanes.ErrAcquireTimeout), 5 * time.Second},
		{acquireErr(pgxlanes.ErrLaneFull), 0},
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

	for _, tc := range []struct {
		name string
		want float64
	}{
		{"pgxlanes_acquires_total", 2},
		{"pgxlanes_acquire_timeouts_total", 3},
		{"pgxlanes_acquire_rejections_total", 2},
		{"pgxlanes_acquire_cancellations_total", 2},
		{"pgxlanes_acquire_errors_total", 2},
	} {
		if got := value(t, reg, tc.name, lane(pgxlanes.Tx)); got != tc.want {
			t.Errorf("%s{lane=tx} = %v, want %v", tc.name, got, tc.want)
		}
	}
	n, s := histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Tx))
	if n != uint64(len(events)) || s != sum.Seconds() {
		t.Errorf("acquire wait{lane=tx}: count %d sum %v, want every attempt: count %d sum %v", n, s, len(events), sum.Seconds())
	}
	if n, _ := histogram(t, reg, "pgxlanes_acquire_wait_seconds", lane(pgxlanes.Long)); n != 0 {
		t.Errorf("acquire wait{lane=long}: count %d, want 0", n)
	}
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

// TestObserveViolation checks the violations counter by lane and action, and that the warning
// at half the budget counts as a warning. Violations come from txguard; this feeds the observer
// as the pool does, and TestBudgetViolations checks it end to end.
func TestObserveViolation(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c, obs := metrics.NewCollectorWithObserver(pool)
	reg := registry(t, c)
	const b = time.Second
	for _, v := range []pgxlanes.Violation{
		{Lane: pgxlanes.Tx, Action: pgxlanes.ActionFlag, Budget: b, Elapsed: b},
		{Lane: pgxlanes.Tx, Action: pgxlanes.ActionFlag, Budget: b, Elapsed: 3 * b},
		// A terminate lane's ladder: a warning at half the budget, then the termination.
		{Lane: pgxlanes.Tx, Action: pgxlanes.ActionFlag, Budget: b, Elapsed: b / 2, Warning: true},
		{Lane: pgxlanes.Tx, Action: pgxlanes.ActionTerminate, Budget: b, Elapsed: b},
		{Lane: pgxlanes.Long, Action: pgxlanes.ActionCancel, Budget: b, Elapsed: b, Tag: "report"},
		{Lane: pgxlanes.Long, Action: pgxlanes.Action(9), Budget: b, Elapsed: b}, // an action this package does not know
	} {
		obs.ObserveViolation(v)
	}
	want := `
# HELP pgxlanes_budget_violations_total Leases that exceeded their budget, by the action taken (flag, cancel, terminate). A lease that is cancelled and later terminated counts once for each.
# TYPE pgxlanes_budget_violations_total counter
pgxlanes_budget_violations_total{action="action(9)",lane="long",pool="default"} 1
pgxlanes_budget_violations_total{action="cancel",lane="long",pool="default"} 1
pgxlanes_budget_violations_total{action="cancel",lane="short",pool="default"} 0
pgxlanes_budget_violations_total{action="cancel",lane="tx",pool="default"} 0
pgxlanes_budget_violations_total{action="flag",lane="long",pool="default"} 0
pgxlanes_budget_violations_total{action="flag",lane="short",pool="default"} 0
pgxlanes_budget_violations_total{action="flag",lane="tx",pool="default"} 2
pgxlanes_budget_violations_total{action="terminate",lane="long",pool="default"} 0
pgxlanes_budget_violations_total{action="terminate",lane="short",pool="default"} 0
pgxlanes_budget_violations_total{action="terminate",lane="tx",pool="default"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "pgxlanes_budget_violations_total"); err != nil {
		t.Error(err)
	}
	for l, want := range map[pgxlanes.Lane]float64{pgxlanes.Tx: 1, pgxlanes.Long: 0, pgxlanes.Short: 0} {
		if got := value(t, reg, "pgxlanes_budget_warnings_total", lane(l)); got != want {
			t.Errorf("warnings{lane=%s} = %v, want %v", l, got, want)
		}
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
	obs.ObserveViolation(pgxlanes.Violation{Lane: pgxlanes.Tx, Tag: "user-45", Action: pgxlanes.ActionCancel})

	for tag, want := range map[string]float64{"checkout": 2, "report": 1, "none": 1, "other": 3} {
		labels := map[string]string{"pool": "orders", "lane": "short", "tag": tag}
		if got := value(t, reg, "pgxlanes_acquires_total", labels); got != want {
			t.Errorf("acquires%v = %v, want %v", labels, got, want)
		}
		if n, _ := histogram(t, reg, "pgxlanes_hold_seconds", labels); n != uint64(want) {
			t.Errorf("hold%v count = %v, want %v", labels, n, want)
		}
	}
	if got := value(t, reg, "pgxlanes_budget_violations_total", map[string]string{"lane": "tx", "tag": "other", "action": "cancel"}); got != 1 {
		t.Errorf("violations{tx,other,cancel} = %v, want 1", got)
	}
	// Four tag values (checkout, report, none, other) per lane, whatever the callers sent.
	if n := testutil.CollectAndCount(c, "pgxlanes_acquires_total"); n != 3*4 {
		t.Errorf("pgxlanes_acquires_total has %d series, want 12 (3 lanes × 4 tag values)", n)
	}
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
	if n := testutil.CollectAndCount(c, "pgxlanes_acquires_total"); n != 3 {
		t.Errorf("pgxlanes_acquires_total has %d series, want 3 (one per lane)", n)
	}
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
		"violation": func() { obs.ObserveViolation(pgxlanes.Violation{Lane: pgxlanes.Tx, Action: pgxlanes.ActionTerminate}) },
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
		"lane_long_acquire_timeout=50ms", "lane_tx_budget=0", "lane_short_max_waiters=0"))
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
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"pgxlanes_lane_acquire_timeout_seconds", "pgxlanes_lane_budget_seconds", "pgxlanes_lane_max_connections",
		"pgxlanes_lane_max_waiters", "pgxlanes_lane_reserved_connections", "pgxlanes_pool_max_connections"); err != nil {
		t.Error(err)
	}
}
