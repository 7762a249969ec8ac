package wire_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/internal/wire"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

const resetSQL = "reset statement_timeout; reset lock_timeout"

// connect opens a pgx connection whose socket is a wire.Conn and whose context handler is it.
func connect(t *testing.T, dsn string, mode pgx.QueryExecMode) (*pgx.Conn, *wire.Conn) {
	t.Helper()
	return connectVia(t, dsn, mode, nil)
}

// connectVia is connect with the socket wrapped by wrap (if not nil) under the wire.Conn.
func connectVia(t *testing.T, dsn string, mode pgx.QueryExecMode, wrap func(net.Conn) net.Conn) (*pgx.Conn, *wire.Conn) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = mode
	if overTLS(t) {
		cfg.DialFunc = dialTLS
	}
	var w *wire.Conn
	cfg.AfterNetConnect = func(ctx context.Context, _ *pgconn.Config, c net.Conn) (net.Conn, error) {
		// A generous grace: a cancel request is a new connection that the postmaster forks a
		// process for, which on a loaded machine has taken over 2 s (the drain then gives up, and
		// the tests that expect the session kept fail for the machine's sake).
		if wrap != nil {
			c = wrap(c)
		}
		w = wire.New(c, wire.Options{ResetSQL: resetSQL, Grace: 10 * time.Second})
		return w, nil
	}
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		wc := pc.Conn().(*wire.Conn)
		wc.SetCancel(pc.CancelRequest)
		return wc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c, w
}

func waitClean(t *testing.T, w *wire.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second) // past the grace
	defer cancel()
	require.NoError(t, w.Wait(ctx))
	require.NoError(t, w.Err(), "connection broken after drain")
}

func pid(t *testing.T, c *pgx.Conn) int32 {
	t.Helper()
	var p int32
	require.NoError(t, c.QueryRow(context.Background(), "select pg_backend_pid()").Scan(&p))
	return p
}

func TestDeadlineReturnsAtOnceAndKeepsSession(t *testing.T) {
	c, w := connect(t, liveDSN(t), pgx.QueryExecModeCacheStatement)
	before := pid(t, c)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		start := time.Now()
		_, err := c.Exec(ctx, "select pg_sleep($1)", mode, 2)
		took := time.Since(start)
		cancel()
		require.Error(t, err, mode)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%v: %v", mode, err)
		assert.Equal(t, "57014", pgErr.Code)
		assert.Less(t, took, 500*time.Millisecond, mode)
		assert.ErrorIs(t, w.Cause(), context.DeadlineExceeded)
		waitClean(t, w)
		assert.Equal(t, before, pid(t, c), "same session after %v", mode)
	}
}

// heldWriteConn holds its next write back before the system call, once told to, as a goroutine
// that does not run (a loaded machine, a CPU quota) would; it exposes what it wraps, as *tls.Conn
// does.
type heldWriteConn struct {
	net.Conn
	hold atomic.Int64 // how long to hold the next write back, in nanoseconds
}

func (c *heldWriteConn) Write(b []byte) (int, error) {
	if d := c.hold.Swap(0); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return c.Conn.Write(b)
}

func (c *heldWriteConn) NetConn() net.Conn { return c.Conn }

// A statement's deadline ends while its request's write is held back before its system call
// (5 × writeStall), the socket taking bytes all along: the request goes out late and whole, the
// statement is cancelled and drained, and the session is kept. Before, a write deadline ended
// such a write with nothing sent and the session was lost (over TLS, the TLS session too; under
// TestLiveOverTLS wire looks at the socket through the *tls.Conn).
func TestDescheduledWriteKeepsSession(t *testing.T) {
	var hw *heldWriteConn
	c, w := connectVia(t, liveDSN(t), pgx.QueryExecModeSimpleProtocol, func(nc net.Conn) net.Conn {
		hw = &heldWriteConn{Conn: nc}
		return hw
	})
	before := pid(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	hw.hold.Store(int64(20*time.Millisecond + 5*wire.WriteStall)) // the deadline ends inside the hold
	_, err := c.Exec(ctx, "select pg_sleep(2)")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	assert.Equal(t, "57014", pgErr.Code)
	waitClean(t, w)
	assert.Equal(t, before, pid(t, c), "the session was lost")
}

func TestStagedSettingsCostNoRoundTripAndAreSwallowed(t *testing.T) {
	c, w := connect(t, liveDSN(t), pgx.QueryExecModeCacheStatement)
	ctx := context.Background()
	show := func() (st, lt string) {
		require.NoError(t, c.QueryRow(ctx, "select current_setting('statement_timeout'), current_setting('lock_timeout')").Scan(&st, &lt))
		return st, lt
	}
	w.Stage("set statement_timeout = 12345; set lock_timeout = 777")
	st, lt := show()
	assert.Equal(t, "12345ms", st)
	assert.Equal(t, "777ms", lt)
	w.Stage("")
	st, lt = show()
	assert.Equal(t, "0", st)
	assert.Equal(t, "0", lt)
	// Staging what is applied cancels a staged change.
	w.Stage("set statement_timeout = 1000; set lock_timeout = 1000")
	_, _ = show()
	w.Stage("")
	w.Stage("set statement_timeout = 1000; set lock_timeout = 1000")
	st, _ = show()
	assert.Equal(t, "1s", st)
	assert.False(t, w.Failed())
}

func TestAfterBegin(t *testing.T) {
	c, w := connect(t, liveDSN(t), pgx.QueryExecModeCacheStatement)
	ctx := context.Background()
	w.After("set local lock_timeout = 4321")
	tx, err := c.Begin(ctx)
	require.NoError(t, err)
	var lt string
	require.NoError(t, tx.QueryRow(ctx, "select current_setting('lock_timeout')").Scan(&lt))
	assert.Equal(t, "4321ms", lt)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, c.QueryRow(ctx, "select current_setting('lock_timeout')").Scan(&lt))
	assert.Equal(t, "0", lt)
}

func TestRowsInterruptedMidStream(t *testing.T) {
	c, w := connect(t, liveDSN(t), pgx.QueryExecModeCacheStatement)
	const q = "select generate_series(1, $1::int), repeat('x', 200)"
	rows, err := c.Query(context.Background(), q, 1) // prepared outside any deadline
	require.NoError(t, err)
	rows.Close()
	before := pid(t, c)
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		rows, err := c.Query(ctx, q, 50_000_000)
		require.NoError(t, err)
		n := 0
		for rows.Next() {
			if n++; n == 1000 {
				cancel() // in the middle of the stream
			}
		}
		err = rows.Err()
		cancel()
		require.ErrorContains(t, err, "57014")
		assert.GreaterOrEqual(t, n, 1000)
		assert.ErrorIs(t, w.Cause(), context.Canceled)
		waitClean(t, w)
		assert.Equal(t, before, pid(t, c))
	}
}

func TestTransactionAbortedThenRolledBack(t *testing.T) {
	c, w := connect(t, liveDSN(t), pgx.QueryExecModeCacheStatement)
	bg := context.Background()
	tx, err := c.Begin(bg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	_, err = tx.Exec(ctx, "select pg_sleep(2)")
	cancel()
	require.Error(t, err)
	assert.Equal(t, byte('E'), c.PgConn().TxStatus())
	waitClean(t, w)
	require.NoError(t, tx.Rollback(bg))
	assert.Equal(t, byte('I'), c.PgConn().TxStatus())
	var one int
	require.NoError(t, c.QueryRow(bg, "select 1").Scan(&one))
}

func TestBatchInterrupted(t *testing.T) {
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			c, w := connect(t, liveDSN(t), mode)
			bg := context.Background()
			// Warm the statement cache so that the interrupted batch prepares nothing.
			warm := &pgx.Batch{}
			warm.Queue("select 1")
			warm.Queue("select pg_sleep($1)", 0)
			require.NoError(t, c.SendBatch(bg, warm).Close())
			before := pid(t, c)
			ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
			b := &pgx.Batch{}
			b.Queue("select 1")
			b.Queue("select pg_sleep($1)", 2)
			err := c.SendBatch(ctx, b).Close()
			cancel()
			require.Error(t, err)
			waitClean(t, w)
			assert.Equal(t, before, pid(t, c))
		})
	}
}

// A request that creates a named statement and is ended early leaves pgx believing it has no
// such statement, whether or not the server created it; the drain closes it, so that the session
// is kept and the next Prepare of the name succeeds (without the Close it fails with 42P05).
// Two cuts: one in the Parse itself (its parse analysis waits for a lock), one after the server
// created the statement (in the same request, a statement that sleeps).
func TestNamedPrepareInterruptedIsUndone(t *testing.T) {
	dsn := liveDatabase(t)
	c, w := connect(t, dsn, pgx.QueryExecModeCacheStatement)
	bg := context.Background()
	_, err := c.Exec(bg, "create table locked (id int)")
	require.NoError(t, err)
	holder, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer holder.Close(bg)
	tx, err := holder.Begin(bg)
	require.NoError(t, err)
	defer tx.Rollback(bg) //nolint:errcheck
	_, err = tx.Exec(bg, "lock table locked in access exclusive mode")
	require.NoError(t, err)
	before := pid(t, c)

	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	_, err = c.Prepare(ctx, "slow", "select * from locked") // parse analysis waits for the lock
	cancel()
	require.Error(t, err)
	waitClean(t, w)
	require.NoError(t, tx.Rollback(bg))
	_, err = c.Prepare(bg, "slow", "select * from locked")
	require.NoError(t, err)
	_, err = c.Exec(bg, "slow")
	require.NoError(t, err)

	// The server creates the statement and then sleeps, in one request: the cut comes after
	// the statement exists. Outside a transaction, and inside one, which the cut aborts.
	for _, inTx := range []bool{false, true} {
		name := fmt.Sprintf("made_%v", inTx)
		if inTx {
			_, err = c.Exec(bg, "begin")
			require.NoError(t, err)
		}
		ctx, cancel = context.WithTimeout(bg, 100*time.Millisecond)
		pl := c.PgConn().StartPipeline(ctx)
		pl.SendPrepare(name, "select 2", nil)
		pl.SendQueryParams("select pg_sleep(5)", nil, nil, nil, nil)
		require.NoError(t, pl.Sync())
		var perr error
		for perr == nil {
			_, perr = pl.GetResults()
		}
		_ = pl.Close()
		cancel()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, perr, &pgErr)
		require.Equal(t, "57014", pgErr.Code)
		waitClean(t, w)
		require.False(t, w.Broken(), "in a transaction: %v", inTx)
		if inTx {
			require.Equal(t, byte('E'), c.PgConn().TxStatus())
			_, err = c.Exec(bg, "rollback")
			require.NoError(t, err)
		}
		var n int
		require.NoError(t, c.QueryRow(bg, "select count(*) from pg_prepared_statements where name = $1", name).Scan(&n))
		assert.Zero(t, n, "the statement the cut request created is closed (in a transaction: %v)", inTx)
		_, err = c.Prepare(bg, name, "select 2")
		require.NoError(t, err, "the name is free again")
	}
	assert.Equal(t, before, pid(t, c), "the session was kept")
	assert.False(t, w.Broken())
}

func TestWaitForNotificationTimesOutAndKeepsSession(t *testing.T) {
	dsn := liveDSN(t)
	c, w := connect(t, dsn, pgx.QueryExecModeCacheStatement)
	bg := context.Background()
	_, err := c.Exec(bg, "listen pgxlanes_wire")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	_, err = c.WaitForNotification(ctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, w.Broken())
	other, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer other.Close(bg)
	_, err = other.Exec(bg, "notify pgxlanes_wire, 'hello'")
	require.NoError(t, err)
	ctx, cancel = context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	n, err := c.WaitForNotification(ctx)
	require.NoError(t, err)
	assert.Equal(t, "hello", n.Payload)
}

// A COPY FROM STDIN whose source stalls past the deadline: the caller's CopyFrom returns as soon
// as its source does, with the 57014; the server got a CopyFail at the deadline, so the drain
// ended at once, nothing was copied, and the session is kept.
func TestCopyInterruptedKeepsSession(t *testing.T) {
	c, w := connect(t, liveDSN(t), pgx.QueryExecModeCacheStatement)
	bg := context.Background()
	_, err := c.Exec(bg, "create temp table sink (id int)")
	require.NoError(t, err)
	before := pid(t, c)
	src, feed := io.Pipe()
	go func() {
		_, _ = feed.Write([]byte("1\n2\n"))
		time.Sleep(500 * time.Millisecond) // the source stalls past the deadline
		_ = feed.Close()
	}()
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	_, err = c.PgConn().CopyFrom(ctx, src, "copy sink from stdin")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	assert.Equal(t, "57014", pgErr.Code)
	waitClean(t, w)
	assert.Equal(t, before, pid(t, c))
	var n int
	require.NoError(t, c.QueryRow(bg, "select count(*) from sink").Scan(&n))
	assert.Zero(t, n)
}
