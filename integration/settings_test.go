package integration

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// querier is what runs a statement: a pool, a transaction, a held connection.
type querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

func timeoutsOf(t *testing.T, q querier) string {
	t.Helper()
	var st, lt string
	require.NoError(t, q.QueryRow(context.Background(), "select current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&st, &lt))
	return st + "/" + lt
}

// settingsPools opens pgxpool and a one-connection pgxlanes pool on dsn; mod changes both
// configurations (an AfterConnect).
func settingsPools(t *testing.T, dsn, lanes string, mod func(*pgxpool.Config), logs *bytes.Buffer) (*pgxpool.Pool, *pgxlanes.Pool) {
	t.Helper()
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(withParams(dsn, "pool_max_conns=1"))
	require.NoError(t, err)
	lc, err := pgxlanes.ParseConfig(withParams(withParams(dsn, "pool_max_conns=1"), lanes))
	require.NoError(t, err)
	if mod != nil {
		mod(pc)
		mod(lc.Config)
	}
	if logs != nil {
		lc.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: logs}, nil))
	}
	pp, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	t.Cleanup(pp.Close)
	lp, err := pgxlanes.NewWithConfig(ctx, lc)
	require.NoError(t, err)
	t.Cleanup(lp.Close)
	return pp, lp
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// pathsSeen runs every path of a one-connection pool in an order that has each plain statement
// follow another kind of use, and returns the timeouts each path saw.
func pathsSeen(t *testing.T, p *pgxlanes.Pool) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	out["short"] = timeoutsOf(t, p)
	tx, err := p.Begin(ctx)
	require.NoError(t, err)
	out["begin"] = timeoutsOf(t, tx)
	require.NoError(t, tx.Commit(ctx))
	out["short after begin"] = timeoutsOf(t, p)
	c, err := p.Acquire(ctx)
	require.NoError(t, err)
	out["acquire"] = timeoutsOf(t, c)
	c.Release()
	out["short after acquire"] = timeoutsOf(t, p)
	var st, lt string
	require.NoError(t, p.QueryRow(pgxlanes.WithLane(ctx, pgxlanes.Long), "select current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&st, &lt))
	out["long"] = st + "/" + lt
	out["short after long"] = timeoutsOf(t, p)
	c, err = p.Acquire(ctx)
	require.NoError(t, err)
	_ = timeoutsOf(t, c)
	hj := c.Hijack()
	defer hj.Close(ctx)
	out["hijack"] = timeoutsOf(t, hj)
	return out
}

// all returns want for every path but those in except.
func all(want string, except map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range []string{"short", "begin", "short after begin", "acquire", "short after acquire", "long", "short after long", "hijack"} {
		out[k] = want
	}
	for k, v := range except {
		out[k] = v
	}
	return out
}

// TestSettingsPrecedence: a statement_timeout and lock_timeout that the user or the DBA set are
// kept on every path, as pgxpool keeps them; a lane's default fills only what nobody set; a lane
// setting given explicitly wins; a plain statement's settings do not depend on what the connection
// served before; a hijacked connection has the user's settings. pgxpool runs beside each case.
func TestSettingsPrecedence(t *testing.T) {
	ctx := context.Background()
	const user = "1min/20s"
	cases := []struct {
		name    string
		params  string
		lanes   string // lane parameters, for pgxlanes alone
		dbSQL   func(db string) []string
		mod     func(*pgxpool.Config)
		pgxpool string
		want    map[string]string
	}{
		{name: "nobody set them: lane defaults", pgxpool: "0/0",
			want: all("5s/1s", map[string]string{"begin": "30s/10s", "acquire": "30s/10s", "long": "0/30s", "hijack": "0/0"})},
		{name: "DSN runtime parameters", params: "statement_timeout=60000&lock_timeout=20000", pgxpool: user, want: all(user, nil)},
		{name: "options=-c", params: "options=" + strings.ReplaceAll(url.QueryEscape("-c statement_timeout=60s -c lock_timeout=20s"), "+", "%20"), pgxpool: user, want: all(user, nil)},
		{name: "AfterConnect SET", pgxpool: user, mod: func(c *pgxpool.Config) {
			c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				_, err := conn.Exec(ctx, "set statement_timeout = '60s'; set lock_timeout = '20s'")
				return err
			}
		}, want: all(user, map[string]string{"hijack": "0/0"})}, // RESET: the session's values before AfterConnect
		{name: "ALTER DATABASE SET", pgxpool: user, dbSQL: func(db string) []string {
			return []string{"alter database " + db + " set statement_timeout = '60s'", "alter database " + db + " set lock_timeout = '20s'"}
		}, want: all(user, nil)},
		{name: "ALTER ROLE IN DATABASE SET", pgxpool: user, dbSQL: func(db string) []string {
			return []string{"alter role current_user in database " + db + " set statement_timeout = '60s'",
				"alter role current_user in database " + db + " set lock_timeout = '20s'"}
		}, want: all(user, nil)},
		{name: "DSN and an explicit lane setting", params: "statement_timeout=60000&lock_timeout=20000", lanes: "lane_short_statement_timeout=2s&lane_tx_lock_timeout=3s",
			pgxpool: user, want: all(user, map[string]string{"short": "2s/20s", "short after begin": "2s/20s", "short after acquire": "2s/20s",
				"short after long": "2s/20s", "begin": "1min/3s", "acquire": "1min/3s"})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dsn := newDB(t, 1)
			if tc.dbSQL != nil {
				conn, err := pgx.Connect(ctx, dsn)
				require.NoError(t, err)
				for _, sql := range tc.dbSQL(pgx.Identifier{conn.Config().Database}.Sanitize()) {
					_, err := conn.Exec(ctx, sql)
					require.NoError(t, err)
				}
				conn.Close(ctx)
			}
			pp, lp := settingsPools(t, withParams(dsn, tc.params), tc.lanes, tc.mod, nil)
			assert.Equal(t, tc.pgxpool, timeoutsOf(t, pp), "pgxpool")
			got := pathsSeen(t, lp)
			assert.Equal(t, tc.want, got, "pgxlanes")
		})
	}
}

// TestSettingsShortNeedsABound: a user's statement_timeout of 0 is kept by every lane but Short,
// which needs a bound to borrow (a transaction's statement_timeout is capped by its budget's
// backstop, 63s for Tx's 30s budget, as always): Short keeps its default, and New says so in one log line naming
// both values.
func TestSettingsShortNeedsABound(t *testing.T) {
	var logs bytes.Buffer
	pp, lp := settingsPools(t, withParams(newDB(t, 1), "statement_timeout=0"), "", nil, &logs)
	assert.Equal(t, "0/0", timeoutsOf(t, pp), "pgxpool")
	got := pathsSeen(t, lp)
	assert.Equal(t, all("0/1s", map[string]string{"short": "5s/1s", "short after begin": "5s/1s", "short after acquire": "5s/1s",
		"short after long": "5s/1s", "begin": "63s/10s", "acquire": "0/10s", "long": "0/30s", "hijack": "0/0"}), got)
	lw := logs.String()
	assert.Equal(t, 1, strings.Count(lw, "short lane keeps statement_timeout"), lw)
	assert.Contains(t, lw, "5s")
	assert.Contains(t, lw, "statement_timeout 0")
}
