package stdlib_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

// withParams appends query parameters to a URL DSN.
func withParams(dsn, params string) string {
	if params == "" {
		return dsn
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&" + params
	}
	return dsn + "?" + params
}

// newPool returns a pool on a fresh database, closed when the test ends.
func newPool(t testing.TB, params string) *pgxlanes.Pool {
	t.Helper()
	pool, err := pgxlanes.New(context.Background(), withParams(pgserver.NewDatabase(t), params))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// open returns a pool on a fresh database and a *sql.DB on it, both closed when the test ends.
func open(t testing.TB, params string, opts ...stdlib.OptionOpenDB) (*pgxlanes.Pool, *sql.DB) {
	t.Helper()
	pool := newPool(t, params)
	db := stdlib.OpenDBFromPool(pool, opts...)
	t.Cleanup(func() { _ = db.Close() })
	return pool, db
}

func lane(p *pgxlanes.Pool, l pgxlanes.Lane) pgxlanes.LaneStat { return p.Stat().Lane(l) }

// inUse returns the slots each lane holds: short, tx, long.
func inUse(p *pgxlanes.Pool) [3]int {
	st := p.Stat()
	return [3]int{st.Lane(pgxlanes.Short).InUse, st.Lane(pgxlanes.Tx).InUse, st.Lane(pgxlanes.Long).InUse}
}

// lanesIdle waits until no lane holds a slot (an interrupted request is cleaned within
// CancelGrace) and pgxpool has no connection out.
func lanesIdle(t testing.TB, p *pgxlanes.Pool) {
	t.Helper()
	pgserver.Eventually(t, p.Config().CancelGrace+2*time.Second, "every lane idle", func() bool {
		return inUse(p) == [3]int{} && p.Stat().AcquiredConns() == 0
	})
}

func queryString(t testing.TB, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, ctx context.Context, query string) string {
	t.Helper()
	var s string
	require.NoError(t, q.QueryRowContext(ctx, query).Scan(&s))
	return s
}

// Statements go to Short and hold their slot only while they run (rows: until closed);
// transactions go to Tx with its session settings; WithLane passes through.
func TestRouting(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=8")

	before := pool.Stat()
	assert.Equal(t, "5s", queryString(t, db, ctx, "show statement_timeout"), "Short's statement timeout")
	_, err := db.ExecContext(ctx, "select $1::int", 1)
	require.NoError(t, err)
	require.NoError(t, db.PingContext(ctx))
	after := pool.Stat()
	assert.Equal(t, int64(3), after.Lane(pgxlanes.Short).Acquires-before.Lane(pgxlanes.Short).Acquires)
	assert.Equal(t, before.Lane(pgxlanes.Tx).Acquires, after.Lane(pgxlanes.Tx).Acquires)
	assert.Equal(t, [3]int{}, inUse(pool), "a statement's slot is released when it returns")

	rows, err := db.QueryContext(ctx, "select g from generate_series(1, 3) g")
	require.NoError(t, err)
	assert.Equal(t, [3]int{1, 0, 0}, inUse(pool), "open rows hold their Short slot")
	require.True(t, rows.Next())
	require.NoError(t, rows.Close())
	assert.Equal(t, [3]int{}, inUse(pool), "closed rows released it")

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "a transaction holds a Tx slot")
	assert.Equal(t, "30s", queryString(t, tx, ctx, "show statement_timeout"), "Tx's statement timeout")
	assert.NotEqual(t, "0", queryString(t, tx, ctx, "show idle_in_transaction_session_timeout"), "the budget's backstop")
	require.NoError(t, tx.Commit())
	assert.Equal(t, [3]int{}, inUse(pool), "Commit released it")

	long := pgxlanes.WithLane(ctx, pgxlanes.Long)
	before = pool.Stat()
	assert.Equal(t, "0", queryString(t, db, long, "show statement_timeout"), "Long has no statement timeout")
	tx, err = db.BeginTx(long, &sql.TxOptions{Isolation: sql.LevelSerializable, ReadOnly: true})
	require.NoError(t, err)
	assert.Equal(t, [3]int{0, 0, 1}, inUse(pool))
	assert.Equal(t, "serializable", queryString(t, tx, ctx, "show transaction_isolation"))
	assert.Equal(t, "on", queryString(t, tx, ctx, "show transaction_read_only"))
	require.NoError(t, tx.Rollback())
	assert.Equal(t, before.Lane(pgxlanes.Long).Acquires+2, lane(pool, pgxlanes.Long).Acquires)
	assert.Equal(t, before.Lane(pgxlanes.Short).Acquires, lane(pool, pgxlanes.Short).Acquires)
	lanesIdle(t, pool)
}

// The rule: a connection that database/sql used for a statement and then uses for a
// transaction does not carry the transaction on the Short lane. Every sql.Conn here runs a
// statement first, then begins; the transactions fill the Tx lane, Short's slots are free, and a
// lookup still runs at once.
func TestTransactionOnStatementConnection(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=8")
	txMax := lane(pool, pgxlanes.Tx).MaxConns
	require.Equal(t, 6, txMax, "pool_max_conns=8: Short reserves 2, Tx reaches 6")

	var txs []*sql.Tx
	var conns []*sql.Conn
	pids := map[int]bool{}
	for i := range txMax {
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		conns = append(conns, conn)
		var pid int
		require.NoError(t, conn.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid))
		assert.Equal(t, 0, lane(pool, pgxlanes.Short).InUse, "conn %d: the statement released Short's slot", i)
		tx, err := conn.BeginTx(ctx, nil)
		require.NoError(t, err)
		txs = append(txs, tx)
		assert.Equal(t, "30s", queryString(t, tx, ctx, "show statement_timeout"), "conn %d: Tx's settings", i)
		require.NoError(t, tx.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid))
		pids[pid] = true
	}
	st := pool.Stat()
	assert.Equal(t, txMax, st.Lane(pgxlanes.Tx).InUse, "every transaction is on the Tx lane")
	assert.Equal(t, 0, st.Lane(pgxlanes.Short).InUse, "no transaction holds a Short slot")
	assert.Len(t, pids, txMax, "one server session per transaction")

	// Short is free: a lookup runs while every transaction is open.
	lookup, cancel := context.WithTimeout(ctx, 3*time.Second)
	var one int
	require.NoError(t, db.QueryRowContext(lookup, "select 1").Scan(&one))
	cancel()
	// Tx is full: one more transaction waits for the lane, not for Short.
	full, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := db.BeginTx(full, nil)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ae *pgxlanes.AcquireError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, pgxlanes.Tx, ae.Lane)

	for i := range txs {
		require.NoError(t, txs[i].Commit())
		require.NoError(t, conns[i].Close())
	}
	lanesIdle(t, pool)
}

// database/sql's idle connections hold no lane capacity, whatever SetMaxIdleConns says.
func TestIdleConnectionsHoldNothing(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=8")
	db.SetMaxIdleConns(8)
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			cctx := ctx
			if i%2 == 1 {
				cctx = pgxlanes.WithLane(ctx, pgxlanes.Tx) // pins for the call
			}
			_, err := db.ExecContext(cctx, "select pg_sleep(0.2)")
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	assert.GreaterOrEqual(t, db.Stats().Idle, 2, "database/sql keeps idle connections")
	assert.Equal(t, [3]int{}, inUse(pool), "they hold no lane slot")
	assert.Equal(t, int32(0), pool.Stat().AcquiredConns(), "nor a pgxpool connection")
}

// A sql.Conn keeps one server session from its first call until it is closed: on Tx, or on the
// lane that db.Conn's ctx or its first call's ctx names. A db call holds a session only for its
// own duration.
func TestPinning(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=8")
	pid := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) int {
		var n int
		require.NoError(t, q.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&n))
		return n
	}

	t.Run("unannotated", func(t *testing.T) {
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		assert.Equal(t, [3]int{}, inUse(pool), "nothing held before the first call")
		first := pid(conn)
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "pinned on Tx between statements")
		assert.Equal(t, first, pid(conn))
		require.NoError(t, conn.Close())
		assert.Equal(t, [3]int{}, inUse(pool), "Close released the pinned connection")
	})

	t.Run("db.Conn's ctx", func(t *testing.T) {
		conn, err := db.Conn(pgxlanes.WithLane(ctx, pgxlanes.Tx))
		require.NoError(t, err)
		assert.Equal(t, [3]int{}, inUse(pool), "nothing held before the first call")
		_, err = conn.ExecContext(ctx, "set application_name = 'pinned'")
		require.NoError(t, err)
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "pinned on Tx between statements")
		first := pid(conn)
		assert.Equal(t, "pinned", queryString(t, conn, ctx, "show application_name"))
		assert.Equal(t, "30s", queryString(t, conn, ctx, "show statement_timeout"), "Tx's settings")

		tx, err := conn.BeginTx(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, first, pid(tx), "a transaction runs inside the pinned session")
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool))
		require.NoError(t, tx.Commit())
		assert.Equal(t, first, pid(conn))
		require.NoError(t, conn.Close())
		assert.Equal(t, [3]int{}, inUse(pool), "Close released the pinned connection")
	})

	t.Run("transaction first", func(t *testing.T) {
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		tx, err := conn.BeginTx(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool))
		first := pid(tx)
		require.NoError(t, tx.Commit())
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "the session stays pinned after Commit")
		assert.Equal(t, first, pid(conn), "the transaction ran inside the sql.Conn's session")
		require.NoError(t, conn.Close())
		assert.Equal(t, [3]int{}, inUse(pool))
	})

	t.Run("db.BeginTx", func(t *testing.T) {
		tx, err := db.BeginTx(pgxlanes.WithLane(ctx, pgxlanes.Tx), nil)
		require.NoError(t, err)
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool))
		assert.NotEqual(t, "0", queryString(t, tx, ctx, "show idle_in_transaction_session_timeout"),
			"a lease of its own, with the lane's transaction settings")
		require.NoError(t, tx.Commit())
		assert.Equal(t, [3]int{}, inUse(pool), "Commit released it")
	})

	t.Run("first call's ctx", func(t *testing.T) {
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		var first int
		require.NoError(t, conn.QueryRowContext(pgxlanes.WithLane(ctx, pgxlanes.Long), "select pg_backend_pid()").Scan(&first))
		assert.Equal(t, [3]int{0, 0, 1}, inUse(pool), "pinned on Long")
		assert.Equal(t, first, pid(conn), "later statements stay on the pinned session")
		require.NoError(t, conn.Close())
		assert.Equal(t, [3]int{}, inUse(pool))
	})

	t.Run("db.Conn's ctx names Long", func(t *testing.T) {
		conn, err := db.Conn(pgxlanes.WithLane(ctx, pgxlanes.Long))
		require.NoError(t, err)
		first := pid(conn)
		assert.Equal(t, [3]int{0, 0, 1}, inUse(pool), "pinned on Long")
		assert.Equal(t, first, pid(conn))
		require.NoError(t, conn.Close())
		assert.Equal(t, [3]int{}, inUse(pool))
	})

	t.Run("db call's ctx", func(t *testing.T) {
		rows, err := db.QueryContext(pgxlanes.WithLane(ctx, pgxlanes.Long), "select g from generate_series(1, 2) g")
		require.NoError(t, err)
		assert.Equal(t, [3]int{0, 0, 1}, inUse(pool))
		require.NoError(t, rows.Close())
		assert.Equal(t, [3]int{}, inUse(pool), "the end of the call released it")
	})

	t.Run("OptionPinLane", func(t *testing.T) {
		migrate := stdlib.OpenDBFromPool(pool, stdlib.OptionPinLane(pgxlanes.Tx))
		defer migrate.Close()
		conn, err := migrate.Conn(ctx)
		require.NoError(t, err)
		_, err = conn.ExecContext(ctx, "select pg_advisory_lock(42)")
		require.NoError(t, err)
		assert.Equal(t, [3]int{0, 1, 0}, inUse(pool))
		var unlocked bool
		require.NoError(t, conn.QueryRowContext(ctx, "select pg_advisory_unlock(42)").Scan(&unlocked))
		assert.True(t, unlocked, "the session that took the lock released it")
		require.NoError(t, conn.Close())
		assert.Equal(t, [3]int{}, inUse(pool))
	})
	lanesIdle(t, pool)
}

// Bad input gets an error that names it.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	err := stdlib.OpenDBFromPool(nil).PingContext(ctx)
	require.ErrorContains(t, err, "pool is nil")

	pool, db := open(t, "pool_max_conns=4")
	short := stdlib.OpenDBFromPool(pool, stdlib.OptionPinLane(pgxlanes.Short))
	defer short.Close()
	require.ErrorContains(t, short.PingContext(ctx), "OptionPinLane: lane short cannot be pinned")

	_, err = db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelLinearizable})
	require.ErrorContains(t, err, "unsupported isolation level Linearizable")
	assert.Equal(t, [3]int{}, inUse(pool))

	_, err = stdlib.Driver{}.Open("postgres://x")
	require.ErrorContains(t, err, "OpenDBFromPool")
}

// Prepared statements run per call on whatever the connection routes to.
func TestPrepared(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=4")
	stmt, err := db.PrepareContext(ctx, "select $1::int + 1")
	require.NoError(t, err)
	defer stmt.Close()
	var n int
	require.NoError(t, stmt.QueryRowContext(ctx, 41).Scan(&n))
	assert.Equal(t, 42, n)
	assert.Equal(t, [3]int{}, inUse(pool))

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, tx.StmtContext(ctx, stmt).QueryRowContext(ctx, 1).Scan(&n))
	assert.Equal(t, 2, n)
	assert.Equal(t, [3]int{0, 1, 0}, inUse(pool), "in a transaction, on its lease")
	require.NoError(t, tx.Rollback())

	bad, err := db.PrepareContext(ctx, "selec 1")
	require.NoError(t, err, "nothing is prepared on the server")
	_, err = bad.ExecContext(ctx)
	require.ErrorContains(t, err, "syntax error")
	lanesIdle(t, pool)
}

// A deadline (or a cancel) returns the context's error through database/sql, for a statement,
// open rows and a transaction's statement; the lanes come back, the interrupted sessions are
// kept, and no goroutine is left behind.
func TestContextDeadline(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pool, err := pgxlanes.New(context.Background(), withParams(dsn, "pool_max_conns=4"))
	require.NoError(t, err)
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	deadline := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 200*time.Millisecond)
	}
	ctx, cancel := deadline()
	var v int
	err = db.QueryRowContext(ctx, "select 1 from pg_sleep(30)").Scan(&v)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "QueryRowContext")

	ctx, cancel = deadline()
	_, err = db.ExecContext(ctx, "select pg_sleep(30)")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "ExecContext")

	// Rows that stream for far longer than the test (in the target list, generate_series
	// streams), read until the ctx is cancelled.
	cctx, cancelRows := context.WithCancel(context.Background())
	rows, err := db.QueryContext(cctx, "select generate_series(1, 1000000000)")
	require.NoError(t, err)
	for i := 0; rows.Next(); i++ {
		if i == 1000 {
			cancelRows()
		}
	}
	require.ErrorIs(t, rows.Err(), context.Canceled, "reading rows")
	_ = rows.Close() // repeats the rows' error, as pgx's stdlib does
	cancelRows()

	lanesIdle(t, pool) // the interrupted sessions are cleaned and kept: BeginTx needs no dial
	ctx, cancel = deadline()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "select pg_sleep(30)")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a transaction's statement")
	if err := tx.Rollback(); err != nil { // nil if it came before database/sql's own rollback
		require.ErrorIs(t, err, sql.ErrTxDone, "database/sql rolled back when ctx ended")
	}

	lanesIdle(t, pool)
	st := pool.Stat()
	assert.Equal(t, st.NewConnsCount(), int64(st.TotalConns()), "every interrupted session was kept")
}

// When a transaction's ctx ends, database/sql rolls it back; the rollback does not close the
// server session (pgx would, with the ended ctx).
func TestTransactionContextEndKeepsSession(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=4")
	txPID := func(ctx context.Context) (*sql.Tx, int) {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		var pid int
		require.NoError(t, tx.QueryRowContext(ctx, "select pg_backend_pid()").Scan(&pid))
		return tx, pid
	}
	tx, first := txPID(ctx)
	require.NoError(t, tx.Commit())
	news := pool.Stat().NewConnsCount()

	cctx, cancel := context.WithCancel(ctx)
	_, pid := txPID(cctx)
	assert.Equal(t, first, pid)
	cancel()
	lanesIdle(t, pool)

	tx, pid = txPID(ctx)
	require.NoError(t, tx.Commit())
	assert.Equal(t, first, pid, "the same server session")
	assert.Equal(t, news, pool.Stat().NewConnsCount(), "no new connection")
}

// WithBudget and WithTag reach the pool: a transaction over its budget is cancelled with a
// *BudgetError that carries the tag.
func TestBudgetAndTagPassThrough(t *testing.T) {
	pool, db := open(t, "pool_max_conns=4")
	ctx := pgxlanes.WithTag(pgxlanes.WithBudget(context.Background(), 300*time.Millisecond), "report")
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, "select pg_sleep(10)")
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
	var be *pgxlanes.BudgetError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "report", be.Tag)
	assert.Equal(t, pgxlanes.Tx, be.Lane)
	assert.Equal(t, 300*time.Millisecond, be.Budget)
	_ = tx.Rollback()
	assert.Equal(t, int64(1), lane(pool, pgxlanes.Tx).BudgetCancels)
	lanesIdle(t, pool)
}

// Many goroutines mixing statements, rows, transactions and pinned connections for a bounded
// time: no error, and every lane idle at the end.
func TestConcurrentMix(t *testing.T) {
	ctx := context.Background()
	pool, db := open(t, "pool_max_conns=6")
	_, err := db.ExecContext(ctx, "create table kv (k int primary key, v int not null)")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "insert into kv select g, 0 from generate_series(1, 16) g")
	require.NoError(t, err)
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				var err error
				switch (g + i) % 4 {
				case 0:
					var v int
					err = db.QueryRowContext(ctx, "select v from kv where k = $1", g+1).Scan(&v)
				case 1:
					err = inTx(ctx, db, func(tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, "update kv set v = v + 1 where k = $1", g+1)
						return err
					})
				case 2:
					var rows *sql.Rows
					if rows, err = db.QueryContext(ctx, "select k, v from kv"); err == nil {
						for rows.Next() {
						}
						err = errors.Join(rows.Err(), rows.Close())
					}
				case 3:
					err = pinned(ctx, db, g+1)
				}
				if !assert.NoError(t, err) {
					return
				}
			}
		})
	}
	wg.Wait()
	var sum int
	require.NoError(t, db.QueryRowContext(ctx, "select sum(v) from kv").Scan(&sum))
	assert.Positive(t, sum)
	lanesIdle(t, pool)
}

func inTx(ctx context.Context, db *sql.DB, f func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

// pinned takes a session advisory lock on a pinned sql.Conn and gives it back on the same one.
func pinned(ctx context.Context, db *sql.DB, key int) error {
	conn, err := db.Conn(pgxlanes.WithLane(ctx, pgxlanes.Tx))
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "select pg_advisory_lock($1)", key); err != nil {
		return err
	}
	var ok bool
	if err := conn.QueryRowContext(ctx, "select pg_advisory_unlock($1)", key).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("advisory lock taken on another session")
	}
	return nil
}
