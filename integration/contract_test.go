package integration

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/pgxpoolprometheus"
	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// pgxpool's contract, as a pgxpool user relies on it.

// TestReleasedConnNeverReachesTheConnection: a handle used after Release must not touch the
// connection, which may serve another caller. It once ran "rollback" in another caller's
// transaction, whose Commit then returned nil without its row.
func TestReleasedConnNeverReachesTheConnection(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	p := newLanes(t, dsn, "pool_max_conns=2&lane_short_reserved=1") // one connection for Tx
	_, err := p.Exec(bg, "create table t (id int)")
	require.NoError(t, err)
	stale, err := p.Acquire(bg)
	require.NoError(t, err)
	rows, err := stale.Query(bg, "select generate_series(1, 3)")
	require.NoError(t, err)
	rows.Close()
	txOfStale, err := stale.Begin(bg)
	require.NoError(t, err)
	require.NoError(t, txOfStale.Commit(bg))
	stale.Release()

	other, err := p.Begin(bg) // the same connection, now another caller's
	require.NoError(t, err)
	_, err = other.Exec(bg, "insert into t values (1)")
	require.NoError(t, err)

	_, err = stale.Exec(bg, "rollback")
	require.ErrorIs(t, err, pgxlanes.ErrReleased)
	_, err = stale.Query(bg, "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrReleased)
	require.ErrorIs(t, stale.QueryRow(bg, "select 1").Scan(new(int)), pgxlanes.ErrReleased)
	require.ErrorIs(t, stale.SendBatch(bg, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "rollback"}}}).Close(), pgxlanes.ErrReleased)
	_, err = stale.CopyFrom(bg, pgx.Identifier{"t"}, []string{"id"}, pgx.CopyFromRows([][]any{{2}}))
	require.ErrorIs(t, err, pgxlanes.ErrReleased)
	_, err = stale.Begin(bg)
	require.ErrorIs(t, err, pgxlanes.ErrReleased)
	require.ErrorIs(t, stale.Ping(bg), pgxlanes.ErrReleased)
	// A transaction taken from the connection before Release (committed then) refuses too.
	_, err = txOfStale.Exec(bg, "rollback")
	require.ErrorIs(t, err, pgxlanes.ErrReleased, "a transaction of the released connection")
	require.ErrorIs(t, txOfStale.Rollback(bg), pgxlanes.ErrReleased)
	require.ErrorIs(t, txOfStale.Commit(bg), pgxlanes.ErrReleased)
	assert.Panics(t, func() { stale.Conn() }, "Conn after Release")
	assert.Panics(t, func() { stale.Hijack() }, "Hijack after Release")
	stale.Release() // a second Release is a no-op

	require.NoError(t, other.Commit(bg))
	var n int
	require.NoError(t, p.QueryRow(bg, "select count(*) from t").Scan(&n))
	assert.Equal(t, 1, n, "the other caller's committed row")

	// Rows and a transaction still open at Release: the connection is busy and inside a
	// transaction, so it is destroyed, not reused (Conn.Release's documentation); the stale rows
	// and transaction fail with ErrReleased and never reach a connection.
	var pidBefore, pidAfter uint32
	stale, err = p.Acquire(bg)
	require.NoError(t, err)
	require.NoError(t, stale.QueryRow(bg, "select pg_backend_pid()").Scan(&pidBefore))
	openTx, err := stale.Begin(bg)
	require.NoError(t, err)
	_, err = openTx.Exec(bg, "insert into t values (2)")
	require.NoError(t, err)
	openRows, err := openTx.Query(bg, "select generate_series(1, 1000000)")
	require.NoError(t, err)
	require.True(t, openRows.Next())
	stale.Release()
	checkStaleRows(t, "rows of a transaction", openRows, "Scan")
	checkStaleTx(t, "a transaction open at Release", openTx)

	// And rows of the held connection itself, then a batch's results not yet read.
	stale, err = p.Acquire(bg)
	require.NoError(t, err)
	connRows, err := stale.Query(bg, "select generate_series(1, 1000000)")
	require.NoError(t, err)
	require.True(t, connRows.Next())
	stale.Release()
	checkStaleRows(t, "rows of the connection", connRows, "Values")

	stale, err = p.Acquire(bg)
	require.NoError(t, err)
	require.NoError(t, stale.QueryRow(bg, "select pg_backend_pid()").Scan(&pidAfter))
	assert.NotEqual(t, pidBefore, pidAfter, "the connection released busy in a transaction was destroyed")
	b := &pgx.Batch{}
	b.Queue("insert into t values (3)")
	b.Queue("select 1")
	staleBatch := stale.SendBatch(bg, b)
	row := stale.QueryRow(bg, "select 1") // pgx: conn busy until the batch is closed, or ErrReleased
	stale.Release()
	_, err = staleBatch.Exec()
	require.ErrorIs(t, err, pgxlanes.ErrReleased, "a batch's result read after Release")
	require.ErrorIs(t, staleBatch.QueryRow().Scan(new(int)), pgxlanes.ErrReleased)
	require.ErrorIs(t, staleBatch.Close(), pgxlanes.ErrReleased)
	require.ErrorIs(t, row.Scan(new(int)), pgxlanes.ErrReleased, "a row scanned after Release")

	// Whatever reached the server reached it before Release: row 2's transaction never
	// committed; the batch ran in autocommit, its insert may or may not have been executed
	// before the connection was closed.
	require.NoError(t, p.QueryRow(bg, "select count(*) from t where id = 2").Scan(&n))
	assert.Zero(t, n, "the transaction open at Release did not commit")
	lanesIdle(t, p, "after the stale handles")
}

// checkStaleRows checks that rows of a released connection refuse reads with ErrReleased: first
// (the first read after Release) either Scan or Values, then Next and Err.
func checkStaleRows(t *testing.T, what string, rows pgx.Rows, first string) {
	t.Helper()
	switch first {
	case "Scan":
		require.ErrorIs(t, rows.Scan(new(int)), pgxlanes.ErrReleased, what+": Scan")
	case "Values":
		_, err := rows.Values()
		require.ErrorIs(t, err, pgxlanes.ErrReleased, what+": Values")
	}
	assert.False(t, rows.Next(), what+": Next after Release")
	require.ErrorIs(t, rows.Err(), pgxlanes.ErrReleased, what)
	assert.Nil(t, rows.Conn(), what+": Conn")
	rows.Close()
	require.ErrorIs(t, rows.Err(), pgxlanes.ErrReleased, what+": Err after Close")
}

// checkStaleTx checks that a transaction of a released connection refuses every call with
// ErrReleased.
func checkStaleTx(t *testing.T, what string, tx pgx.Tx) {
	t.Helper()
	bg := context.Background()
	_, err := tx.Exec(bg, "rollback")
	require.ErrorIs(t, err, pgxlanes.ErrReleased, what+": Exec")
	_, err = tx.Query(bg, "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrReleased, what+": Query")
	require.ErrorIs(t, tx.QueryRow(bg, "select 1").Scan(new(int)), pgxlanes.ErrReleased, what+": QueryRow")
	require.ErrorIs(t, tx.SendBatch(bg, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "rollback"}}}).Close(), pgxlanes.ErrReleased, what+": SendBatch")
	_, err = tx.CopyFrom(bg, pgx.Identifier{"t"}, []string{"id"}, pgx.CopyFromRows([][]any{{4}}))
	require.ErrorIs(t, err, pgxlanes.ErrReleased, what+": CopyFrom")
	_, err = tx.Prepare(bg, "stale", "select 1")
	require.ErrorIs(t, err, pgxlanes.ErrReleased, what+": Prepare")
	_, err = tx.Begin(bg)
	require.ErrorIs(t, err, pgxlanes.ErrReleased, what+": Begin (savepoint)")
	require.ErrorIs(t, tx.Commit(bg), pgxlanes.ErrReleased, what+": Commit")
	require.ErrorIs(t, tx.Rollback(bg), pgxlanes.ErrReleased, what+": Rollback")
	assert.Panics(t, func() { tx.Conn() }, what+": Conn")
}

// TestBudgetWrapsEveryTransaction: transactions begun on a held connection and savepoints of a
// pool transaction report the guard's action as *BudgetError, as Pool.Begin's do.
func TestBudgetWrapsEveryTransaction(t *testing.T) {
	bg := context.Background()
	p := newLanes(t, newDB(t, 1), "pool_max_conns=4&lane_tx_budget=300ms&lane_tx_over_budget=cancel")
	c, err := p.Acquire(bg)
	require.NoError(t, err)
	tx, err := c.BeginTx(bg, pgx.TxOptions{})
	require.NoError(t, err)
	_, err = tx.Exec(bg, "select pg_sleep(5)")
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded, "a held connection's transaction")
	_ = tx.Rollback(bg)
	c.Release()

	ptx, err := p.Begin(bg)
	require.NoError(t, err)
	sp, err := ptx.Begin(bg)
	require.NoError(t, err)
	_, err = sp.Exec(bg, "select pg_sleep(5)")
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded, "a savepoint")
	_, err = sp.Begin(bg)
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded, "a savepoint of the cancelled transaction")
	require.NoError(t, ptx.Rollback(bg))
	lanesIdle(t, p, "after the cancelled transactions")
}

// TestListenForHours: a LISTEN loop on an acquired connection lives past any budget when the
// acquire says WithBudget(ctx, Off). With the lane's budget it would be cancelled at the budget.
func TestListenForHours(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	// A budget of 200ms stands for the default 30s: the listener must outlive it many times.
	p := newLanes(t, dsn, "pool_max_conns=4&lane_tx_budget=200ms&lane_tx_over_budget=cancel")
	conn, err := p.Acquire(pgxlanes.WithBudget(bg, pgxlanes.Off))
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(bg, "listen jobs")
	require.NoError(t, err)
	var got []string
	deadline := time.Now().Add(1500 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		if i%5 == 0 {
			_, err := p.Exec(bg, "select pg_notify('jobs', $1)", time.Now().Format(time.StampMicro))
			require.NoError(t, err)
		}
		ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond) // the usual polling loop
		n, err := conn.Conn().WaitForNotification(ctx)
		cancel()
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			continue
		}
		got = append(got, n.Payload)
	}
	assert.GreaterOrEqual(t, len(got), 3, "notifications received over 7 budgets")
	st := p.Stat().Lane(pgxlanes.Tx)
	assert.Zero(t, st.BudgetCancels+st.BudgetWarnings+st.BudgetTerminates, "the listener was never acted on")
}

// queryLog is a pgx QueryTracer that records the SQL of every traced statement.
type queryLog struct {
	mu  sync.Mutex
	sql []string
}

func (q *queryLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	q.mu.Lock()
	q.sql = append(q.sql, d.SQL)
	q.mu.Unlock()
	return ctx
}
func (q *queryLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestTracersSeeTheUsersStatements: a tracer (otelpgx names spans after the SQL) sees pgx's
// BEGIN and the user's statements, as with pgxpool; pgxlanes' own settings are not statements
// pgx sends, so they are not traced.
func TestTracersSeeTheUsersStatements(t *testing.T) {
	bg := context.Background()
	cfg, err := pgxlanes.ParseConfig(withParams(newDB(t, 1), "pool_max_conns=4"))
	require.NoError(t, err)
	log := &queryLog{}
	cfg.ConnConfig.Tracer = log
	p, err := pgxlanes.NewWithConfig(bg, cfg)
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, pgx.BeginFunc(bg, p, func(tx pgx.Tx) error { _, err := tx.Exec(bg, "select 1"); return err }))
	c, err := p.Acquire(bg)
	require.NoError(t, err)
	_, err = c.Exec(bg, "select 2")
	require.NoError(t, err)
	c.Release()
	_, err = p.Exec(pgxlanes.WithLane(bg, pgxlanes.Long), "select 3")
	require.NoError(t, err)
	log.mu.Lock()
	defer log.mu.Unlock()
	assert.Equal(t, []string{"begin", "select 1", "commit", "select 2", "select 3"}, log.sql)
	for _, s := range log.sql {
		assert.False(t, strings.Contains(strings.ToLower(s), "set "), "a traced SET: %q", s)
	}
}

// TestPgxpoolExporters: exporters written for pgxpool take the pool's PgxpoolView.
func TestPgxpoolExporters(t *testing.T) {
	bg := context.Background()
	p := newLanes(t, newDB(t, 1), "pool_max_conns=4")
	require.NoError(t, p.Ping(bg))
	view := p.PgxpoolView()
	c := pgxpoolprometheus.NewCollector(view, map[string]string{"db": "app"})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	n, err := testutil.GatherAndCount(reg, "pgxpool_total_conns")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.EqualValues(t, 1, view.Stat().TotalConns())
	require.NoError(t, otelpgx.RecordStats(view))
	assert.Equal(t, p.Config().ConnConfig.Database, view.Config().ConnConfig.Database)
}

// fakeDB is a test double of pgxlanes.DB, as a service's unit test would write one.
type fakeDB struct {
	pgxlanes.DB
	execs []string
}

func (f *fakeDB) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	f.execs = append(f.execs, sql)
	return pgconn.NewCommandTag("UPDATE 1"), nil
}

func markPaid(ctx context.Context, db pgxlanes.DB, id int) error {
	ct, err := db.Exec(ctx, "update orders set paid = true where id = $1", id)
	if err == nil && ct.RowsAffected() != 1 {
		err = errors.New("no such order")
	}
	return err
}

// TestDBInterface: code written against pgxlanes.DB runs on a Pool, a Conn, a pgxpool.Pool and a
// test double.
func TestDBInterface(t *testing.T) {
	bg := context.Background()
	f := &fakeDB{}
	require.NoError(t, markPaid(bg, f, 7))
	assert.Equal(t, []string{"update orders set paid = true where id = $1"}, f.execs)
	dsn := newDB(t, 1)
	p := newLanes(t, dsn, "")
	_, err := p.Exec(bg, "create table orders (id int primary key, paid bool); insert into orders values (7, false), (8, false)")
	require.NoError(t, err)
	require.NoError(t, markPaid(bg, p, 7))
	c, err := p.Acquire(bg)
	require.NoError(t, err)
	require.NoError(t, markPaid(bg, c, 8))
	c.Release()
	require.Error(t, markPaid(bg, newPgxpool(t, dsn, ""), 9))
}
