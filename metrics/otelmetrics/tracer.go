package otelmetrics

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ConnectTracer is a pgx tracer that records db.client.connection.create_time: how long pgx took
// to open each connection (dial, TLS, authentication, the server's startup), failed attempts
// included with error.type "_OTHER". The pool's events do not carry that time, so the tracer
// measures it where pgx opens connections. Set it on the pool's configuration before the pool is
// made:
//
//	cfg, err := pgxlanes.ParseConfig(dsn)
//	...
//	ct, err := otelmetrics.NewConnectTracer(otelmetrics.WithPoolName("orders"))
//	...
//	cfg.ConnConfig.Tracer = ct // or multitracer.New(yourTracer, ct)
//	pool, err := pgxlanes.NewWithConfig(ctx, cfg)
//
// It implements pgx.QueryTracer, whose methods do nothing, because pgx looks for a
// pgx.ConnectTracer on ConnConfig.Tracer. The pool's guard session is not traced.
type ConnectTracer struct {
	create metric.Float64Histogram
	// name is WithPoolName's; "" means the default, from each connection's configuration.
	name string
}

// NewConnectTracer returns a ConnectTracer recording on WithMeterProvider's MeterProvider (the
// global one by default). Give it the same WithPoolName as Register; without one, the pool name
// is "host:port/database" of the configuration, as Register's default.
func NewConnectTracer(opts ...Option) (*ConnectTracer, error) {
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	h, err := histogram(o.provider.Meter(ScopeName), createName, createDesc, createBuckets)
	if err != nil {
		return nil, err
	}
	return &ConnectTracer{create: h, name: o.poolName}, nil
}

type connectStartKey struct{}

// connectStart is what TraceConnectStart hands to TraceConnectEnd through the context.
type connectStart struct {
	at   time.Time
	name string
}

// TraceConnectStart implements pgx.ConnectTracer.
func (t *ConnectTracer) TraceConnectStart(ctx context.Context, d pgx.TraceConnectStartData) context.Context {
	name := t.name
	if name == "" && d.ConnConfig != nil {
		name = defaultPoolName(d.ConnConfig.Host, d.ConnConfig.Port, d.ConnConfig.Database)
	}
	return context.WithValue(ctx, connectStartKey{}, connectStart{at: time.Now(), name: name})
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (t *ConnectTracer) TraceConnectEnd(ctx context.Context, d pgx.TraceConnectEndData) {
	start, ok := ctx.Value(connectStartKey{}).(connectStart)
	if !ok {
		return
	}
	kvs := []attribute.KeyValue{PoolNameKey.String(start.name)}
	if d.Err != nil {
		kvs = append(kvs, ErrorTypeKey.String("_OTHER"))
	}
	t.create.Record(ctx, time.Since(start.at).Seconds(), metric.WithAttributes(kvs...))
}

// TraceQueryStart implements pgx.QueryTracer; it does nothing.
func (t *ConnectTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer; it does nothing.
func (t *ConnectTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

var (
	_ pgx.QueryTracer   = (*ConnectTracer)(nil)
	_ pgx.ConnectTracer = (*ConnectTracer)(nil)
)
