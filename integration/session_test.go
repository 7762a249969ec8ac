package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// A held connection costs what pgxpool's does: the lane's settings go with its first statement
// and the defaults come back with the next statement after it, with no round trip of their own.

// TestHeldConnectionCostsOneRoundTrip times Acquire + Exec + Release of the Tx lane (whose
// timeouts differ from the session defaults) over a link of 50 ms each way: one round trip is
// 100 ms, the old SET and RESET made it three.
func TestHeldConnectionCostsOneRoundTrip(t *testing.T) {
	const oneWay = 50 * time.Millisecond
	proxy := pgserver.NewProxy(t, newDB(t, 1))
	p := newLanes(t, proxy.DSN(), "pool_max_conns=2")
	bg := context.Background()
	require.NoError(t, p.Ping(bg)) // open the connection before the link slows down
	require.NoError(t, proxy.SetLatency(faultproxy.Both, oneWay))
	var took []time.Duration
	for range 8 {
		start := time.Now()
		c, err := p.Acquire(bg)
		require.NoError(t, err)
		_, err = c.Exec(bg, "select 1")
		require.NoError(t, err)
		c.Release()
		took = append(took, time.Since(start))
	}
	figure(t, "link50.held_round_trips", float64(median(took))/float64(2*oneWay))
	t.Logf("held Tx connection, Acquire+Exec+Release: median %v of %v (one round trip is %v, three %v)", fmtDur(median(took)), took, 2*oneWay, 6*oneWay)
	// One round trip is 100ms, the old SET and RESET made three: the median tells them apart on a
	// loaded machine, where a single sample may not.
	assert.Less(t, median(took), 4*oneWay, "more than one round trip")
	// And a one-statement transaction: BEGIN and the statement and COMMIT are three round trips,
	// as with pgxpool; the lane's settings add none.
	start := time.Now()
	require.NoError(t, pgx.BeginFunc(bg, p, func(tx pgx.Tx) error { _, err := tx.Exec(bg, "select 1"); return err }))
	txTook := time.Since(start)
	t.Logf("one-statement transaction: %v", fmtDur(txTook))
	assert.Less(t, txTook, 10*oneWay, "more than three round trips")
}

// settings reads the session's timeouts.
func settings(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (st, lt string) {
	t.Helper()
	require.NoError(t, q.QueryRow(context.Background(),
		"select current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&st, &lt))
	return st, lt
}

// TestSettingsNeverLeak checks current_setting on every path: no lane's setting reaches a user
// of another lane, a hijacked connection, or a pgxpool hook that expects the session defaults.
// One connection serves every path, so a leak would show.
func TestSettingsNeverLeak(t *testing.T) {
	bg := context.Background()
	cfg, err := pgxlanes.ParseConfig(withParams(newDB(t, 1),
		"pool_max_conns=1&lane_short_statement_timeout=5s&lane_short_lock_timeout=1s&lane_tx_statement_timeout=30s&lane_tx_lock_timeout=7s&lane_long_statement_timeout=0&lane_long_lock_timeout=9s"))
	require.NoError(t, err)
	var mu sync.Mutex
	var hooks []string
	hook := func(where string, c *pgx.Conn) {
		var st, lt string
		// A hook runs its own statement on the connection: it must see the defaults.
		err := c.QueryRow(bg, "select current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&st, &lt)
		mu.Lock()
		hooks = append(hooks, where+": "+st+" "+lt)
		if err != nil {
			hooks = append(hooks, where+": "+err.Error())
		}
		mu.Unlock()
	}
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) { hook("PrepareConn", c); return true, nil }
	cfg.AfterRelease = func(c *pgx.Conn) bool { hook("AfterRelease", c); return true }
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	p, err := pgxlanes.NewWithConfig(bg, cfg)
	require.NoError(t, err)
	defer p.Close()
	defaults := []string{"5s", "1s"}
	check := func(what string, want []string, st, lt string) {
		t.Helper()
		assert.Equal(t, want, []string{st, lt}, what)
	}

	st, lt := settings(t, p)
	check("short statement", defaults, st, lt)
	c, err := p.Acquire(bg)
	require.NoError(t, err)
	st, lt = settings(t, c)
	check("held Tx connection", []string{"30s", "7s"}, st, lt)
	c.Release()
	time.Sleep(50 * time.Millisecond) // AfterRelease runs on a goroutine of pgxpool's
	st, lt = settings(t, p)
	check("short statement after a held Tx connection", defaults, st, lt)

	err = pgx.BeginFunc(bg, p, func(tx pgx.Tx) error {
		st, lt = settings(t, tx)
		check("Tx transaction", []string{"30s", "7s"}, st, lt)
		return nil
	})
	require.NoError(t, err)
	st, lt = settings(t, p)
	check("short statement after a transaction", defaults, st, lt)

	long := pgxlanes.WithLane(bg, pgxlanes.Long)
	var lst, llt string
	require.NoError(t, p.QueryRow(long, "select current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&lst, &llt))
	check("Long statement", []string{"0", "9s"}, lst, llt)
	st, lt = settings(t, p)
	check("short statement after a Long one", defaults, st, lt)

	c, err = p.Acquire(bg)
	require.NoError(t, err)
	_, err = c.Exec(bg, "select 1") // the Tx settings are now on the session
	require.NoError(t, err)
	hj := c.Hijack()
	st, lt = settings(t, hj)
	check("hijacked connection", defaults, st, lt)
	require.NoError(t, hj.Close(bg))

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, hooks)
	for _, h := range hooks {
		assert.Contains(t, []string{"PrepareConn: 5s 1s", "AfterRelease: 5s 1s"}, h, "a hook saw another lane's settings")
	}
}
