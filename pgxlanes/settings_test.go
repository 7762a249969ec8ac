package pgxlanes

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPGDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"60000", time.Minute, true}, {"60s", time.Minute, true}, {"1min", time.Minute, true}, {"'1 min'", time.Minute, true},
		{"250ms", 250 * time.Millisecond, true}, {"0", Off, true}, {"1h", time.Hour, true}, {"1d", 24 * time.Hour, true},
		{"soon", 0, false}, {"-1", 0, false}, {"5 parsecs", 0, false},
	} {
		got, ok := pgDuration(tc.in)
		assert.Equal(t, tc.ok, ok, tc.in)
		if tc.ok {
			assert.Equal(t, tc.want, got, tc.in)
		}
	}
}

// TestDSNTimeouts: a runtime parameter wins over options, as in PostgreSQL; options' -c and
// --name forms are read.
func TestDSNTimeouts(t *testing.T) {
	c, err := ParseConfig("host=127.0.0.1 statement_timeout=60000 options='-c lock_timeout=20s --statement-timeout=1s'")
	require.NoError(t, err)
	u := dsnTimeouts(c.ConnConfig)
	assert.Equal(t, userValue{v: time.Minute, set: true, source: "dsn"}, u.stmt)
	assert.Equal(t, userValue{v: 20 * time.Second, set: true, source: "dsn"}, u.lock)
	c, err = ParseConfig("host=127.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, userTimeouts{}, dsnTimeouts(c.ConnConfig))
}

// TestEffectiveTimeouts: a lane setting wins, then the user's value, then the lane's default; a
// user's 0 does not reach Short, whose budget follows its statement timeout.
func TestEffectiveTimeouts(t *testing.T) {
	c := resolved(t, "host=127.0.0.1 pool_max_conns=4 lane_tx_lock_timeout=3s")
	var e explicitTimeouts
	e[Tx].lock = true
	user := userTimeouts{stmt: userValue{v: time.Minute, set: true}, lock: userValue{v: 20 * time.Second, set: true}}
	short, note := effectiveTimeouts(Short, c.Short, e, user)
	assert.Empty(t, note)
	assert.Equal(t, []time.Duration{time.Minute, 20 * time.Second, time.Minute + time.Second}, []time.Duration{short.StatementTimeout, short.LockTimeout, short.Budget})
	tx, _ := effectiveTimeouts(Tx, c.Tx, e, user)
	assert.Equal(t, []time.Duration{time.Minute, 3 * time.Second}, []time.Duration{tx.StatementTimeout, tx.LockTimeout})
	none, _ := effectiveTimeouts(Long, c.Long, e, userTimeouts{})
	assert.Equal(t, []time.Duration{Off, 30 * time.Second}, []time.Duration{none.StatementTimeout, none.LockTimeout})
	zero, note := effectiveTimeouts(Short, c.Short, e, userTimeouts{stmt: userValue{v: Off, set: true, source: "user"}})
	assert.Equal(t, 5*time.Second, zero.StatementTimeout)
	assert.Contains(t, note, "short lane keeps statement_timeout 5s")
	assert.Contains(t, note, "statement_timeout 0 (from user)")
}
