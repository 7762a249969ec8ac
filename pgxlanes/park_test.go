package pgxlanes

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/internal/wire"
)

// The tests of parking (park.go), against a real PostgreSQL, most beside plain pgxpool: what a
// user can see of the pool must not change.

// parkPools opens pgxlanes and plain pgxpool on one new database, each configured by cfg (nil:
// as parsed), with params added to the DSN.
func parkPools(t *testing.T, params string, cfg func(*pgxpool.Config)) (*Pool, *pgxpool.Pool) {
	t.Helper()
	dsn := withParam(pgserver.NewDatabase(t), params)
	lc, err := ParseConfig(dsn)
	require.NoError(t, err)
	pc, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	if cfg != nil {
		cfg(lc.Config)
		cfg(pc)
	}
	lanes, err := NewWithConfig(context.Background(), lc)
	require.NoError(t, err)
	t.Cleanup(lanes.Close)
	plain, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(plain.Close)
	return lanes, plain
}

// parkPoolsEach is parkPools with a configuration of its own for each pool.
func parkPoolsEach(t *testing.T, params string, lanesCfg, plainCfg func(*pgxpool.Config)) (*Pool, *pgxpool.Pool) {
	t.Helper()
	first := true
	return parkPools(t, params, func(c *pgxpool.Config) {
		if first {
			lanesCfg(c)
		} else {
			plainCfg(c)
		}
		first = false
	})
}

// execBoth runs "select 1" n times on each pool in turn.
func execBoth(t *testing.T, lanes *Pool, plain *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		_, err := lanes.Exec(ctx, "select 1")
		require.NoError(t, err)
		_, err = plain.Exec(ctx, "select 1")
		require.NoError(t, err)
	}
}

// setParkPeriod sets the sweep's period for one test.
func setParkPeriod(t *testing.T, d time.Duration) {
	period := parkPeriod
	parkPeriod = d
	t.Cleanup(func() { parkPeriod = period })
}

// closeWithin closes p, failing the test if Close does not return within d.
func closeWithin(t *testing.T, p *Pool, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatal("Close did not return")
	}
}

func withParam(dsn, params string) string {
	if params == "" {
		return dsn
	}
	for i := range len(dsn) {
		if dsn[i] == '?' {
			return dsn + "&" + params
		}
	}
	return dsn + "?" + params
}

// TestParkingSkipsPgxpool: serial leases take the parked connection, not pgxpool's; Stat counts
// it idle, as pgxpool's own Stat does beside; it goes back to pgxpool within a few periods.
func TestParkingSkipsPgxpool(t *testing.T) {
	ctx := context.Background()
	lanes, plain := parkPools(t, "pool_max_conns=4", nil)
	srv := lanes.servers[0]
	require.True(t, srv.parks.Load())
	_, err := lanes.Exec(ctx, "select 1")
	require.NoError(t, err)
	before := srv.pool.Stat().AcquireCount()
	const n = 200
	execBoth(t, lanes, plain, n)
	assert.LessOrEqual(t, srv.pool.Stat().AcquireCount()-before, int64(n/10), "most leases took the parked connection")
	st, ps := lanes.Stat(), plain.Stat()
	assert.Equal(t, ps.AcquiredConns(), st.AcquiredConns())
	assert.Equal(t, ps.TotalConns(), st.TotalConns())
	assert.Equal(t, ps.IdleConns(), st.IdleConns(), "a parked connection is idle")
	pgserver.Eventually(t, 5*time.Second, "the parked connection is back in pgxpool", func() bool {
		s := srv.pool.Stat()
		return s.IdleConns() == s.TotalConns()
	})
}

// TestParkingOffWithHooks: where the user set what pgxpool calls at each release or acquire,
// every lease goes through pgxpool, which calls them as often as beside.
func TestParkingOffWithHooks(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*pgxpool.Config, *atomic.Int64)
	}{
		{"AfterRelease", func(c *pgxpool.Config, n *atomic.Int64) {
			c.AfterRelease = func(*pgx.Conn) bool { n.Add(1); return true }
		}},
		{"PrepareConn", func(c *pgxpool.Config, n *atomic.Int64) {
			c.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) { n.Add(1); return true, nil }
		}},
		{"ShouldPing", func(c *pgxpool.Config, n *atomic.Int64) {
			c.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { n.Add(1); return false }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nl, np atomic.Int64
			lanes, plain := parkPoolsEach(t, "pool_max_conns=2",
				func(c *pgxpool.Config) { tc.set(c, &nl) }, func(c *pgxpool.Config) { tc.set(c, &np) })
			assert.False(t, lanes.servers[0].parks.Load())
			const n = 50
			execBoth(t, lanes, plain, n)
			// AfterRelease runs in a goroutine of pgxpool's after Release returns.
			pgserver.Eventually(t, 5*time.Second, "the hooks ran", func() bool { return nl.Load() >= n && np.Load() >= n })
			assert.Equal(t, np.Load(), nl.Load())
		})
	}
	assert.False(t, parkingAllowed(&pgxpool.Config{ConnConfig: &pgx.ConnConfig{}, MinIdleConns: 1}))
	assert.False(t, parkingAllowed(&pgxpool.Config{ConnConfig: &pgx.ConnConfig{}, MaxConnIdleTime: 100 * time.Millisecond}))
	assert.False(t, parkingAllowed(&pgxpool.Config{ConnConfig: &pgx.ConnConfig{}, HealthCheckPeriod: 100 * time.Millisecond}))
	//lint:ignore SA1019 a BeforeAcquire the user set still runs at every acquire of pgxpool's
	assert.False(t, parkingAllowed(&pgxpool.Config{ConnConfig: &pgx.ConnConfig{}, BeforeAcquire: func(context.Context, *pgx.Conn) bool { return true }}))
	assert.False(t, parkingAllowed(&pgxpool.Config{ConnConfig: &pgx.ConnConfig{Tracer: acquireTracer{}}}))
	assert.False(t, parkingAllowed(&pgxpool.Config{ConnConfig: &pgx.ConnConfig{Tracer: releaseTracer{}}}))
	assert.True(t, parkingAllowed(&pgxpool.Config{ConnConfig: &pgx.ConnConfig{}}))
}

type acquireTracer struct{ pgx.QueryTracer }

func (acquireTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return ctx
}
func (acquireTracer) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {}

type releaseTracer struct{ pgx.QueryTracer }

func (releaseTracer) TraceRelease(*pgxpool.Pool, pgxpool.TraceReleaseData) {}

// TestParkingIdleTimeForPing: a connection idle a second, part of it parked, is pinged before it is
// handed out, as pgxpool pings one idle a second: one whose backend was terminated meanwhile is
// found dead and replaced, and the call succeeds.
func TestParkingIdleTimeForPing(t *testing.T) {
	ctx := context.Background()
	lanes, plain := parkPools(t, "pool_max_conns=1", nil)
	admin, err := pgx.Connect(ctx, pgserver.NewDatabase(t))
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(ctx) })
	for _, tc := range []struct {
		name string
		q    interface {
			QueryRow(context.Context, string, ...any) pgx.Row
		}
	}{{"pgxpool", plain}, {"pgxlanes", lanes}} {
		t.Run(tc.name, func(t *testing.T) {
			pid := backendPID(t, tc.q) // then idle (parked, then in pgxpool after the sweep)
			_, err := admin.Exec(ctx, "select pg_terminate_backend($1)", pid)
			require.NoError(t, err)
			time.Sleep(1020 * time.Millisecond) // over pgxpool's second, counted from the lease's end
			var n int
			require.NoError(t, tc.q.QueryRow(ctx, "select 1").Scan(&n), "the dead connection was pinged and replaced")
		})
	}
}

// TestParkingKeepsLifetime: a connection past MaxConnLifetime is not parked: a busy serial caller
// gets new sessions as often as beside.
func TestParkingKeepsLifetime(t *testing.T) {
	lanes, plain := parkPools(t, "pool_max_conns=2", func(c *pgxpool.Config) {
		c.MaxConnLifetime, c.MaxConnLifetimeJitter = 300*time.Millisecond, 0
	})
	require.True(t, lanes.servers[0].parks.Load())
	pl, pp := map[int32]bool{}, map[int32]bool{}
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		pl[backendPID(t, lanes)] = true
		pp[backendPID(t, plain)] = true
	}
	assert.GreaterOrEqual(t, len(pp), 3, "pgxpool: new sessions")
	assert.GreaterOrEqual(t, len(pl), 3, "pgxlanes: new sessions, as pgxpool (%d)", len(pp))
}

// TestParkingReset: Reset closes the idle (parked) connection and one leased at the time, as
// pgxpool's Reset closes its idle and acquired ones.
func TestParkingReset(t *testing.T) {
	ctx := context.Background()
	lanes, plain := parkPools(t, "pool_max_conns=3", nil)
	type pool interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}
	for _, tc := range []struct {
		name  string
		q     pool
		held  func() (pool, func())
		reset func()
	}{
		{"pgxpool", plain, func() (pool, func()) {
			c, err := plain.Acquire(ctx)
			require.NoError(t, err)
			return c, c.Release
		}, plain.Reset},
		{"pgxlanes", lanes, func() (pool, func()) {
			c, err := lanes.Acquire(WithLane(ctx, Short))
			require.NoError(t, err)
			return c, c.Release
		}, lanes.Reset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, release := tc.held()
			heldPID := backendPID(t, c)
			idle := backendPID(t, tc.q) // another connection: idle (parked) once it returns
			require.NotEqual(t, heldPID, idle)
			if tc.name == "pgxlanes" {
				require.Equal(t, int32(1), lanes.Stat().IdleConns()-lanes.servers[0].pool.Stat().IdleConns(), "one connection parked")
			}
			tc.reset()
			release()
			seen := map[int32]bool{}
			for range 10 {
				seen[backendPID(t, tc.q)] = true
			}
			assert.False(t, seen[idle], "the idle (parked) connection was closed")
			assert.False(t, seen[heldPID], "the connection held across Reset was closed at its release")
		})
	}
}

// TestParkingResetRace: a lease that takes a connection between the two steps of Reset (pgxpool's,
// then the parking's) does not keep a connection from before the Reset in use. (The steps are
// run here one by one, with the lease between them.)
func TestParkingResetRace(t *testing.T) {
	ctx := context.Background()
	lanes, _ := parkPools(t, "pool_max_conns=2", nil)
	srv := lanes.servers[0]
	old := backendPID(t, lanes) // parked
	srv.pool.Reset()            // Reset's first step
	c, err := lanes.Acquire(WithLane(ctx, Short))
	require.NoError(t, err)
	require.Equal(t, old, backendPID(t, c), "the lease took the parked connection")
	srv.park.flush(true, false) // Reset's second step
	c.Release()
	for range 20 {
		assert.NotEqual(t, old, backendPID(t, lanes), "a session from before Reset is still in use")
	}
}

// TestParkingExpiresWhileParked: a connection that outlives MaxConnLifetime while parked is not
// handed out, as pgxpool's Acquire does not hand out an idle one.
func TestParkingExpiresWhileParked(t *testing.T) {
	const life = 600 * time.Millisecond
	lanes, plain := parkPools(t, "pool_max_conns=1", func(c *pgxpool.Config) {
		c.MaxConnLifetime, c.MaxConnLifetimeJitter = life, 0
	})
	for _, tc := range []struct {
		name string
		q    interface {
			QueryRow(context.Context, string, ...any) pgx.Row
		}
	}{{"pgxpool", plain}, {"pgxlanes", lanes}} {
		t.Run(tc.name, func(t *testing.T) {
			// The first call opens the connection: it is born between born and made (a slow dial
			// on a loaded machine made the test fail when its life was counted from made).
			born := time.Now()
			first := backendPID(t, tc.q)
			made := time.Now()
			// Until shortly before its end, keep the connection busy (and parked in between); then
			// let it expire while parked (or idle), for less than the sweep's shortest stay
			// (parkPeriod) when the dial was quick, and look again: the parked connection is then
			// still parked.
			for time.Since(born) < life-15*time.Millisecond {
				require.Equal(t, first, backendPID(t, tc.q))
			}
			time.Sleep(time.Until(made.Add(life + 20*time.Millisecond)))
			assert.NotEqual(t, first, backendPID(t, tc.q), "an expired connection was handed out")
		})
	}
}

// TestParkingExpiresDuringFleetWait: a Long call that waited for a fleet slot (not for a lane
// slot) is not handed a connection that expired while it waited: the take reads the clock after
// any wait. (From the second review of the branch.)
func TestParkingExpiresDuringFleetWait(t *testing.T) {
	setParkPeriod(t, 2*time.Second) // the connection stays parked throughout (test only)
	ctx := context.Background()
	dsn := withParam(pgserver.NewDatabase(t), "pool_max_conns=4&lane_long_fleet_max_conns=1&lane_long_acquire_timeout=10s")
	const life = 400 * time.Millisecond
	open := func(cfg func(*pgxpool.Config)) *Pool {
		lc, err := ParseConfig(dsn)
		require.NoError(t, err)
		if cfg != nil {
			cfg(lc.Config)
		}
		p, err := NewWithConfig(ctx, lc)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	a := open(nil)
	b := open(func(c *pgxpool.Config) { c.MaxConnLifetime, c.MaxConnLifetimeJitter = life, 0 })
	require.True(t, b.servers[0].parks.Load())
	held, err := a.Acquire(WithLane(ctx, Long)) // the fleet's one slot
	require.NoError(t, err)
	old := backendPID(t, b) // a fresh connection, parked
	born := time.Now()
	got := make(chan int32, 1)
	go func() {
		var pid int32
		err := b.QueryRow(WithLane(ctx, Long), "select pg_backend_pid()").Scan(&pid)
		assert.NoError(t, err)
		got <- pid
	}()
	time.Sleep(time.Until(born.Add(life + 100*time.Millisecond))) // old expires while parked
	require.Equal(t, int32(1), b.Stat().IdleConns()-b.servers[0].pool.Stat().IdleConns(), "old still parked")
	held.Release()
	pid := <-got
	t.Logf("old %d, Long got %d, %v after old was born", old, pid, time.Since(born))
	assert.NotEqual(t, old, pid, "a Long acquire that waited for the fleet was handed a connection past MaxConnLifetime")
}

// TestParkingOffWithPgxpoolView: pgxpool exporters read pgxpool's own Stat through PgxpoolView,
// in which a parked connection would be acquired and a lease served from the stack not counted:
// taking a view turns parking off, and its figures count every lease, as pgxpool's beside.
func TestParkingOffWithPgxpoolView(t *testing.T) {
	ctx := context.Background()
	lanes, plain := parkPools(t, "pool_max_conns=2", nil)
	_, err := lanes.Exec(ctx, "select 1") // one parked
	require.NoError(t, err)
	view := lanes.PgxpoolView()
	srv := lanes.servers[0]
	assert.False(t, srv.parks.Load())
	// A lease that read parks before the view was taken ends after it: it must not park.
	pc, err := srv.pool.Acquire(ctx)
	require.NoError(t, err)
	assert.False(t, srv.park.put(pc, wireOf(pc.Conn().PgConn()), srv.park.current(), monoNow()), "parked after PgxpoolView")
	pc.Release()
	before, beforePlain := view.Stat().AcquireCount(), plain.Stat().AcquireCount()
	const n = 50
	execBoth(t, lanes, plain, n)
	assert.Equal(t, plain.Stat().AcquireCount()-beforePlain, view.Stat().AcquireCount()-before)
	assert.Equal(t, plain.Stat().AcquiredConns(), view.Stat().AcquiredConns())
	assert.Equal(t, plain.Stat().IdleConns(), view.Stat().IdleConns())
}

// TestParkingAcquireAllIdle: AcquireAllIdle gets the parked connections too.
func TestParkingAcquireAllIdle(t *testing.T) {
	ctx := WithLane(context.Background(), Short)
	lanes, _ := parkPools(t, "pool_max_conns=4", nil)
	c1, err := lanes.Acquire(ctx)
	require.NoError(t, err)
	c2, err := lanes.Acquire(ctx)
	require.NoError(t, err)
	c1.Release()
	c2.Release() // both parked: pgxpool has none idle
	require.Equal(t, int32(2), lanes.Stat().IdleConns()-lanes.servers[0].pool.Stat().IdleConns(), "two parked")
	conns := lanes.AcquireAllIdle(ctx)
	assert.Len(t, conns, 2)
	for _, c := range conns {
		c.Release()
	}
}

// TestParkingNotWhileAcquiring: a connection is not parked while a lease is inside pgxpool's
// acquire (it may be waiting for that very connection).
func TestParkingNotWhileAcquiring(t *testing.T) {
	ctx := context.Background()
	lanes, _ := parkPools(t, "pool_max_conns=2", nil)
	srv := lanes.servers[0]
	pc, err := srv.pool.Acquire(ctx)
	require.NoError(t, err)
	w := wireOf(pc.Conn().PgConn())
	got, _ := srv.park.take(func(*wire.Conn) bool { return false })
	require.Nil(t, got, "nothing parked: the caller goes to pgxpool")
	assert.False(t, srv.park.put(pc, w, srv.park.current(), monoNow()), "not parked while an acquire is in pgxpool")
	srv.park.acquired()
	assert.True(t, srv.park.put(pc, w, srv.park.current(), monoNow()))
	assert.False(t, srv.park.put(pc, w, srv.park.current()-1, monoNow()), "not parked: acquired before a Reset")
	got, _ = srv.park.take(func(*wire.Conn) bool { return false })
	assert.Same(t, pc, got)
	got.Release()
}

// onLane runs QueryRow on lane l of p.
type onLane struct {
	p *Pool
	l Lane
}

func (o onLane) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return o.p.QueryRow(WithLane(ctx, o.l), sql, args...)
}

// TestParkingOnASecondServer: with Long aimed at another server, its leases park on that server's
// stack; Stat counts those parked too; Reset and Close release both servers' parked connections.
func TestParkingOnASecondServer(t *testing.T) {
	ctx := context.Background()
	cfg, err := ParseConfig(withParam(pgserver.NewDatabase(t), "pool_max_conns=3"))
	require.NoError(t, err)
	rc, err := pgxpool.ParseConfig(withParam(pgserver.NewDatabase(t), "pool_max_conns=2"))
	require.NoError(t, err)
	cfg.Long.Server = rc
	lanes, err := NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	primary, second := lanes.lanes[Short].srv, lanes.lanes[Long].srv
	require.NotSame(t, primary, second)
	require.True(t, second.parks.Load())
	old := backendPID(t, onLane{lanes, Long})
	before := second.pool.Stat().AcquireCount()
	for range 50 {
		assert.Equal(t, old, backendPID(t, onLane{lanes, Long}), "the parked connection")
	}
	assert.LessOrEqual(t, second.pool.Stat().AcquireCount()-before, int64(5), "Long's leases took the parked connection")
	backendPID(t, lanes) // one parked on the primary too
	st := lanes.Stat()
	assert.Equal(t, st.TotalConns(), st.IdleConns(), "both parked connections are idle")
	lanes.Reset()
	assert.NotEqual(t, old, backendPID(t, onLane{lanes, Long}), "Reset closed the parked connection of the second server")
	// No sweep from here on: Close must release both servers' parked connections itself.
	setParkPeriod(t, time.Hour)
	backendPID(t, onLane{lanes, Long})
	backendPID(t, lanes)
	closeWithin(t, lanes, 10*time.Second)
}

// TestParkingStress: leases of every kind from many goroutines on few connections; no call
// fails, the pool never has more connections than MaxConns, and at the end every connection is
// back in pgxpool; Close leaves no goroutine.
func TestParkingStress(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	dsn := withParam(pgserver.NewDatabase(t), "pool_max_conns=3&lane_short_reserved=1&lane_tx_reserved=1&lane_long_reserved=0")
	lanes, err := New(ctx, dsn)
	require.NoError(t, err)
	srv := lanes.servers[0]
	require.True(t, srv.parks.Load())
	// No sweep from here on: Close must release what is parked itself (pgxpool's Close waits
	// for every acquired connection).
	setParkPeriod(t, time.Hour)
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	var over atomic.Int32
	for g := range 24 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for time.Now().Before(stop) {
				var err error
				switch r.IntN(4) {
				case 0:
					_, err = lanes.Exec(ctx, "select 1")
				case 1:
					var c *Conn
					if c, err = lanes.Acquire(WithLane(ctx, Short)); err == nil {
						time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
						_, err = c.Exec(ctx, "select 1")
						c.Release()
					}
				case 2:
					err = pgx.BeginFunc(ctx, lanes, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, "select 1"); return err })
				default:
					var n int
					err = lanes.QueryRow(WithLane(ctx, Long), "select 1").Scan(&n)
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				if st := srv.pool.Stat(); st.TotalConns() > 3 {
					over.Store(st.TotalConns())
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Zero(t, over.Load(), "more connections than MaxConns")
	assert.Equal(t, lanes.Stat().TotalConns(), lanes.Stat().IdleConns(), "every connection idle (parked or in pgxpool)")
	assert.Positive(t, lanes.Stat().IdleConns()-srv.pool.Stat().IdleConns(), "some parked")
	_, err = lanes.Exec(ctx, "select 1") // one parked now: Close must release it
	require.NoError(t, err)
	closeWithin(t, lanes, 10*time.Second)
}

// TestParkingStatDuringSweep: with no lease held, Stat counts every connection idle and none
// acquired at every moment, while the sweep gives parked connections back to pgxpool; a
// connection the sweep has taken off the stack and not yet given back would count as acquired.
func TestParkingStatDuringSweep(t *testing.T) {
	setParkPeriod(t, time.Millisecond) // sweeps all the time (test only)
	ctx := context.Background()
	const conns = 6 // the Tx lane's cap in a pool of 8
	lanes, _ := parkPools(t, "pool_max_conns=8", nil)
	srv := lanes.servers[0]
	require.True(t, srv.parks.Load())
	deadline := time.Now().Add(2 * time.Second)
	var bad, parkedSeen int
	for time.Now().Before(deadline) && bad == 0 {
		held := make([]*Conn, 0, conns)
		for range conns {
			c, err := lanes.Acquire(ctx)
			require.NoError(t, err)
			held = append(held, c)
		}
		for _, c := range held {
			c.Release() // all parked: none acquires meanwhile
		}
		for range 2000 {
			st := lanes.Stat()
			if st.parked > 0 {
				parkedSeen++
			}
			if st.AcquiredConns() != 0 || st.IdleConns() != st.TotalConns() {
				bad++
				t.Errorf("no lease held, Stat: acquired %d, idle %d of %d", st.AcquiredConns(), st.IdleConns(), st.TotalConns())
				break
			}
			if st.parked == 0 {
				break // all swept
			}
		}
	}
	assert.Positive(t, parkedSeen, "Stat saw parked connections")
}

// countingAcquireTracer counts the acquires traced, as otelpgx's Tracer (an AcquireTracer, not a
// ReleaseTracer) would trace them.
type countingAcquireTracer struct{ starts, ends atomic.Int64 }

func (c *countingAcquireTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *countingAcquireTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *countingAcquireTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	c.starts.Add(1)
	return ctx
}
func (c *countingAcquireTracer) TraceAcquireEnd(_ context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if d.Err == nil {
		c.ends.Add(1)
	}
}

// statAcquireTracer is an AcquireTracer that reads the pool it is handed at each acquire's start
// and end, as a tracer that records the pool's figures on its acquire spans would.
type statAcquireTracer struct {
	mu                       sync.Mutex
	startIdle, startAcquired []int32
	endAcquireCount          []int64
}

func (c *statAcquireTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *statAcquireTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *statAcquireTracer) TraceAcquireStart(ctx context.Context, p *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	s := p.Stat()
	c.mu.Lock()
	c.startIdle = append(c.startIdle, s.IdleConns())
	c.startAcquired = append(c.startAcquired, s.AcquiredConns())
	c.mu.Unlock()
	return ctx
}
func (c *statAcquireTracer) TraceAcquireEnd(_ context.Context, p *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	c.mu.Lock()
	c.endAcquireCount = append(c.endAcquireCount, p.Stat().AcquireCount())
	c.mu.Unlock()
}

// TestParkingOffWithAcquireTracer: an AcquireTracer is handed the *pgxpool.Pool under the lanes,
// whose Stat would count a parked connection as acquired and miss the leases served from the
// stack; so parking is off with one, and what it reads is what it reads beside plain pgxpool.
// (Found by the third review: with parking on, idle [0 0 0 0 0] against [0 1 1 1 1] beside.)
func TestParkingOffWithAcquireTracer(t *testing.T) {
	tl, tp := &statAcquireTracer{}, &statAcquireTracer{}
	lanes, plain := parkPoolsEach(t, "pool_max_conns=2",
		func(c *pgxpool.Config) { c.ConnConfig.Tracer = tl }, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tp })
	assert.False(t, lanes.servers[0].parks.Load())
	execBoth(t, lanes, plain, 5)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	assert.Equal(t, tp.startIdle, tl.startIdle, "IdleConns seen by the AcquireTracer")
	assert.Equal(t, tp.startAcquired, tl.startAcquired, "AcquiredConns seen by the AcquireTracer")
	assert.Equal(t, tp.endAcquireCount, tl.endAcquireCount, "AcquireCount seen by the AcquireTracer")
}

// TestAcquireAllIdleTracesNothing: pgxpool's AcquireAllIdle calls no AcquireTracer, and neither
// does pgxlanes': a TraceAcquireEnd without its start would end the caller's own span (otelpgx).
func TestAcquireAllIdleTracesNothing(t *testing.T) {
	ctx := context.Background()
	tl, tp := &countingAcquireTracer{}, &countingAcquireTracer{}
	lanes, plain := parkPoolsEach(t, "pool_max_conns=4",
		func(c *pgxpool.Config) { c.ConnConfig.Tracer = tl }, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tp })
	execBoth(t, lanes, plain, 1)
	sl, el, sp, ep := tl.starts.Load(), tl.ends.Load(), tp.starts.Load(), tp.ends.Load()
	got := lanes.AcquireAllIdle(ctx)
	require.NotEmpty(t, got)
	for _, c := range got {
		c.Release()
	}
	for _, c := range plain.AcquireAllIdle(ctx) {
		c.Release()
	}
	assert.Equal(t, tp.starts.Load()-sp, tl.starts.Load()-sl, "TraceAcquireStart, as beside")
	assert.Equal(t, tp.ends.Load()-ep, tl.ends.Load()-el, "TraceAcquireEnd, as beside")
}

// TestParkingResetDuringDial: a connection whose dial began before a Reset (here one of
// MinConns, which pgxpool dials in the background and puts idle without looking at the Reset)
// serves no more leases after the Reset than beside plain pgxpool, which closes it at its first
// release. (Found by the third review: parked by the lease that took it, it served 20 of 20.)
func TestParkingResetDuringDial(t *testing.T) {
	type dial struct {
		pid             atomic.Uint32
		entered, resume chan struct{}
	}
	hook := func(d *dial) func(*pgxpool.Config) {
		var first atomic.Bool
		return func(c *pgxpool.Config) {
			c.MinConns = 1
			c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				if first.CompareAndSwap(false, true) {
					d.pid.Store(conn.PgConn().PID())
					close(d.entered)
					<-d.resume // the Reset lands here, during the dial
				}
				return nil
			}
		}
	}
	dl := &dial{entered: make(chan struct{}), resume: make(chan struct{})}
	dp := &dial{entered: make(chan struct{}), resume: make(chan struct{})}
	lanes, plain := parkPoolsEach(t, "pool_max_conns=3", hook(dl), hook(dp))
	require.True(t, lanes.servers[0].parks.Load(), "MinConns leaves parking on")
	<-dl.entered
	<-dp.entered
	lanes.Reset()
	plain.Reset()
	close(dl.resume)
	close(dp.resume)
	pgserver.Eventually(t, 10*time.Second, "the dials ended", func() bool {
		return lanes.servers[0].pool.Stat().IdleConns() >= 1 && plain.Stat().IdleConns() >= 1
	})
	count := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, pid uint32) int {
		n := 0
		for range 20 {
			if uint32(backendPID(t, q)) == pid {
				n++
			}
		}
		return n
	}
	np, nl := count(plain, dp.pid.Load()), count(lanes, dl.pid.Load())
	assert.LessOrEqual(t, np, 1, "pgxpool closes it at its first release")
	assert.LessOrEqual(t, nl, np, "leases served by the session dialed before Reset, against beside")
}
