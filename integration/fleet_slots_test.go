package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestFleetSlotNotLeakedByTries: while a pool's lease holds a fleet slot, the pool's other Long
// callers keep trying for one on the same fleet session, where advisory locks are re-entrant.
// A try must never lock a slot the pool already holds: if it did, the slot's lock count would
// stay above zero after the lease gives it back, and the fleet would lose the slot for good.
// PostgreSQL runs the try with a generic plan after five executions, which may evaluate
// pg_try_advisory_lock before the test that skips the pool's own slots: the callers here try
// more often than that.
func TestFleetSlotNotLeakedByTries(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	const params = "pool_max_conns=4&lane_long_max_conns=2&lane_long_reserved=2&lane_long_fleet_max_conns=1&lane_long_acquire_timeout=5s"
	a, b := newLanes(t, dsn, params), newLanes(t, dsn, params)
	held, err := a.Acquire(pgxlanes.WithLane(bg, pgxlanes.Long))
	require.NoError(t, err)
	t.Cleanup(held.Release)
	// a's other callers wait for the fleet's one slot, polling about 6 times each.
	for range 3 {
		ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
		_, err := a.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select 1")
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	held.Release()

	// The slot is free again: no advisory lock left, and the other replica gets it.
	admin, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer admin.Close(bg)
	pgserver.Eventually(t, 2*time.Second, "no fleet slot held once the lease ended", func() bool {
		var n int
		require.NoError(t, admin.QueryRow(bg, "select count(*) from pg_locks where locktype = 'advisory' and database = (select oid from pg_database where datname = current_database())").Scan(&n))
		return n == 0
	})
	ctx, cancel := context.WithTimeout(bg, 2*time.Second)
	defer cancel()
	_, err = b.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select 1")
	require.NoError(t, err, "the other replica gets the fleet's slot")
}
