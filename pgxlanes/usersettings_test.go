package pgxlanes

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A lane's timeouts reach every lease of it, whatever the lease before did to the session: a
// user's SET, RESET or DISCARD ALL on the same connection must not carry over to the next lease
// of the same lane, which ran without the lane's bounds (or with the user's): the staged settings
// were taken as still applied.
func TestLaneSettingsSurviveUserSet(t *testing.T) {
	ctx := context.Background()
	p := reusePool(t, "pool_max_conns=1&lane_tx_statement_timeout=30s&lane_tx_lock_timeout=7s&lane_short_statement_timeout=5s&lane_short_lock_timeout=1s")
	read := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) []string {
		t.Helper()
		var st, lt string
		require.NoError(t, q.QueryRow(ctx, "select current_setting('statement_timeout'), current_setting('lock_timeout')", pgx.QueryExecModeSimpleProtocol).Scan(&st, &lt))
		return []string{st, lt}
	}
	for _, sql := range []string{"reset all", "discard all", "set statement_timeout = 0; set lock_timeout = 0", "reset statement_timeout"} {
		t.Run("held "+sql, func(t *testing.T) {
			c, err := p.Acquire(ctx)
			require.NoError(t, err)
			assert.Equal(t, []string{"30s", "7s"}, read(c))
			_, err = c.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
			require.NoError(t, err)
			c.Release()
			c, err = p.Acquire(ctx)
			require.NoError(t, err)
			defer c.Release()
			assert.Equal(t, []string{"30s", "7s"}, read(c), "held Tx connection after %q on the one before", sql)
		})
		t.Run("short "+sql, func(t *testing.T) {
			assert.Equal(t, []string{"5s", "1s"}, read(p))
			_, err := p.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
			require.NoError(t, err)
			assert.Equal(t, []string{"5s", "1s"}, read(p), "short statement after %q", sql)
		})
	}
}
