package pgxlanestest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/pgxlanestest"
)

// TestSaturateLaneTx checks that SaturateLane holds every connection of the Tx lane, so that a
// transaction times out while a lookup answers, and that Stop gives them back.
func TestSaturateLaneTx(t *testing.T) {
	running := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, running) }) // runs last, after the pool's cleanup
	pool := pgxlanestest.NewPool(t, pgxlanestest.WithDSNParams("pool_max_conns=8&lane_tx_acquire_timeout=100ms"))

	s := pgxlanestest.SaturateLane(t, pool, pgxlanes.Tx, time.Minute)
	st := pool.Stat().Lane(pgxlanes.Tx)
	assert.Equal(t, 6, s.Held())
	assert.Equal(t, st.MaxConns, st.InUse)

	_, err := pool.Begin(ctx(t))
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout)
	var one int
	require.NoError(t, pool.QueryRow(ctx(t), "select 1").Scan(&one), "Short does not notice")

	s.Stop()
	s.Stop()
	assert.Zero(t, s.Held())
	assert.Zero(t, pool.Stat().Lane(pgxlanes.Tx).InUse)
	tx, err := pool.Begin(ctx(t))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx(t)))
}

// TestSaturateLaneShort checks that Short's saturation takes every connection of the pool, its
// reserve and what it borrows.
func TestSaturateLaneShort(t *testing.T) {
	pool := pgxlanestest.NewPool(t, pgxlanestest.WithDSNParams("pool_max_conns=4&lane_short_acquire_timeout=100ms"))
	s := pgxlanestest.SaturateLane(t, pool, pgxlanes.Short, time.Minute)
	assert.Equal(t, 4, s.Held())
	err := pool.QueryRow(ctx(t), "select 1").Scan(new(int))
	require.ErrorIs(t, err, pgxlanes.ErrAcquireTimeout)
	s.Stop()
	require.NoError(t, pool.QueryRow(ctx(t), "select 1").Scan(new(int)))
}

// TestSaturateLaneTakesWhatIsLeft checks that SaturateLane returns at once, holding what the
// lane can reach, when other lanes hold the rest: here Long can reach nothing once Tx holds its
// reserve and every shared connection. Its waiter is withdrawn, not timed out.
func TestSaturateLaneTakesWhatIsLeft(t *testing.T) {
	pool := pgxlanestest.NewPool(t, pgxlanestest.WithDSNParams("pool_max_conns=8"))
	require.Equal(t, 30*time.Second, pool.Config().Long.AcquireTimeout)
	pgxlanestest.SaturateLane(t, pool, pgxlanes.Tx, time.Minute)
	s := pgxlanestest.SaturateLane(t, pool, pgxlanes.Long, time.Minute)
	assert.Zero(t, s.Held())
	st := pool.Stat().Lane(pgxlanes.Long)
	assert.EqualValues(t, 1, st.Canceled, "the waiter was withdrawn")
	assert.Zero(t, st.Timeouts)
}

// TestSaturateLaneEndsByItself checks that the connections go back when d has passed. d is long
// enough that the saturation is still on when SaturateLane returns, on a loaded machine too.
func TestSaturateLaneEndsByItself(t *testing.T) {
	pool := pgxlanestest.NewPool(t)
	s := pgxlanestest.SaturateLane(t, pool, pgxlanes.Long, 2*time.Second)
	assert.Equal(t, pool.Stat().Lane(pgxlanes.Long).MaxConns, s.Held())
	pgserver.Eventually(t, 10*time.Second, "the connections go back", func() bool {
		return s.Held() == 0 && pool.Stat().Lane(pgxlanes.Long).InUse == 0
	})
}

func TestSaturateLaneBadInput(t *testing.T) {
	pool := pgxlanestest.NewPool(t)
	for _, tc := range []struct {
		name string
		f    func(tb testing.TB)
		want string
	}{
		{"nil pool", func(tb testing.TB) { pgxlanestest.SaturateLane(tb, nil, pgxlanes.Tx, time.Second) }, "pool is nil"},
		{"lane", func(tb testing.TB) { pgxlanestest.SaturateLane(tb, pool, pgxlanes.Lane(7), time.Second) }, "lane 7 is not a lane"},
		{"d", func(tb testing.TB) { pgxlanestest.SaturateLane(tb, pool, pgxlanes.Tx, -time.Second) }, "d = -1s: want a positive duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(t)
			msg := r.run(tc.f)
			assert.Empty(t, r.cleanup())
			assert.Contains(t, msg, "pgxlanestest: SaturateLane: "+tc.want)
		})
	}
}
