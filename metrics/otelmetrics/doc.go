// Package otelmetrics exports a pgxlanes pool's figures as OpenTelemetry metrics, following the
// db.client.connection.* instruments of the OpenTelemetry semantic conventions v1.41.0 (the newest
// that the OpenTelemetry Go module v1.44.0 ships, go.opentelemetry.io/otel/semconv/v1.41.0). Those
// instruments are marked Development in the conventions: their names, units and attributes may
// still change, and this package follows them when they do.
//
//	pool, err := pgxlanes.NewWithConfig(ctx, cfg)
//	...
//	reg, err := otelmetrics.Register(pool, otelmetrics.WithPoolName("orders"))
//	...
//	defer reg.Unregister()
//
// The instruments, on the meter "github.com/pgxlanes/pgxlanes/metrics/otelmetrics" of the global
// MeterProvider (or WithMeterProvider's):
//
//	db.client.connection.count             async UpDownCounter {connection}  state=used per lane (the lane's slots in use); state=idle (the pool's idle connections)
//	db.client.connection.max               async UpDownCounter {connection}  the pool's size
//	db.client.connection.idle.max          async UpDownCounter {connection}  the pool's size (pgxpool caps idle connections at it)
//	db.client.connection.idle.min          async UpDownCounter {connection}  pool_min_idle_conns
//	db.client.connection.pending_requests  async UpDownCounter {request}     callers queued, per lane
//	db.client.connection.timeouts          async Counter {timeout}           ErrAcquireTimeout, per lane, from the pool's start
//	db.client.connection.wait_time         Histogram s                       every acquire attempt, per lane; a failed one carries error.type
//	db.client.connection.use_time          Histogram s                       every lease's hold time, per lane
//	db.client.connection.create_time       Histogram s                       every connection opened (ConnectTracer)
//
// and pgxlanes' own, fed by pgxlanes.RetryTx's attempts (the conventions have no retry
// instruments), per lane and without a tag attribute, which no allow-list bounds here:
//
//	pgxlanes.retry.attempts                Counter {attempt}                 transactions run, every attempt counted
//	pgxlanes.retry.retries                 Counter {attempt}                 attempts run again, with pgxlanes.retry.code (a SQLSTATE, conn, ...)
//	pgxlanes.retry.gave_up                 Counter {call}                    calls stopped by a cap, with pgxlanes.retry.reason
//	pgxlanes.retry.commit_unknown          Counter {call}                    calls whose COMMIT had an unknown outcome
//
// Every measurement carries db.client.connection.pool.name: WithPoolName's, or by default, as
// the conventions ask of a pool without a name, "host:port/database" of the pool's
// configuration. A figure that belongs to a lane also carries pgxlanes.lane ("short", "tx",
// "long"). The attribute is in the pgxlanes namespace because the db.* namespace belongs to the
// conventions, and it has the values of the Prometheus package's lane label. Pool-wide figures
// (the idle count, the maxima, create_time) carry no lane: each measurement of an instrument then
// belongs to exactly one lane or to none, so that the sum over pgxlanes.lane, or a View that
// drops it, is the pool's figure as the conventions define it, with no connection counted twice.
//
// The asynchronous instruments are read from one pool.Stat() per collection, so that they agree
// with each other and with Stat; the histograms are fed by an observer (pgxlanes.Observer) that
// Register adds to the pool, which records an event without allocating.
//
// wait_time records every attempt, failed ones too, as the Prometheus histogram does: leaving the
// timeouts out would hide starvation. A failed attempt carries error.type: "timeout"
// (ErrAcquireTimeout), "lane_full" (ErrLaneFull), "canceled" (the caller's context ended) or
// "_OTHER"; a successful one carries none, so error.type absent selects the successes.
//
// create_time needs the time pgx takes to open a connection, which the pool's events do not
// carry: set a ConnectTracer on the pool's ConnConfig before the pool is made (and combine it
// with a tracer of your own through github.com/jackc/pgx/v5/multitracer).
//
// The Prometheus package github.com/pgxlanes/pgxlanes/metrics exports more (rejections, budget
// actions, cleaning connections, learning); this package keeps to the conventions.
package otelmetrics
