package otelmetrics_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgxlanes/pgxlanes/metrics/otelmetrics"
)

// sdk is an SDK MeterProvider read by hand.
type sdk struct {
	provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

func newSDK(t testing.TB) *sdk {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &sdk{provider: mp, reader: reader}
}

// collect reads every instrument of the package's meter, by name.
func (s *sdk) collect(t testing.TB) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, s.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelmetrics.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// attrs makes an attribute set from key, value pairs.
func attrs(kv ...string) attribute.Set {
	var kvs []attribute.KeyValue
	for i := 0; i+1 < len(kv); i += 2 {
		kvs = append(kvs, attribute.String(kv[i], kv[i+1]))
	}
	return attribute.NewSet(kvs...)
}

// point returns the value of the int64 sum's data point whose attributes are exactly want, and
// whether there is one (none when the instrument reported nothing).
func point(t testing.TB, m metricdata.Metrics, want attribute.Set) (int64, bool) {
	t.Helper()
	if m.Data == nil {
		return 0, false
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is %T, want an int64 sum", m.Name, m.Data)
	for _, dp := range sum.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value, true
		}
	}
	return 0, false
}

// value is point that fails t when the data point is missing.
func value(t testing.TB, m metricdata.Metrics, want attribute.Set) int64 {
	t.Helper()
	v, ok := point(t, m, want)
	require.True(t, ok, "%s has no data point %v", m.Name, want.ToSlice())
	return v
}

// hist returns the count and sum of the float64 histogram's data point whose attributes are
// exactly want; 0, 0 when there is none.
func hist(t testing.TB, m metricdata.Metrics, want attribute.Set) (uint64, float64) {
	t.Helper()
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is %T, want a float64 histogram", m.Name, m.Data)
	for _, dp := range h.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Count, dp.Sum
		}
	}
	return 0, 0
}

// withParams adds connection parameters to a URL DSN.
func withParams(t testing.TB, dsn string, params ...string) string {
	t.Helper()
	require.True(t, strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://"), "the test DSN is not a URL")
	u, err := url.Parse(dsn)
	require.NoError(t, err, "the test DSN is not a valid URL")
	q := u.Query()
	for _, p := range params {
		k, v, _ := strings.Cut(p, "=")
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
