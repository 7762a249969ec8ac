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

// allSettings reads the session's timeouts and its idle-in-transaction timeout, which a
// transaction's budget sets as a server-side backstop.
func allSettings(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) []string {
	t.Helper()
	return allSettingsCtx(t, context.Background(), q)
}

func allSettingsCtx(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) []string {
	t.Helper()
	var st, lt, it string
	require.NoError(t, q.QueryRow(ctx, allSettingsSQL).Scan(&st, &lt, &it))
	return []string{st, lt, it}
}

// batchSettings reads what allSettings reads from the next result of a batch, which must be
// allSettingsSQL's, and closes the batch.
func batchSettings(t *testing.T, br pgx.BatchResults) []string {
	t.Helper()
	var st, lt, it string
	require.NoError(t, br.QueryRow().Scan(&st, &lt, &it))
	require.NoError(t, br.Close())
	return []string{st, lt, it}
}

const allSettingsSQL = "select current_setting('statement_timeout'), current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')"

// TestSettingsNeverLeak checks current_setting on every path: no lane's setting reaches a user
// of another lane, a hijacked connection, or a pgxpool hook that expects the session defaults.
// One connection serves every path, so a leak would show.
func TestSettingsNeverLeak(t *testing.T) {
	bg := context.Background()
	// Tx's budget is explicit (cancel, 60s): its transactions get a backstop of 126s
	// (idle_in_transaction_session_timeout), past its statement timeout of 30s.
	cfg, err := pgxlanes.ParseConfig(withParams(newDB(t, 1),
		"pool_max_conns=1&lane_short_statement_timeout=5s&lane_short_lock_timeout=1s&lane_tx_statement_timeout=30s&lane_tx_lock_timeout=7s&lane_long_statement_timeout=0&lane_long_lock_timeout=9s"+
			"&lane_tx_budget=60s&lane_tx_over_budget=cancel"))
	require.NoError(t, err)
	var mu sync.Mutex
	var hooks []string
	hook := func(where string, c *pgx.Conn) {
		var st, lt string
		// A hook runs its own statement on the connection: it must see the user's settings.
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
	defaults := []string{"5s", "1s"} // Short's
	// The user's session values (nobody set them here: the server's, 0), which RESET restores:
	// what a hijacked connection and pgxpool's hooks see (docs/design.md, "Setting sources and
	// precedence").
	users := []string{"0", "0"}
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

	// The session defaults, with no idle-in-transaction backstop; Tx's transactions get theirs.
	sessionDefaults := []string{"5s", "1s", "0"}
	shortAfter := func(what string) {
		t.Helper()
		assert.Equal(t, sessionDefaults, allSettings(t, p), "short statement after "+what)
	}
	// What a row inserted into "seen" records of the session that inserted it: COPY runs the
	// trigger on the connection that COPY runs on.
	_, err = p.Exec(bg, `create table seen (id int, st text, lt text, it text);
		create function record_settings() returns trigger language plpgsql as $$ begin
			new.st := current_setting('statement_timeout'); new.lt := current_setting('lock_timeout');
			new.it := current_setting('idle_in_transaction_session_timeout'); return new; end $$;
		create trigger record before insert on seen for each row execute function record_settings()`)
	require.NoError(t, err)
	seen := func(id int) []string {
		t.Helper()
		var st, lt, it string
		require.NoError(t, p.QueryRow(bg, "select st, lt, it from seen where id = $1", id).Scan(&st, &lt, &it))
		return []string{st, lt, it}
	}

	// CopyFrom runs on the Tx lane, with its timeouts (not a transaction's backstop).
	n, err := p.CopyFrom(bg, pgx.Identifier{"seen"}, []string{"id"}, pgx.CopyFromRows([][]any{{1}}))
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	assert.Equal(t, []string{"30s", "7s", "0"}, seen(1), "CopyFrom")
	shortAfter("a CopyFrom")
	// And on the lane the context names.
	_, err = p.CopyFrom(long, pgx.Identifier{"seen"}, []string{"id"}, pgx.CopyFromRows([][]any{{2}}))
	require.NoError(t, err)
	assert.Equal(t, []string{"0", "9s", "0"}, seen(2), "CopyFrom on Long")
	shortAfter("a Long CopyFrom")

	// Batches: on Short, on the lane the context names, and one that begins a transaction.
	b := &pgx.Batch{}
	b.Queue(allSettingsSQL)
	assert.Equal(t, sessionDefaults, batchSettings(t, p.SendBatch(bg, b)), "short batch")
	assert.Equal(t, []string{"0", "9s", "0"}, batchSettings(t, p.SendBatch(long, b)), "Long batch")
	shortAfter("a Long batch")
	bt := &pgx.Batch{}
	bt.BeginTx(pgx.TxOptions{})
	bt.Queue(allSettingsSQL)
	br := p.SendBatch(bg, bt)
	txOfBatch := br.Tx()
	defer txOfBatch.Rollback(bg) //nolint:errcheck
	// The batch's first result is its BEGIN's.
	_, err = br.Exec()
	require.NoError(t, err)
	assert.Equal(t, []string{"30s", "7s", "126s"}, batchSettings(t, br), "batch that begins a transaction")
	require.NoError(t, txOfBatch.Commit(bg))
	shortAfter("a batch's transaction")
	c, err = p.Acquire(bg)
	require.NoError(t, err)
	assert.Equal(t, []string{"30s", "7s", "0"}, batchSettings(t, c.SendBatch(bg, b)), "held connection's batch")
	c.Release()
	shortAfter("a held connection's batch")

	// AcquireAllIdle: the idle connection on the Tx lane, then on the lane the context names.
	pgserver.Eventually(t, 5*time.Second, "the connection idle", func() bool { return p.Stat().IdleConns() == 1 })
	idle := p.AcquireAllIdle(bg)
	require.Len(t, idle, 1)
	assert.Equal(t, []string{"30s", "7s", "0"}, allSettings(t, idle[0]), "AcquireAllIdle")
	idle[0].Release()
	shortAfter("AcquireAllIdle")
	pgserver.Eventually(t, 5*time.Second, "the connection idle", func() bool { return p.Stat().IdleConns() == 1 })
	idle = p.AcquireAllIdle(long)
	require.Len(t, idle, 1)
	assert.Equal(t, []string{"0", "9s", "0"}, allSettings(t, idle[0]), "AcquireAllIdle on Long")
	idle[0].Release()
	shortAfter("AcquireAllIdle on Long")

	// WithBudget: a transaction's budget of 4s (cancel) makes a backstop of 2×4s + 1s = 9s, which
	// also caps its statement timeout; a held connection keeps its lane's timeouts.
	err = pgx.BeginFunc(pgxlanes.WithBudget(bg, 4*time.Second), p, func(tx pgx.Tx) error {
		assert.Equal(t, []string{"9s", "7s", "9s"}, allSettings(t, tx), "transaction with WithBudget")
		return nil
	})
	require.NoError(t, err)
	shortAfter("a transaction with WithBudget")
	err = pgx.BeginFunc(bg, p, func(tx pgx.Tx) error {
		assert.Equal(t, []string{"30s", "7s", "126s"}, allSettings(t, tx), "transaction after one with WithBudget")
		return nil
	})
	require.NoError(t, err)
	c, err = p.Acquire(pgxlanes.WithBudget(bg, pgxlanes.Off))
	require.NoError(t, err)
	assert.Equal(t, []string{"30s", "7s", "0"}, allSettings(t, c), "held connection with WithBudget(Off)")
	c.Release()
	shortAfter("a held connection with WithBudget")

	// A connection whose statement a deadline interrupted is cleaned off the caller's path and
	// kept: its next user, on another lane, gets its own lane's settings.
	var pid uint32
	require.NoError(t, p.QueryRow(bg, "select pg_backend_pid()").Scan(&pid))
	opened := p.Stat().NewConnsCount()
	interrupt := func(what string, run func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, run(ctx), context.DeadlineExceeded, what)
		lanesIdle(t, p, "after "+what)
	}
	interrupt("a Long statement", func(ctx context.Context) error {
		_, err := p.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select pg_sleep(2)")
		return err
	})
	shortAfter("a Long statement cut by its deadline")
	interrupt("a Long statement, again", func(ctx context.Context) error {
		_, err := p.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select pg_sleep(2)")
		return err
	})
	c, err = p.Acquire(bg)
	require.NoError(t, err)
	assert.Equal(t, []string{"30s", "7s", "0"}, allSettings(t, c), "held Tx connection after a Long statement cut by its deadline")
	c.Release()
	interrupt("a held connection's statement", func(ctx context.Context) error {
		c, err := p.Acquire(bg)
		require.NoError(t, err)
		defer c.Release()
		_, err = c.Exec(ctx, "select pg_sleep(2)")
		return err
	})
	assert.Equal(t, []string{"0", "9s", "0"}, allSettingsCtx(t, pgxlanes.WithLane(bg, pgxlanes.Long), p),
		"Long statement after a held connection's statement cut by its deadline")
	shortAfter("a Long statement")
	interrupt("a statement of a transaction with WithBudget", func(ctx context.Context) error {
		tx, err := p.Begin(pgxlanes.WithBudget(bg, 4*time.Second))
		require.NoError(t, err)
		defer tx.Rollback(bg) //nolint:errcheck
		_, err = tx.Exec(ctx, "select pg_sleep(2)")
		return err
	})
	shortAfter("a transaction's statement cut by its deadline (its backstop gone)")
	var pidAfter uint32
	require.NoError(t, p.QueryRow(bg, "select pg_backend_pid()").Scan(&pidAfter))
	assert.Equal(t, pid, pidAfter, "the interrupted connection was kept")
	assert.Equal(t, opened, p.Stat().NewConnsCount(), "no connection opened for the interrupted ones")

	c, err = p.Acquire(bg)
	require.NoError(t, err)
	_, err = c.Exec(bg, "select 1") // the Tx settings are now on the session
	require.NoError(t, err)
	hj := c.Hijack()
	st, lt = settings(t, hj)
	check("hijacked connection", users, st, lt)
	require.NoError(t, hj.Close(bg))

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, hooks)
	for _, h := range hooks {
		assert.Contains(t, []string{"PrepareConn: 0 0", "AfterRelease: 0 0"}, h, "a hook saw a lane's settings")
	}
}
