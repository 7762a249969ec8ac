package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// EventObserver is what the collector's observer implements.
type EventObserver interface {
	pgxlanes.Observer
	pgxlanes.ViolationObserver
}

// NewCollectorWithObserver is NewCollector that also returns the observer it added to pool, so
// that tests and benchmarks can feed it events directly.
func NewCollectorWithObserver(pool *pgxlanes.Pool, opts ...Option) (prometheus.Collector, EventObserver) {
	c := newCollector(pool, opts...)
	return c, c.obs
}
