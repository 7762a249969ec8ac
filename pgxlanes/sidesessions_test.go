package pgxlanes

import (
	"hash/fnv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFleetNameParam: lane_long_fleet_name names the fleet; an empty one, or one on another
// lane, is refused with the parameter's name.
func TestFleetNameParam(t *testing.T) {
	const dsn = "postgres://u:secret@127.0.0.1:5432/db?lane_long_fleet_max_conns=2"
	c, err := ParseConfig(dsn + "&lane_long_fleet_name=orders")
	require.NoError(t, err)
	assert.Equal(t, "orders", c.Long.FleetName)
	_, sent := c.ConnConfig.RuntimeParams["lane_long_fleet_name"]
	assert.False(t, sent)

	_, err = ParseConfig(dsn + "&lane_long_fleet_name=")
	require.ErrorContains(t, err, "lane_long_fleet_name")

	c, err = ParseConfig(dsn + "&lane_short_fleet_name=orders")
	require.NoError(t, err)
	_, err = c.resolve()
	require.ErrorContains(t, err, "FleetName")
	assert.NotContains(t, err.Error(), "secret")
}

// TestFleetNameDefaultAndKey: the default name is the database and user, plus the application
// name when set, and the lock key is FNV-1a of "pgxlanes long fleet:" and the name, as
// docs/scale-out.md says.
func TestFleetNameDefaultAndKey(t *testing.T) {
	cc, err := pgx.ParseConfig("postgres://app:pw@127.0.0.1/shop")
	require.NoError(t, err)
	assert.Equal(t, "shop/app", defaultFleetName(cc))
	cc.RuntimeParams["application_name"] = "billing"
	assert.Equal(t, "shop/app/billing", defaultFleetName(cc))

	h := fnv.New32a()
	h.Write([]byte("pgxlanes long fleet:orders"))
	assert.Equal(t, int32(h.Sum32()), fleetKey("orders"))
	assert.NotEqual(t, fleetKey("orders"), fleetKey("billing"))
}

// TestLeaseStateCommit: the Commit transitions of the lease's state table, phase by phase.
func TestLeaseStateCommit(t *testing.T) {
	for _, tc := range []struct {
		from    leasePhase
		refused error // nil: active -> committing
	}{
		{phActive, nil},
		{phTerminating, ErrBudgetExceeded},
		{phTerminated, ErrBudgetExceeded},
		{phAbandoned, ErrReleased},
		{phReleasing, ErrReleased},
		{phEnded, ErrReleased},
	} {
		t.Run(tc.from.String(), func(t *testing.T) {
			l := &lease{}
			l.setLocked(tc.from)
			l.mark(fOverran)
			err := l.beginCommit()
			if tc.refused != nil {
				require.ErrorIs(t, err, tc.refused)
				assert.Equal(t, tc.from, l.phase(), "a refused Commit leaves the phase")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, phCommitting, l.phase())
			assert.False(t, l.released())
			assert.False(t, l.endCommit(), "no terminate meanwhile")
			assert.Equal(t, phActive, l.phase())
			assert.True(t, l.has(fOverran), "the flags survive every transition")
		})
	}
	// A terminate that gave up waiting moved the lease on: endCommit says so and leaves it.
	l := &lease{}
	require.NoError(t, l.beginCommit())
	l.setLocked(phTerminating)
	assert.True(t, l.endCommit())
	assert.Equal(t, phTerminating, l.phase())
	assert.True(t, l.terminating())
	// A guard violation recorded before the Commit refuses it.
	l = &lease{}
	l.violation.Store(&BudgetError{Action: ActionCancel})
	require.ErrorIs(t, l.beginCommit(), ErrBudgetExceeded)
}
