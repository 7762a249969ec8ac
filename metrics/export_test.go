package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// NewCollectorWithObserver is NewCollector that also returns the observer it added to pool, so
// that tests and benchmarks can feed it events directly.
func NewCollectorWithObserver(pool *pgxlanes.Pool, opts ...Option) (prometheus.Collector, pgxlanes.Observer) {
	c := newCollector(pool, opts...)
	return c, c.hist
}
