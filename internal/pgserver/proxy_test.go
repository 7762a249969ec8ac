package pgserver_test

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// roundTrips returns the sorted durations of n empty queries on conn.
func roundTrips(t testing.TB, conn *pgx.Conn, n int) []time.Duration {
	ctx := context.Background()
	d := make([]time.Duration, n)
	for i := range d {
		start := time.Now()
		_, err := conn.Exec(ctx, ";")
		require.NoError(t, err)
		d[i] = time.Since(start)
	}
	slices.Sort(d)
	return d
}

// A 1 ms latency each way costs every round trip at least 2 ms. The upper side is noise on a
// shared machine: BenchmarkProxyRoundTrip measures it.
func TestProxyLatency(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	p := pgserver.NewProxy(t, dsn)
	require.NotEqual(t, dsn, p.DSN())
	conn := connect(t, p.DSN())
	base := roundTrips(t, conn, 20)

	require.NoError(t, p.SetLatency(faultproxy.Both, time.Millisecond))
	slow := roundTrips(t, conn, 20)
	assert.GreaterOrEqual(t, slow[0], 2*time.Millisecond, "fastest round trip with 1 ms each way")
	t.Logf("round trip median: %v without latency, %v with 1 ms each way", base[10], slow[10])

	require.NoError(t, p.SetLatency(faultproxy.Downstream, 0))
	up := roundTrips(t, conn, 10)
	assert.GreaterOrEqual(t, up[0], time.Millisecond)

	require.NoError(t, p.Normal())
	// With the latency on, no round trip is under 2 ms; after Normal the fastest of 20 is.
	assert.Less(t, roundTrips(t, conn, 20)[0], 2*time.Millisecond, "latency not removed by Normal")
}

// exec runs sql on conn in a goroutine and returns its result channel.
func execAsync(conn *pgx.Conn, sql string) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := conn.Exec(ctx, sql)
		done <- err
	}()
	return done
}

func TestProxyBlackhole(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	dsn := pgserver.NewDatabase(t)
	direct := connect(t, dsn)
	_, err := direct.Exec(ctx, "create table marks (x int)")
	require.NoError(t, err)
	marks := func() int {
		var n int
		require.NoError(t, direct.QueryRow(ctx, "select count(*) from marks").Scan(&n))
		return n
	}
	p := pgserver.NewProxy(t, dsn)
	conn := connect(t, p.DSN())
	backend := backendPID(t, conn)

	// Upstream: the insert does not reach the server, the session stays.
	require.NoError(t, p.SetBlackhole(faultproxy.Upstream, true))
	done := execAsync(conn, "insert into marks values (1)")
	for range 20 {
		time.Sleep(10 * time.Millisecond) // an absence: nothing to wait for but time
		require.Zero(t, marks(), "data crossed an upstream blackhole")
	}
	var sessions int
	require.NoError(t, direct.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", backend).Scan(&sessions))
	assert.Equal(t, 1, sessions, "the blackholed session was closed")
	assert.Empty(t, done)
	// Healed: the held insert goes through.
	require.NoError(t, p.SetBlackhole(faultproxy.Upstream, false))
	require.NoError(t, <-done)
	assert.Equal(t, 1, marks())

	// Downstream: the insert runs, its reply never comes back until the blackhole ends.
	require.NoError(t, p.SetBlackhole(faultproxy.Downstream, true))
	done = execAsync(conn, "insert into marks values (2)")
	pgserver.Eventually(t, 10*time.Second, "insert through a downstream blackhole", func() bool { return marks() == 2 })
	select {
	case err := <-done:
		t.Fatalf("a reply crossed a downstream blackhole: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, p.Normal())
	require.NoError(t, <-done)
	require.NoError(t, conn.Ping(ctx))
}

func TestProxyReset(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	dsn := pgserver.NewDatabase(t)
	direct := connect(t, dsn)
	p := pgserver.NewProxy(t, dsn)
	conn := connect(t, p.DSN())
	backend := backendPID(t, conn)
	assert.EqualValues(t, 1, p.Accepted())
	assert.Equal(t, 1, p.Open())

	assert.Equal(t, 1, p.Reset())
	assert.ErrorIs(t, conn.Ping(ctx), syscall.ECONNRESET, "a reset session answered, or saw an orderly close")
	pgserver.Eventually(t, 10*time.Second, "the server's side of the reset session ends", func() bool {
		var n int
		require.NoError(t, direct.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = $1", backend).Scan(&n))
		return n == 0
	})
	before := p.Accepted() // pgx may have sent a cancel request through the proxy meanwhile
	require.NoError(t, connect(t, p.DSN()).Ping(ctx), "new connections after a reset")
	assert.GreaterOrEqual(t, p.Accepted(), before+1)
}

func TestProxyRefuse(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	p := pgserver.NewProxy(t, pgserver.NewDatabase(t))
	conn := connect(t, p.DSN())

	require.NoError(t, p.SetRefuse(true))
	_, err := pgx.Connect(ctx, p.DSN())
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.NoError(t, conn.Ping(ctx), "an open session is cut by refusing new ones")
	assert.EqualValues(t, 1, p.Accepted())

	require.NoError(t, p.Normal())
	require.NoError(t, connect(t, p.DSN()).Ping(ctx))
	assert.EqualValues(t, 2, p.Accepted())
}

// A proxy in front of a restarted server: sessions die with the server, the proxy goes on.
func TestProxyAcrossRestart(t *testing.T) {
	t.Parallel() // on a server of its own
	ctx := testCtx(t, time.Minute)
	s := pgserver.NewLocal(t, pgserver.Options{})
	p := pgserver.NewProxy(t, s.DSN())
	conn := connect(t, p.DSN())
	_, err := s.Restart(ctx, pgserver.StopFast)
	require.NoError(t, err)
	assert.Error(t, conn.Ping(ctx))
	require.NoError(t, connect(t, p.DSN()).Ping(ctx))
}

func TestProxyCloseLeaksNothing(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	dsn := pgserver.NewDatabase(t)
	p, err := pgserver.StartProxy(dsn)
	require.NoError(t, err)
	require.NoError(t, p.SetLatency(faultproxy.Both, time.Millisecond))
	conn, err := pgx.Connect(ctx, p.DSN())
	require.NoError(t, err)
	require.NoError(t, conn.Ping(ctx))
	require.NoError(t, p.SetBlackhole(faultproxy.Both, true))
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	assert.Error(t, conn.Ping(ctx))
	conn.Close(ctx)
	goleak.VerifyNone(t)
}

func TestStartProxyBadDSN(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://u:secret@/db?host=/tmp":                 "Unix socket",
		"postgres://u:secret@127.0.0.1:1,127.0.0.1:2/db":    "more than one host",
		"postgres://u:secret@10.1.2.3:5432/db":              "not a loopback address",
		"postgres://u:secret@127.0.0.1:5432/db?port=banana": "invalid DSN",
	} {
		_, err := pgserver.StartProxy(dsn)
		require.ErrorContains(t, err, want, dsn)
		assert.NotContains(t, err.Error(), "secret")
		assert.True(t, strings.HasPrefix(err.Error(), "harness: proxy: "), err.Error())
	}
}

// BenchmarkProxyRoundTrip measures an empty query directly, through a proxy, and through a proxy
// with 1 ms each way: compare the last with Latency=0 (expected: about 2 ms more).
func BenchmarkProxyRoundTrip(b *testing.B) {
	dsn := pgserver.DSN(b)
	p := pgserver.NewProxy(b, dsn)
	for _, bc := range []struct {
		name    string
		dsn     string
		latency time.Duration
	}{
		{"Direct", dsn, 0},
		{"Latency=0", p.DSN(), 0},
		{"Latency=1ms", p.DSN(), time.Millisecond},
	} {
		b.Run(bc.name, func(b *testing.B) {
			require.NoError(b, p.SetLatency(faultproxy.Both, bc.latency))
			conn, err := pgx.Connect(context.Background(), bc.dsn)
			require.NoError(b, err)
			defer conn.Close(context.Background())
			ctx := context.Background()
			for b.Loop() {
				if _, err := conn.Exec(ctx, ";"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
