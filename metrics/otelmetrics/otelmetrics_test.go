package otelmetrics_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/semconv/v1.41.0/dbconv"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/metrics/otelmetrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

// TestAfterRealTraffic runs queries, transactions, a held connection, a queued caller and an
// acquire timeout against PostgreSQL, and checks every instrument's name, unit, attributes and
// values against what happened and against Stat.
func TestAfterRealTraffic(t *testing.T) {
	t.Parallel()
	dsn := withParams(t, pgserver.NewDatabase(t), "pool_max_conns=4", "pool_min_idle_conns=1",
		"lane_long_max_conns=1", "lane_long_acquire_timeout=50ms", "lane_tx_max_conns=1")
	otel := newSDK(t)
	cfg, err := pgxlanes.ParseConfig(dsn)
	require.NoError(t, err)
	ct, err := otelmetrics.NewConnectTracer(otelmetrics.WithMeterProvider(otel.provider))
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = ct
	ctx := ctxTimeout(t, time.Minute)
	pool, err := pgxlanes.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reg, err := otelmetrics.Register(pool, otelmetrics.WithMeterProvider(otel.provider))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, reg.Unregister()) })
	// The default pool name, as the conventions ask of a pool without one.
	name := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))) + "/" + cfg.ConnConfig.Database
	pn := string(otelmetrics.PoolNameKey)
	laneAttrs := func(l pgxlanes.Lane, kv ...string) []string {
		return append([]string{pn, name, "pgxlanes.lane", l.String()}, kv...)
	}

	const queries = 5
	for range queries {
		_, err := pool.Exec(ctx, "select 1")
		require.NoError(t, err)
	}
	// Long: its only connection held, one acquire times out.
	held, err := pool.Acquire(pgxlanes.WithLane(ctx, pgxlanes.Long))
	require.NoError(t, err)
	_, err = pool.Acquire(pgxlanes.WithLane(ctx, pgxlanes.Long))
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout)
	// Tx: its only connection in a transaction, a second Begin queued behind it.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	queued := make(chan error, 1)
	go func() {
		tx2, err := pool.Begin(ctx)
		if err == nil {
			err = tx2.Commit(ctx)
		}
		queued <- err
	}()
	pgserver.Eventually(t, 10*time.Second, "the second Begin never queued", func() bool { return pool.Stat().Lane(pgxlanes.Tx).Waiting == 1 })

	got := otel.collect(t)
	assert.Equal(t, int64(1), value(t, got["db.client.connection.pending_requests"], attrs(laneAttrs(pgxlanes.Tx)...)))
	assert.Equal(t, int64(0), value(t, got["db.client.connection.pending_requests"], attrs(laneAttrs(pgxlanes.Long)...)))
	for l, want := range map[pgxlanes.Lane]int64{pgxlanes.Short: 0, pgxlanes.Tx: 1, pgxlanes.Long: 1} {
		assert.Equal(t, want, value(t, got["db.client.connection.count"], attrs(laneAttrs(l, "db.client.connection.state", "used")...)),
			"count{state=used,lane=%s}", l)
	}

	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-queued)
	held.Release()
	pgserver.Eventually(t, 10*time.Second, "create_time did not count every connection opened", func() bool {
		n, _ := hist(t, otel.collect(t)["db.client.connection.create_time"], attrs(pn, name))
		return int64(n) == pool.Stat().NewConnsCount()
	})

	got = otel.collect(t)
	st := pool.Stat()
	for name, want := range map[string]struct {
		unit, desc string
		monotonic  bool
	}{
		"db.client.connection.count":            {"{connection}", dbconv.ClientConnectionCountObservable{}.Description(), false},
		"db.client.connection.max":              {"{connection}", dbconv.ClientConnectionMaxObservable{}.Description(), false},
		"db.client.connection.idle.max":         {"{connection}", dbconv.ClientConnectionIdleMaxObservable{}.Description(), false},
		"db.client.connection.idle.min":         {"{connection}", dbconv.ClientConnectionIdleMinObservable{}.Description(), false},
		"db.client.connection.pending_requests": {"{request}", dbconv.ClientConnectionPendingRequestsObservable{}.Description(), false},
		"db.client.connection.timeouts":         {"{timeout}", dbconv.ClientConnectionTimeoutsObservable{}.Description(), true},
	} {
		m, ok := got[name]
		if !assert.True(t, ok, "no instrument %s", name) {
			continue
		}
		assert.Equal(t, want.unit, m.Unit, name)
		assert.Equal(t, want.desc, m.Description, name)
		sum, ok := m.Data.(metricdata.Sum[int64])
		if assert.True(t, ok, "%s is %T, want an int64 sum", name, m.Data) {
			assert.Equal(t, want.monotonic, sum.IsMonotonic, "%s: monotonic", name)
			assert.Equal(t, metricdata.CumulativeTemporality, sum.Temporality, name)
		}
	}

	count := got["db.client.connection.count"]
	assert.Equal(t, int64(st.IdleConns()), value(t, count, attrs(pn, name, "db.client.connection.state", "idle")))
	assert.Positive(t, value(t, count, attrs(pn, name, "db.client.connection.state", "idle")))
	for _, l := range pgxlanes.Lanes() {
		assert.Equal(t, int64(0), value(t, count, attrs(laneAttrs(l, "db.client.connection.state", "used")...)), "used{lane=%s} when idle", l)
		assert.Equal(t, int64(0), value(t, got["db.client.connection.pending_requests"], attrs(laneAttrs(l)...)))
		assert.Equal(t, st.Lane(l).Timeouts, value(t, got["db.client.connection.timeouts"], attrs(laneAttrs(l)...)), "timeouts{lane=%s}", l)
	}
	assert.Len(t, count.Data.(metricdata.Sum[int64]).DataPoints, 4, "count: idle, and used per lane")
	assert.Equal(t, int64(1), value(t, got["db.client.connection.timeouts"], attrs(laneAttrs(pgxlanes.Long)...)))
	assert.Equal(t, int64(4), value(t, got["db.client.connection.max"], attrs(pn, name)))
	assert.Equal(t, int64(4), value(t, got["db.client.connection.idle.max"], attrs(pn, name)))
	assert.Equal(t, int64(1), value(t, got["db.client.connection.idle.min"], attrs(pn, name)))

	for _, name := range []string{"db.client.connection.wait_time", "db.client.connection.use_time", "db.client.connection.create_time"} {
		assert.Equal(t, "s", got[name].Unit, name)
	}
	assert.Equal(t, dbconv.ClientConnectionWaitTime{}.Description(), got["db.client.connection.wait_time"].Description)
	assert.Equal(t, dbconv.ClientConnectionUseTime{}.Description(), got["db.client.connection.use_time"].Description)
	assert.Equal(t, dbconv.ClientConnectionCreateTime{}.Description(), got["db.client.connection.create_time"].Description)

	wait, use := got["db.client.connection.wait_time"], got["db.client.connection.use_time"]
	for _, tc := range []struct {
		lane       pgxlanes.Lane
		waits, use uint64
	}{
		{pgxlanes.Short, queries, queries},
		{pgxlanes.Tx, 2, 2},
		{pgxlanes.Long, 1, 1},
	} {
		n, _ := hist(t, wait, attrs(laneAttrs(tc.lane)...))
		assert.Equal(t, tc.waits, n, "wait_time{lane=%s}: successful acquires", tc.lane)
		n, _ = hist(t, use, attrs(laneAttrs(tc.lane)...))
		assert.Equal(t, tc.use, n, "use_time{lane=%s}", tc.lane)
		assert.Equal(t, st.Lane(tc.lane).Acquires, int64(tc.waits), "Stat agrees on lane %s", tc.lane)
	}
	n, sum := hist(t, wait, attrs(laneAttrs(pgxlanes.Long, "error.type", "timeout")...))
	assert.Equal(t, uint64(1), n, "wait_time{lane=long,error.type=timeout}")
	assert.GreaterOrEqual(t, sum, 0.05, "the timed-out acquire waited its 50ms")
	n, sum = hist(t, wait, attrs(laneAttrs(pgxlanes.Tx)...))
	assert.Greater(t, sum, 0.0, "the queued Begin waited (%d waits)", n)
	n, sum = hist(t, got["db.client.connection.create_time"], attrs(pn, name))
	assert.Equal(t, st.NewConnsCount(), int64(n), "create_time counts every connection opened")
	assert.Greater(t, sum, 0.0)
}

// TestPoolName checks WithPoolName on every instrument, and that two pools under two names keep
// their figures apart.
func TestPoolName(t *testing.T) {
	t.Parallel()
	otel := newSDK(t)
	ctx := ctxTimeout(t, time.Minute)
	pools := map[string]*pgxlanes.Pool{}
	for name, size := range map[string]string{"orders": "3", "reports": "5"} {
		pool, err := pgxlanes.New(ctx, withParams(t, pgserver.NewDatabase(t), "pool_max_conns="+size))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		reg, err := otelmetrics.Register(pool, otelmetrics.WithMeterProvider(otel.provider), otelmetrics.WithPoolName(name))
		require.NoError(t, err)
		t.Cleanup(func() { _ = reg.Unregister() })
		pools[name] = pool
	}
	_, err := pools["orders"].Exec(ctx, "select 1")
	require.NoError(t, err)

	got := otel.collect(t)
	pn := string(otelmetrics.PoolNameKey)
	assert.Equal(t, int64(3), value(t, got["db.client.connection.max"], attrs(pn, "orders")))
	assert.Equal(t, int64(5), value(t, got["db.client.connection.max"], attrs(pn, "reports")))
	n, _ := hist(t, got["db.client.connection.use_time"], attrs(pn, "orders", "pgxlanes.lane", "short"))
	assert.Equal(t, uint64(1), n)
	n, _ = hist(t, got["db.client.connection.use_time"], attrs(pn, "reports", "pgxlanes.lane", "short"))
	assert.Zero(t, n)
	for name, m := range got {
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range data.DataPoints {
				v, ok := dp.Attributes.Value(otelmetrics.PoolNameKey)
				assert.True(t, ok && (v.AsString() == "orders" || v.AsString() == "reports"), "%s: pool name %v", name, v)
			}
		case metricdata.Histogram[float64]:
			for _, dp := range data.DataPoints {
				_, ok := dp.Attributes.Value(otelmetrics.PoolNameKey)
				assert.True(t, ok, "%s: no pool name", name)
			}
		}
	}
}

// TestConnectFailure checks that create_time records a failed connection attempt with
// error.type, through a proxy that refuses connections.
func TestConnectFailure(t *testing.T) {
	t.Parallel()
	otel := newSDK(t)
	proxy := pgserver.NewProxy(t, pgserver.NewDatabase(t))
	ct, err := otelmetrics.NewConnectTracer(otelmetrics.WithMeterProvider(otel.provider), otelmetrics.WithPoolName("p"))
	require.NoError(t, err)
	cc, err := pgx.ParseConfig(proxy.DSN())
	require.NoError(t, err)
	cc.Tracer = ct
	ctx := ctxTimeout(t, 30*time.Second)

	conn, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, proxy.SetRefuse(true))
	_, err = pgx.ConnectConfig(ctx, cc)
	require.Error(t, err, "a connection through a proxy that refuses")

	create := otel.collect(t)["db.client.connection.create_time"]
	pn := string(otelmetrics.PoolNameKey)
	n, sum := hist(t, create, attrs(pn, "p"))
	assert.Equal(t, uint64(1), n, "the connection opened")
	assert.Greater(t, sum, 0.0)
	n, _ = hist(t, create, attrs(pn, "p", "error.type", "_OTHER"))
	assert.Equal(t, uint64(1), n, "the attempt refused")
}

// TestUnregister checks that Unregister stops both the callback and the observer.
func TestUnregister(t *testing.T) {
	t.Parallel()
	otel := newSDK(t)
	ctx := ctxTimeout(t, time.Minute)
	pool, err := pgxlanes.New(ctx, withParams(t, pgserver.NewDatabase(t), "pool_max_conns=2"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reg, err := otelmetrics.Register(pool, otelmetrics.WithMeterProvider(otel.provider), otelmetrics.WithPoolName("p"))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "select 1")
	require.NoError(t, err)
	require.NoError(t, reg.Unregister())
	require.NoError(t, reg.Unregister(), "a second Unregister")
	_, err = pool.Exec(ctx, "select 1")
	require.NoError(t, err)

	got := otel.collect(t)
	n, _ := hist(t, got["db.client.connection.use_time"], attrs(string(otelmetrics.PoolNameKey), "p", "pgxlanes.lane", "short"))
	assert.Equal(t, uint64(1), n, "use_time: the query after Unregister is not recorded")
	_, ok := point(t, got["db.client.connection.max"], attrs(string(otelmetrics.PoolNameKey), "p"))
	assert.False(t, ok, "db.client.connection.max is still observed after Unregister")
}

func TestBadInput(t *testing.T) {
	pool, err := pgxlanes.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	require.NoError(t, err)
	defer pool.Close()
	for _, tc := range []struct {
		name string
		pool *pgxlanes.Pool
		opts []otelmetrics.Option
		want string
	}{
		{"nil pool", nil, nil, "pool is nil"},
		{"empty name", pool, []otelmetrics.Option{otelmetrics.WithPoolName("")}, "WithPoolName"},
		{"nil provider", pool, []otelmetrics.Option{otelmetrics.WithMeterProvider(nil)}, "WithMeterProvider"},
		{"nil option", pool, []otelmetrics.Option{nil}, "Option is nil"},
	} {
		reg, err := otelmetrics.Register(tc.pool, tc.opts...)
		assert.Nil(t, reg, tc.name)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err = otelmetrics.NewConnectTracer(otelmetrics.WithPoolName(""))
	assert.ErrorContains(t, err, "WithPoolName")
}

// TestSemconvNames checks the instruments' names against semconv v1.41.0's dbconv, the newest
// semantic conventions package of the OpenTelemetry Go module this module requires (v1.44.0),
// which is the version the package documentation states.
func TestSemconvNames(t *testing.T) {
	otel := newSDK(t)
	pool, err := pgxlanes.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	require.NoError(t, err)
	defer pool.Close()
	reg, err := otelmetrics.Register(pool, otelmetrics.WithMeterProvider(otel.provider))
	require.NoError(t, err)
	defer func() { _ = reg.Unregister() }()
	obs := otelmetrics.Observer(reg)
	obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short})
	obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short})
	ct, err := otelmetrics.NewConnectTracer(otelmetrics.WithMeterProvider(otel.provider))
	require.NoError(t, err)
	ct.TraceConnectEnd(ct.TraceConnectStart(context.Background(), pgx.TraceConnectStartData{ConnConfig: pool.Config().ConnConfig}),
		pgx.TraceConnectEndData{Err: errors.New("refused")})

	got := otel.collect(t)
	for _, want := range []struct{ name, unit string }{
		{dbconv.ClientConnectionCountObservable{}.Name(), dbconv.ClientConnectionCountObservable{}.Unit()},
		{dbconv.ClientConnectionMaxObservable{}.Name(), dbconv.ClientConnectionMaxObservable{}.Unit()},
		{dbconv.ClientConnectionIdleMaxObservable{}.Name(), dbconv.ClientConnectionIdleMaxObservable{}.Unit()},
		{dbconv.ClientConnectionIdleMinObservable{}.Name(), dbconv.ClientConnectionIdleMinObservable{}.Unit()},
		{dbconv.ClientConnectionPendingRequestsObservable{}.Name(), dbconv.ClientConnectionPendingRequestsObservable{}.Unit()},
		{dbconv.ClientConnectionTimeoutsObservable{}.Name(), dbconv.ClientConnectionTimeoutsObservable{}.Unit()},
		{dbconv.ClientConnectionWaitTime{}.Name(), dbconv.ClientConnectionWaitTime{}.Unit()},
		{dbconv.ClientConnectionUseTime{}.Name(), dbconv.ClientConnectionUseTime{}.Unit()},
		{dbconv.ClientConnectionCreateTime{}.Name(), dbconv.ClientConnectionCreateTime{}.Unit()},
		{"pgxlanes.lane.hold.p99", "s"}, // pgxlanes' own, outside the conventions
		{"pgxlanes.lane.advised_timeout", "s"},
	} {
		m, ok := got[want.name]
		if assert.True(t, ok, "no instrument %s", want.name) {
			assert.Equal(t, want.unit, m.Unit, want.name)
		}
	}
	assert.Len(t, got, 11)
	assert.Equal(t, "db.client.connection.pool.name", string(otelmetrics.PoolNameKey))
	assert.Equal(t, "db.client.connection.state", string(otelmetrics.StateKey))
	assert.Equal(t, "idle", string(dbconv.ClientConnectionStateIdle))
	// The default pool name of an unnamed pool: server.address:server.port/db.namespace.
	_, ok := point(t, got["db.client.connection.max"], attrs(string(otelmetrics.PoolNameKey), "127.0.0.1:1/none"))
	assert.True(t, ok, "the default pool name")
}

// TestNoopProvider checks that the package works with the no-op MeterProvider.
func TestNoopProvider(t *testing.T) {
	pool, err := pgxlanes.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	require.NoError(t, err)
	defer pool.Close()
	reg, err := otelmetrics.Register(pool, otelmetrics.WithMeterProvider(noop.NewMeterProvider()))
	require.NoError(t, err)
	assert.NoError(t, reg.Unregister())
}

// TestMultitracer checks the ConnectTracer combined with another tracer through pgx's
// multitracer, which the pool sees as an AcquireTracer and wraps: connections are still timed.
func TestMultitracer(t *testing.T) {
	t.Parallel()
	otel := newSDK(t)
	ct, err := otelmetrics.NewConnectTracer(otelmetrics.WithMeterProvider(otel.provider), otelmetrics.WithPoolName("p"))
	require.NoError(t, err)
	cfg, err := pgxlanes.ParseConfig(pgserver.NewDatabase(t))
	require.NoError(t, err)
	queries := &countingTracer{}
	cfg.ConnConfig.Tracer = multitracer.New(queries, ct)
	ctx := ctxTimeout(t, time.Minute)
	pool, err := pgxlanes.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, "select 1")
	require.NoError(t, err)

	n, _ := hist(t, otel.collect(t)["db.client.connection.create_time"], attrs(string(otelmetrics.PoolNameKey), "p"))
	assert.Equal(t, pool.Stat().NewConnsCount(), int64(n))
	assert.Positive(t, n)
	assert.Positive(t, queries.n.Load(), "the other tracer still sees the query")
}

type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
