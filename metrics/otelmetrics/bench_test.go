package otelmetrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/metrics/otelmetrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// offlinePool is a pool that never connects: pgxlanes.New does not dial before the first call.
func offlinePool(t testing.TB) *pgxlanes.Pool {
	pool, err := pgxlanes.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// registered returns the observer Register added to an offline pool, on an SDK MeterProvider.
func registered(t testing.TB) (pgxlanes.Observer, *sdk) {
	otel := newSDK(t)
	reg, err := otelmetrics.Register(offlinePool(t), otelmetrics.WithMeterProvider(otel.provider), otelmetrics.WithPoolName("p"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })
	return otelmetrics.Observer(reg), otel
}

// TestObserveAllocs fails if recording an event allocates with the SDK: the observer runs on
// every acquire and release.
func TestObserveAllocs(t *testing.T) {
	obs, otel := registered(t)
	timeout := &pgxlanes.AcquireError{Lane: pgxlanes.Short, Err: pgxlanes.ErrAcquireTimeout}
	for name, f := range map[string]func(){
		"acquire":         func() { obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Wait: time.Millisecond}) },
		"acquire/timeout": func() { obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Tx, Wait: time.Second, Err: timeout}) },
		"release":         func() { obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Long, Hold: 2 * time.Second}) },
		"unknown lane":    func() { obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Lane(7), Hold: time.Second}) },
	} {
		assert.Zero(t, testing.AllocsPerRun(100, f), "%s: allocations per event", name)
	}
	got := otel.collect(t)
	n, _ := hist(t, got["db.client.connection.wait_time"], attrs("db.client.connection.pool.name", "p", "pgxlanes.lane", "tx", "error.type", "timeout"))
	assert.Equal(t, uint64(101), n, "the timeouts were recorded (AllocsPerRun runs f once more to warm up)")
}

// BenchmarkObserve measures one acquire and one release event, as a query costs, on the SDK.
func BenchmarkObserve(b *testing.B) {
	b.Run("Serial", func(b *testing.B) {
		obs, _ := registered(b)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			d := time.Duration(i&1023) * time.Microsecond
			obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Wait: d})
			obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short, Hold: d})
			i++
		}
	})
	b.Run("Parallel", func(b *testing.B) {
		obs, _ := registered(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				d := time.Duration(i&1023) * time.Microsecond
				obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Wait: d})
				obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short, Hold: d})
				i++
			}
		})
	})
}

// BenchmarkCollect measures one collection of the pool's instruments by a ManualReader: one Stat
// snapshot, the callback and the SDK's aggregation.
func BenchmarkCollect(b *testing.B) {
	obs, otel := registered(b)
	obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Wait: time.Millisecond})
	obs.ObserveRelease(pgxlanes.ReleaseEvent{Lane: pgxlanes.Short, Hold: time.Millisecond})
	b.ReportAllocs()
	for b.Loop() {
		otel.collect(b)
	}
}
