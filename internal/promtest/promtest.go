// Package promtest finds Prometheus series in tests: the one series of a family whose labels
// include a given set, and its value. The metrics package's tests read a registry with it and the
// HTTP example's tests a scraped /metrics page, so that the matching rules are written once.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Families are metric families by name, as Gather returns them or as expfmt's text parser does.
type Families = map[string]*dto.MetricFamily

// Gather gathers g and returns its families by name; it fails tb if g reports an error.
func Gather(tb testing.TB, g prometheus.Gatherer) Families {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatalf("gather: %v", err)
	}
	out := make(Families, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// Find returns the series of family name whose labels include want (a label of the series that
// want does not name may have any value). It fails tb unless exactly one series matches.
func Find(tb testing.TB, fams Families, name string, want map[string]string) *dto.Metric {
	tb.Helper()
	mf := fams[name]
	if mf == nil {
		tb.Fatalf("no metric family %s", name)
	}
	var found []*dto.Metric
	for _, m := range mf.GetMetric() {
		if matches(m, want) {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		tb.Fatalf("%s%v: found %d series, want 1", name, want, len(found))
	}
	return found[0]
}

func matches(m *dto.Metric, want map[string]string) bool {
	have := Labels(m)
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// Labels returns the labels of m by name.
func Labels(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		l[lp.GetName()] = lp.GetValue()
	}
	return l
}

// Value returns the value of the counter, gauge or untyped series that Find finds.
func Value(tb testing.TB, fams Families, name string, want map[string]string) float64 {
	tb.Helper()
	m := Find(tb, fams, name, want)
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	tb.Fatalf("%s%v is neither a counter nor a gauge", name, want)
	return 0
}

// Histogram returns the sample count and sum of the histogram series that Find finds.
func Histogram(tb testing.TB, fams Families, name string, want map[string]string) (count uint64, sum float64) {
	tb.Helper()
	h := Find(tb, fams, name, want).GetHistogram()
	if h == nil {
		tb.Fatalf("%s%v is not a histogram", name, want)
	}
	return h.GetSampleCount(), h.GetSampleSum()
}
