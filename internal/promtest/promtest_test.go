package promtest_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/promtest"
)

// recorder is a testing.TB whose Fatalf records the message and ends the goroutine, as the real
// one does, so that the failure paths can be checked.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fails runs f with a recorder on a goroutine of its own and returns what it failed with.
func fails(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.failed
}

func registry(t *testing.T) *prometheus.Registry {
	reg := prometheus.NewPedanticRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls_total", Help: "Calls.", ConstLabels: prometheus.Labels{"pool": "p"}},
		[]string{"lane", "tag"})
	c.WithLabelValues("short", "a").Add(3)
	c.WithLabelValues("short", "b").Add(4)
	c.WithLabelValues("tx", "a").Add(5)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "open", Help: "Open."})
	g.Set(7)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "wait_seconds", Help: "Wait.", Buckets: []float64{1}})
	h.Observe(0.5)
	h.Observe(2)
	require.NoError(t, reg.Register(c))
	require.NoError(t, reg.Register(g))
	require.NoError(t, reg.Register(h))
	return reg
}

func TestFindAndValues(t *testing.T) {
	fams := promtest.Gather(t, registry(t))
	assert.Equal(t, 4.0, promtest.Value(t, fams, "calls_total", map[string]string{"lane": "short", "tag": "b"}))
	assert.Equal(t, 5.0, promtest.Value(t, fams, "calls_total", map[string]string{"lane": "tx"}), "a subset of the labels")
	assert.Equal(t, 7.0, promtest.Value(t, fams, "open", nil))
	n, sum := promtest.Histogram(t, fams, "wait_seconds", nil)
	assert.Equal(t, uint64(2), n)
	assert.Equal(t, 2.5, sum)
	m := promtest.Find(t, fams, "calls_total", map[string]string{"tag": "b"})
	assert.Equal(t, map[string]string{"pool": "p", "lane": "short", "tag": "b"}, promtest.Labels(m))
}

func TestFindFailures(t *testing.T) {
	fams := promtest.Gather(t, registry(t))
	for _, tc := range []struct {
		name string
		f    func(tb testing.TB)
		want string
	}{
		{"several", func(tb testing.TB) { promtest.Find(tb, fams, "calls_total", map[string]string{"lane": "short"}) }, "found 2 series"},
		{"none", func(tb testing.TB) { promtest.Find(tb, fams, "calls_total", map[string]string{"lane": "long"}) }, "found 0 series"},
		{"no family", func(tb testing.TB) { promtest.Value(tb, fams, "missing_total", nil) }, "no metric family missing_total"},
		{"not a histogram", func(tb testing.TB) { promtest.Histogram(tb, fams, "open", nil) }, "is not a histogram"},
		{"not a value", func(tb testing.TB) { promtest.Value(tb, fams, "wait_seconds", nil) }, "neither a counter nor a gauge"},
	} {
		assert.Contains(t, fails(t, tc.f), tc.want, tc.name)
	}
}

// TestParsedText reads families parsed from the text format, as a scraped /metrics page.
func TestParsedText(t *testing.T) {
	text := "# TYPE calls_total counter\ncalls_total{lane=\"short\"} 3\ncalls_total{lane=\"tx\"} 4\n"
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err)
	assert.Equal(t, 4.0, promtest.Value(t, fams, "calls_total", map[string]string{"lane": "tx"}))
}
