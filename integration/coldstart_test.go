package integration

import (
	"context"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestColdStartSlowLink: through a link with 150 ms each way (TLS and SCRAM take several round
// trips, so opening a connection takes seconds), with connections recycled every 3 s
// (MaxConnLifetime), a pgxlanes pool's Short statements never fail because a connection was being
// opened for them: opening a connection is bounded by ConnectTimeout, not by Short's 1 s acquire
// timeout. pgxlanes used to fail the first lookups with "short lane: acquire timed out after 1s".
// pgxpool runs beside, through a proxy of its own.
func TestColdStartSlowLink(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 15 s")
	}
	s := tlsServer(t)
	const oneWay = 150 * time.Millisecond
	ctx := context.Background()
	pp, lp := besideOverSlowLink(t, s.DSN(), oneWay, "pool_max_conns=4&pool_max_conn_lifetime=3s&pool_max_conn_lifetime_jitter=500ms&pool_health_check_period=500ms")

	type result struct {
		ok, failed atomic.Int64
		first      atomic.Int64 // the first statement's latency, in ms
		lastErr    atomic.Value
	}
	run := func(r *result, q func(context.Context) error) {
		var wg sync.WaitGroup
		start := time.Now()
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < 12*time.Second {
					t0 := time.Now()
					if err := q(ctx); err != nil {
						r.failed.Add(1)
						r.lastErr.Store(err.Error())
						continue
					}
					if g == 0 {
						r.first.CompareAndSwap(0, time.Since(t0).Milliseconds())
					}
					r.ok.Add(1)
				}
			}()
		}
		wg.Wait()
	}
	var pr, lr result
	var both sync.WaitGroup
	both.Add(2)
	go func() {
		defer both.Done()
		run(&pr, func(ctx context.Context) error {
			var one int
			return pp.QueryRow(ctx, "select 1").Scan(&one)
		})
	}()
	go func() {
		defer both.Done()
		run(&lr, func(ctx context.Context) error {
			var one int
			return lp.QueryRow(ctx, "select 1").Scan(&one)
		})
	}()
	both.Wait()
	t.Logf("pgxpool: %d ok, %d failed, first statement %d ms, %d connections opened", pr.ok.Load(), pr.failed.Load(), pr.first.Load(), pp.Stat().NewConnsCount())
	t.Logf("pgxlanes: %d ok, %d failed, first statement %d ms, %d connections opened; last error %v", lr.ok.Load(), lr.failed.Load(), lr.first.Load(),
		lp.Stat().NewConnsCount(), lr.lastErr.Load())
	assert.Zero(t, pr.failed.Load(), "pgxpool")
	assert.Zero(t, lr.failed.Load(), "pgxlanes: no Short statement fails because a connection was being opened")
	assert.Greater(t, lp.Stat().NewConnsCount(), int64(8), "connections were recycled several times during the test")
}

// TestExpiredIdleConnectionIsDialledNotPinged: an idle connection past MaxConnLifetime looks
// like one pgxpool would ping, but pgxpool destroys it at acquire and dials another. Over a link
// with 150 ms each way the dial takes longer than Short's 1 s acquire timeout: the call must wait
// for it (a dial is bounded by ConnectTimeout), not fail at 1 s. pgxpool beside.
func TestExpiredIdleConnectionIsDialledNotPinged(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 10 s")
	}
	s := tlsServer(t)
	ctx := context.Background()
	// Health checks far apart: the expired connection stays in the pool until an acquire.
	pp, lp := besideOverSlowLink(t, s.DSN(), 150*time.Millisecond, "pool_max_conns=2&pool_max_conn_lifetime=2s&pool_max_conn_lifetime_jitter=0s&pool_health_check_period=1h")

	for _, q := range []func(context.Context) error{
		func(ctx context.Context) error { _, err := pp.Exec(ctx, "select 1"); return err },
		func(ctx context.Context) error { _, err := lp.Exec(ctx, "select 1"); return err },
	} {
		require.NoError(t, q(ctx), "the first statement opens a connection")
	}
	time.Sleep(2500 * time.Millisecond) // both pools' one connection is now past its lifetime
	start := time.Now()
	_, err := pp.Exec(ctx, "select 1")
	require.NoError(t, err)
	t.Logf("pgxpool: %v (a new connection)", time.Since(start))
	start = time.Now()
	_, err = lp.Exec(ctx, "select 1")
	took := time.Since(start)
	t.Logf("pgxlanes: %v, err %v", took, err)
	require.NoError(t, err, "an expired idle connection replaced at acquire is a dial, bounded by ConnectTimeout")
	assert.Greater(t, took, time.Second, "the test dialled over the slow link (else it proves nothing)")
}

// slowLink returns dsn through a proxy of its own that delays each direction by oneWay, with
// params added; the proxy closes with the test.
// besideOverSlowLink opens a plain pgxpool and a pgxlanes pool with params, each through a
// slowLink of its own, and closes them when the test ends.
func besideOverSlowLink(t *testing.T, dsn string, oneWay time.Duration, params string) (*pgxpool.Pool, *pgxlanes.Pool) {
	t.Helper()
	ctx := context.Background()
	pp, err := pgxpool.New(ctx, slowLink(t, dsn, oneWay, params))
	require.NoError(t, err)
	t.Cleanup(pp.Close)
	lp, err := pgxlanes.New(ctx, slowLink(t, dsn, oneWay, params))
	require.NoError(t, err)
	t.Cleanup(lp.Close)
	return pp, lp
}

func slowLink(t *testing.T, dsn string, oneWay time.Duration, params string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	proxy, err := faultproxy.New(u.Host)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	require.NoError(t, proxy.SetLatency(faultproxy.Both, oneWay))
	u.Host = proxy.Addr()
	return withParams(u.String(), params)
}
