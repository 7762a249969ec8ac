package metrics_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlanes/pgxlanes/metrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Register a pool's collector. The pool does not connect before its first call, so this runs
// without a server.
func ExampleNewCollector() {
	pool, err := pgxlanes.New(context.Background(), "postgres://app@127.0.0.1:5432/app?pool_max_conns=8&lane_long_max_conns=2")
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(pool, metrics.WithPoolName("orders"), metrics.WithTags("checkout")))

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pgxlanes_lane_max_connections" {
			continue
		}
		for _, m := range mf.GetMetric() {
			fmt.Println(m.GetLabel()[0].GetValue(), m.GetLabel()[1].GetValue(), m.GetGauge().GetValue())
		}
	}
	// Output:
	// long orders 2
	// short orders 8
	// tx orders 6
}
