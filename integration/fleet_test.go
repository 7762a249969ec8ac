package integration

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestFleetCapOnLong: two pools stand in for two replicas of a service. Each may run 3 Long calls
// at once, the fleet 2: sampled throughout, pg_stat_activity never shows more than 2 Long
// statements active, and every call completes.
func TestFleetCapOnLong(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	const params = "pool_max_conns=8&lane_long_max_conns=3&lane_long_reserved=3&lane_long_fleet_max_conns=2&lane_long_acquire_timeout=2m"
	replicas := []*pgxlanes.Pool{newLanes(t, dsn, params), newLanes(t, dsn, params)}
	watch, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer watch.Close(bg)

	const report = "select pg_sleep(0.15) /* nightly report */"
	stop := time.Now().Add(3 * time.Second)
	var done, failed atomic.Int64
	var peak atomic.Int64
	var wg sync.WaitGroup
	for _, p := range replicas {
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					if _, err := p.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), report); err != nil {
						failed.Add(1)
						t.Errorf("long call: %v", err)
						return
					}
					done.Add(1)
				}
			}()
		}
	}
	sampling := make(chan struct{})
	samples := 0
	var waitingSeen int
	go func() {
		defer close(sampling)
		for time.Now().Before(stop.Add(time.Second)) {
			var n int64
			if err := watch.QueryRow(bg, "select count(*) from pg_stat_activity where state = 'active' and query = $1", report).Scan(&n); err != nil {
				return
			}
			samples++
			if n > peak.Load() {
				peak.Store(n)
			}
			waitingSeen = max(waitingSeen, replicas[0].Stat().Lane(pgxlanes.Long).FleetWaiting)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	wg.Wait()
	<-sampling
	t.Logf("%d Long calls done, %d failed; %d samples of pg_stat_activity, peak %d active; a replica had up to %d callers waiting for a fleet slot",
		done.Load(), failed.Load(), samples, peak.Load(), waitingSeen)
	assert.LessOrEqual(t, peak.Load(), int64(2), "the fleet cap held")
	assert.Equal(t, int64(2), peak.Load(), "the fleet used its 2 slots")
	assert.Greater(t, samples, 100)
	assert.Greater(t, waitingSeen, 0, "callers waited for a fleet slot, visibly")
	for _, p := range replicas {
		lanesIdle(t, p, "after the reports")
		assert.Zero(t, p.Stat().Lane(pgxlanes.Long).FleetHeld)
	}
	// Every fleet slot is given back to the server, not only to the pools' books.
	pgserver.Eventually(t, 5*time.Second, "no advisory lock left", func() bool {
		var n int
		require.NoError(t, watch.QueryRow(bg, "select count(*) from pg_locks where locktype = 'advisory'").Scan(&n))
		return n == 0
	})
}

// killFleetSide terminates one of pool p's fleet sessions from outside, as a firewall or an
// administrator would, and returns its PID. sides lists the fleet sessions before: the one with
// the lowest PID not yet in killed is ended.
func killFleetSide(t *testing.T, admin *pgx.Conn, killed map[int32]bool) int32 {
	t.Helper()
	bg := context.Background()
	rows, err := admin.Query(bg, `select pid from pg_stat_activity where application_name = 'pgxlanes fleet'
		and datname = current_database() order by pid`)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	for _, pid := range pids {
		if !killed[pid] {
			killed[pid] = true
			var ok bool
			require.NoError(t, admin.QueryRow(bg, "select pg_terminate_backend($1, 5000)", pid).Scan(&ok))
			require.True(t, ok)
			return pid
		}
	}
	t.Fatalf("no fleet session left to end (sessions %v, ended %v)", pids, killed)
	return 0
}

// fleetLockHolders counts the sessions holding an advisory lock of the fleet named name, slot.
func fleetLockHolders(t *testing.T, admin *pgx.Conn) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), `select count(*) from pg_locks
		where locktype = 'advisory' and granted and database = (select oid from pg_database where datname = current_database())`).Scan(&n))
	return n
}

// TestFleetCapHoldsWhenAFleetSessionDies: two replicas, a fleet cap of 1. A holds a Long lease;
// B's Long calls time out waiting for the fleet's slot. Then A's fleet sessions are ended from
// outside, one after the other, each after A has repaired the previous loss: the server frees
// that session's locks, and still B never gets the slot while A's lease runs. Once A's lease
// ends, B gets it.
func TestFleetCapHoldsWhenAFleetSessionDies(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	const params = "pool_max_conns=4&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=1&lane_long_acquire_timeout=250ms"
	a := newLanes(t, dsn, params)
	warmLong(t, a)
	held, err := a.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	t.Cleanup(held.Release) // before the pool's Close, which waits for it
	admin, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer admin.Close(bg)
	pgserver.Eventually(t, 5*time.Second, "A's slot held on both its fleet sessions", func() bool { return fleetLockHolders(t, admin) == 2 })
	b := newLanes(t, dsn, params)
	_, err = b.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout, "the fleet is full")
	require.ErrorContains(t, err, "fleet slot")

	killed := map[int32]bool{}
	for round := range 4 {
		pid := killFleetSide(t, admin, killed)
		// B tries for a second while A has one session left, and then while A repairs.
		for range 4 {
			_, err = b.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
			require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout, "round %d (fleet session %d ended): 2 Long calls against a cap of 1", round, pid)
			require.ErrorContains(t, err, "fleet slot")
		}
		pgserver.Eventually(t, 5*time.Second, "A retook the slot on a new session", func() bool { return fleetLockHolders(t, admin) == 2 })
	}
	_, err = held.Exec(bg, "select 1")
	require.NoError(t, err, "A's lease ran on throughout")
	held.Release()
	start := time.Now()
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	_, err = b.Exec(pgxlanes.WithLane(pgxlanes.WithBudget(ctx, 0), pgxlanes.Long), "select 1")
	if errors.Is(err, pgxlanes.ErrAcquireTimeout) { // the give-back is in the background
		_, err = b.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select 1")
	}
	require.NoError(t, err)
	t.Logf("B got the fleet's slot %v after A's lease ended", fmtDur(time.Since(start)))
}

// TestFleetEpochAfterBothSessionsLost: when a replica loses both fleet sessions at once (what a
// server restart does, though a restart also ends the leases), the server holds none of its
// slots. It then admits no new Long call until it holds a slot again for every lease still
// running: here its one lease keeps the cap of 1 for itself, retaken on new sessions, and a
// second Long call waits.
func TestFleetEpochAfterBothSessionsLost(t *testing.T) {
	ignore := goleak.IgnoreCurrent() // runs last: after the pools closed, their goroutines are gone
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	bg := context.Background()
	dsn := newDB(t, 1)
	const params = "pool_max_conns=4&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=1&lane_long_acquire_timeout=300ms"
	a := newLanes(t, dsn, params)
	warmLong(t, a)
	held, err := a.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	t.Cleanup(held.Release)
	admin, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer admin.Close(bg)
	pgserver.Eventually(t, 5*time.Second, "the slot held on both fleet sessions", func() bool { return fleetLockHolders(t, admin) == 2 })
	var n int
	require.NoError(t, admin.QueryRow(bg, `select count(pg_terminate_backend(pid, 5000)) from pg_stat_activity
		where application_name = 'pgxlanes fleet' and datname = current_database()`).Scan(&n))
	require.Equal(t, 2, n)
	for range 5 {
		_, err = a.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
		require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout, "the running lease still counts against the cap")
		require.ErrorContains(t, err, "fleet")
	}
	pgserver.Eventually(t, 5*time.Second, "the running lease's slot retaken", func() bool { return fleetLockHolders(t, admin) == 2 })
	held.Release()
	pgserver.Eventually(t, 5*time.Second, "a Long call admitted once the lease ended", func() bool {
		_, err := a.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
		return err == nil
	})
}

// TestFleetsOfDifferentNamesAreSeparate: the fleet is every pool with the same fleet name on the
// server (lane_long_fleet_name; by default the database and user). A service that holds its slot
// does not take a slot of another service; two pools with the default name share theirs.
func TestFleetsOfDifferentNamesAreSeparate(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	const base = "pool_max_conns=6&lane_long_max_conns=3&lane_long_reserved=3&lane_long_acquire_timeout=1s&lane_long_fleet_max_conns=1"
	orders := newLanes(t, dsn, base+"&lane_long_fleet_name=orders")
	billing := newLanes(t, dsn, base+"&lane_long_fleet_name=billing")
	c, err := orders.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	t.Cleanup(c.Release)
	c2, err := billing.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err, "the other service's slot is not this fleet's")
	t.Cleanup(c2.Release)
	require.Equal(t, 1, billing.Stat().Lane(pgxlanes.Long).FleetHeld)
	// Its own fleet is full: a second Long call of billing waits for a fleet slot, though its
	// lane has room, then times out.
	_, err = billing.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout)
	require.ErrorContains(t, err, "fleet slot")
	// Two pools with the default name are one fleet.
	d1, d2 := newLanes(t, dsn, base), newLanes(t, dsn, base)
	c3, err := d1.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	t.Cleanup(c3.Release)
	_, err = d2.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout, "the default name is shared by the pools of a service")
}

// TestFleetCapThroughServerRestart: a server restart ends every session, the fleet's and the
// leases' alike. The replica whose Long lease was running (its owner has not released it yet)
// admits no new Long call, retakes the lease's slot once the server is back, and so keeps the
// other replica out until the lease is released.
func TestFleetCapThroughServerRestart(t *testing.T) {
	ignore := goleak.IgnoreCurrent() // runs last: after the pools closed, their goroutines are gone
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	bg := context.Background()
	srv := pgserver.NewLocal(t, pgserver.Options{})
	const params = "pool_max_conns=4&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=1&lane_long_acquire_timeout=300ms"
	a, b := newLanes(t, srv.DSN(), params), newLanes(t, srv.DSN(), params)
	warmLong(t, a)
	warmLong(t, b)
	held, err := a.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	t.Cleanup(held.Release)
	ctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	_, err = srv.Restart(ctx, pgserver.StopFast)
	require.NoError(t, err)
	_, err = held.Exec(bg, "select 1")
	require.Error(t, err, "the lease's session ended with the server")
	admin := adminConn(t, srv.DSN())
	pgserver.Eventually(t, 10*time.Second, "the running lease's slot retaken on the new sessions", func() bool {
		return fleetLockHolders(t, admin) == 2
	})
	_, err = a.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout, "a's lease still counts against the cap")
	require.ErrorContains(t, err, "fleet")
	_, err = b.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout, "b waits: 2 Long leases against a cap of 1 otherwise")
	require.ErrorContains(t, err, "fleet slot")
	held.Release()
	pgserver.Eventually(t, 10*time.Second, "b admitted once a's lease ended", func() bool {
		_, err := b.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
		return err == nil
	})
}

// TestFleetWaiterWokenByClose: a Long caller that holds its lane slot and waits for a fleet slot
// (another replica holds the fleet's one) is woken by Close with ErrClosed at once, as pgxpool's
// Close wakes its waiters, rather than polling on until Long's acquire timeout.
func TestFleetWaiterWokenByClose(t *testing.T) {
	ignore := goleak.IgnoreCurrent() // runs last: after the pools closed, their goroutines are gone
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	bg := context.Background()
	dsn := newDB(t, 1)
	const params = "pool_max_conns=4&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=1&lane_long_acquire_timeout=20s"
	other := newLanes(t, dsn, params) // another replica: it holds the fleet's one slot
	held, err := other.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	defer held.Release()

	p, err := pgxlanes.New(bg, withParams(dsn, params))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
		done <- err
	}()
	require.Eventually(t, func() bool { return p.Stat().Lane(pgxlanes.Long).FleetWaiting == 1 }, 10*time.Second, 10*time.Millisecond)
	p.Close()
	closed := time.Now()
	select {
	case err := <-done:
		t.Logf("the waiter returned %v after Close: %v", time.Since(closed).Round(time.Millisecond), err)
		assert.ErrorIs(t, err, pgxlanes.ErrClosed)
		assert.NotErrorIs(t, err, pgxlanes.ErrAcquireTimeout)
	case <-time.After(15 * time.Second):
		t.Fatal("the fleet waiter was not woken by Close")
	}
	assert.Zero(t, p.Stat().Lane(pgxlanes.Long).InUse, "the waiter gave its lane slot back")
}

// TestFleetCapOnAcquireAllIdle: AcquireAllIdle on Long takes a fleet slot for each connection it
// hands out, as Acquire does: with a fleet cap of 1 and two idle connections, it hands out one,
// and the fleet's books count it.
func TestFleetCapOnAcquireAllIdle(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	p := newLanes(t, dsn, "pool_max_conns=6&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=1")
	// Two idle connections in the pool.
	a, err := p.Acquire(bg)
	require.NoError(t, err)
	b, err := p.Acquire(bg)
	require.NoError(t, err)
	a.Release()
	b.Release()

	conns := p.AcquireAllIdle(pgxlanes.WithLane(bg, pgxlanes.Long))
	st := p.Stat().Lane(pgxlanes.Long)
	t.Logf("AcquireAllIdle on Long: %d connections; Long in use %d, fleet slots held %d", len(conns), st.InUse, st.FleetHeld)
	assert.Len(t, conns, 1, "Long connections held at once against a fleet cap of 1")
	assert.Equal(t, st.InUse, st.FleetHeld, "every Long lease holds a fleet slot")
	for _, c := range conns {
		c.Release()
	}
	require.Eventually(t, func() bool { return p.Stat().Lane(pgxlanes.Long).FleetHeld == 0 }, 10*time.Second, 10*time.Millisecond,
		"the fleet slot is given back with the connection")
	_, err = p.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.NoError(t, err, "the fleet slot is free again for a Long call")
}

// fleetSides waits until the pool of the database of admin has both its fleet sessions open and
// idle, so that no statement of the fleet's is under way.
func fleetSides(t *testing.T, admin *pgx.Conn) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(context.Background(), `select count(*) from pg_stat_activity
			where application_name = 'pgxlanes fleet' and datname = current_database() and state = 'idle'`).Scan(&n)
		return err == nil && n == 2
	}, 10*time.Second, 10*time.Millisecond, "the fleet's two sessions opened")
}

// TestFleetCloseDoesNotWaitOnAStalledTake: a Long caller with a long ctx is taking a fleet slot
// when the link to the server stalls (the proxy holds the server's reply). Close returns within
// seconds, as pgxpool's Close does on a stalled server, and the caller gets ErrClosed: Close does
// not wait for the caller's ctx to end the take's round trip.
func TestFleetCloseDoesNotWaitOnAStalledTake(t *testing.T) {
	bg := context.Background()
	admin, proxy := behindProxy(t)
	p, err := pgxlanes.New(bg, withParams(proxy.DSN(), "pool_max_conns=4&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=1&lane_long_acquire_timeout=2m"))
	require.NoError(t, err)
	fleetSides(t, admin)

	require.NoError(t, proxy.SetBlackhole(faultproxy.Downstream, true))
	ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select 1")
		done <- err
	}()
	// The take reached the server, and its reply is held by the proxy.
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(bg, `select count(*) from pg_stat_activity where application_name = 'pgxlanes fleet'
			and datname = current_database() and query like '%pg_try_advisory_lock(%'`).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the take reached the server")

	closed := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(closed)
		p.Close()
	}()
	select {
	case <-closed:
		t.Logf("Close returned after %v with the link stalled", time.Since(start).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		require.NoError(t, proxy.Normal()) // let the take finish, so that Close and the caller end
		<-closed
		t.Fatalf("Close waited %v for a fleet take on a stalled link, until the link recovered", time.Since(start).Round(time.Millisecond))
	}
	select {
	case err := <-done:
		assert.ErrorIs(t, err, pgxlanes.ErrClosed)
	case <-time.After(15 * time.Second):
		t.Fatal("the Long caller did not return after Close")
	}
}

// TestFleetSlotNotLeakedByACancelledTake: replica A's connections use a context watcher handler
// that cancels a statement on the server and keeps the session (pgconn's
// CancelRequestContextWatcherHandler). A's Long caller's ctx ends while its take of the fleet's
// one slot runs on the server, after the take locked the slot: the cancel fails the statement,
// but a session-level advisory lock outlives the statement that took it. A does not count the
// slot, so it must not keep the lock either: once A is idle no fleet lock is held, and replica B
// gets the slot. The take is made slow after its lock by a pg_advisory_unlock of a schema ahead
// of pg_catalog in A's search_path, standing in for a server slow to finish the statement.
func TestFleetSlotNotLeakedByACancelledTake(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	admin, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer admin.Close(bg)
	_, err = admin.Exec(bg, `create schema slow;
		create table slow.flag ();
		create function slow.pg_advisory_unlock(int, int) returns boolean language plpgsql as $$
		begin
			if exists (select from slow.flag) then
				perform pg_sleep(30);
			end if;
			return pg_catalog.pg_advisory_unlock($1, $2);
		end $$`)
	require.NoError(t, err)

	const params = "pool_max_conns=4&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=1&lane_long_acquire_timeout=10s"
	cfg, err := pgxlanes.ParseConfig(withParams(dsn, params))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "slow, pg_catalog"
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 20 * time.Second}
	}
	a, err := pgxlanes.NewWithConfig(bg, cfg)
	require.NoError(t, err)
	t.Cleanup(a.Close)
	b := newLanes(t, dsn, params)
	fleetSides(t, admin)

	_, err = admin.Exec(bg, "insert into slow.flag default values")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := a.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select 1")
		done <- err
	}()
	// The take locked the slot and sleeps in its unlock.
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(bg, `select count(*) from pg_stat_activity where application_name = 'pgxlanes fleet'
			and datname = current_database() and wait_event = 'PgSleep'`).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the take sleeps on the server")
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(15 * time.Second):
		t.Fatal("the Long caller did not return after its ctx ended")
	}
	_, err = admin.Exec(bg, "delete from slow.flag")
	require.NoError(t, err)
	lanesIdle(t, a, "after the cancelled take")

	pgserver.Eventually(t, 10*time.Second, "no fleet lock held with replica A idle", func() bool {
		return fleetLockHolders(t, admin) == 0
	})
	_, err = b.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.NoError(t, err, "replica B gets the fleet's slot")
}
