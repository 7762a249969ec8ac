package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// TestFleetSlotsOfACrashedReplicaFree: a replica whose guard session ends (it crashed, or the
// network dropped it) loses its fleet slots with it, and the other replica takes them.
func TestFleetSlotsOfACrashedReplicaFree(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	const params = "pool_max_conns=4&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=2&lane_long_acquire_timeout=5s"
	a, b := newLanes(t, dsn, params), newLanes(t, dsn, params)
	held := make([]*pgxlanes.Conn, 0, 2)
	for range 2 {
		c, err := a.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
		require.NoError(t, err)
		t.Cleanup(c.Release) // before the pool's Close, which waits for it
		held = append(held, c)
	}
	// The fleet is full: b waits.
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	_, err := b.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select 1")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// a's guard session dies (a crash would end it the same way): its slots are the server's again.
	admin, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer admin.Close(bg)
	var killed int
	require.NoError(t, admin.QueryRow(bg, `select count(pg_terminate_backend(pid)) from pg_stat_activity
		where application_name = 'pgxlanes guard' and datname = current_database()
		and pid in (select pid from pg_locks where locktype = 'advisory' and granted)`).Scan(&killed))
	require.Equal(t, 1, killed)
	start := time.Now()
	_, err = b.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.NoError(t, err)
	t.Logf("b got a fleet slot %v after a's guard session ended", fmtDur(time.Since(start)))
	for _, c := range held {
		c.Release()
	}
}

// TestFleetsOfDifferentCapsAreSeparate: the fleet is every pool that shares the database and the
// cap. A service capped at 1 that holds its slot does not take a slot of a service capped at 2
// on the same database.
func TestFleetsOfDifferentCapsAreSeparate(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	const base = "pool_max_conns=6&lane_long_max_conns=3&lane_long_reserved=3&lane_long_acquire_timeout=1s"
	one := newLanes(t, dsn, base+"&lane_long_fleet_max_conns=1")
	two := newLanes(t, dsn, base+"&lane_long_fleet_max_conns=2")
	c, err := one.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	t.Cleanup(c.Release)
	for range 2 {
		c, err := two.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
		require.NoError(t, err, "the other service's slot is not this fleet's")
		t.Cleanup(c.Release)
	}
	require.Equal(t, 2, two.Stat().Lane(pgxlanes.Long).FleetHeld)
	// Its own fleet is full: a third Long call of the 2-capped service waits for a fleet slot,
	// though its lane has room, then times out.
	_, err = two.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout)
	require.ErrorContains(t, err, "fleet slot")
}
