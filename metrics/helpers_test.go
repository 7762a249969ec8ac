package metrics_test

import (
	"context"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgxlanes/pgxlanes/internal/promtest"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// offlineDSN names a server that is never contacted: pgxlanes.New does not connect before the
// first call, and tests that use it make none.
const offlineDSN = "postgres://nobody@127.0.0.1:1/none?sslmode=disable"

// newPool opens a pool on dsn with the lane parameters params ("pool_max_conns=2", ...) and
// closes it when t ends.
func newPool(t testing.TB, dsn string, params ...string) *pgxlanes.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxlanes.New(ctx, withParams(t, dsn, params...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// withParams adds connection parameters to dsn, in URL or keyword/value form.
func withParams(t testing.TB, dsn string, params ...string) string {
	t.Helper()
	if len(params) == 0 {
		return dsn
	}
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " " + strings.Join(params, " ")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal("test DSN is not a valid URL")
	}
	q := u.Query()
	for _, p := range params {
		k, v, _ := strings.Cut(p, "=")
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// registry returns a pedantic registry with c registered: it checks that every metric c collects
// matches a Desc c described, and that the metrics are consistent.
func registry(t testing.TB, c prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return reg
}

// value returns the value of the counter or gauge called name whose labels include labels; it
// fails t unless exactly one series matches.
func value(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	return promtest.Value(t, promtest.Gather(t, g), name, labels)
}

// histogram returns the sample count and sum of a histogram.
func histogram(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	return promtest.Histogram(t, promtest.Gather(t, g), name, labels)
}

// find returns the one series called name whose labels include labels.
func find(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	return promtest.Find(t, promtest.Gather(t, g), name, labels)
}

// lane returns the labels selecting lane l.
func lane(l pgxlanes.Lane) map[string]string { return map[string]string{"lane": l.String()} }

// familyLabels returns, for each metric family g gathers, the sorted label names of its first
// series.
func familyLabels(t testing.TB, g prometheus.Gatherer) map[string]string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 0 {
			continue
		}
		var names []string
		for k := range promtest.Labels(mf.GetMetric()[0]) {
			names = append(names, k)
		}
		sort.Strings(names)
		out[mf.GetName()] = strings.Join(names, ",")
	}
	return out
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
