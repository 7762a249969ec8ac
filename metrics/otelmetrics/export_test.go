package otelmetrics

import "github.com/pgxlanes/pgxlanes/pgxlanes"

// Observer returns the observer Register added to the pool, so that tests and benchmarks can feed
// it events directly.
func Observer(r *Registration) pgxlanes.Observer { return r.obs }
