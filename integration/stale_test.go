package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestStaleBatchTxNeverReachesTheConnection: the transaction of a held connection's batch begun
// with pgx.Batch.BeginTx is the lease's, not pgx's own. After a statement of it is cut by a
// deadline (the pool cleans the connection and keeps it) and the connection is released to
// another caller, the stale transaction's "rollback" must not roll back the other caller's work.
func TestStaleBatchTxNeverReachesTheConnection(t *testing.T) {
	bg := context.Background()
	p := newLanes(t, newDB(t, 1), "pool_max_conns=2&lane_short_reserved=1") // one connection for Tx
	_, err := p.Exec(bg, "create table t (id int)")
	require.NoError(t, err)

	c, err := p.Acquire(bg)
	require.NoError(t, err)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("select 1")
	br := c.SendBatch(bg, b)
	stale := br.Tx()
	require.NotNil(t, stale)
	require.NoError(t, br.Close())
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	_, err = stale.Exec(ctx, "select pg_sleep(2)")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "the batch's transaction reports the deadline as the pool's calls do")
	c.Release()
	lanesIdle(t, p, "after the cleanup")

	other, err := p.Begin(bg) // the same connection, now another caller's
	require.NoError(t, err)
	_, err = other.Exec(bg, "insert into t values (1)")
	require.NoError(t, err)
	_, err = stale.Exec(bg, "rollback")
	require.ErrorIs(t, err, pgxlanes.ErrReleased)
	require.NoError(t, other.Commit(bg))
	var n int
	require.NoError(t, p.QueryRow(bg, "select count(*) from t").Scan(&n))
	assert.Equal(t, 1, n, "the other caller's committed row")
}

// TestStaleLargeObjectsPanic: a transaction whose connection went back to the pool refuses to
// hand out its large objects, which would run on another caller's transaction.
func TestStaleLargeObjectsPanic(t *testing.T) {
	bg := context.Background()
	p := newLanes(t, newDB(t, 1), "pool_max_conns=2&lane_short_reserved=1") // one connection for Tx
	tx, err := p.Begin(bg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	_, err = tx.Exec(ctx, "select pg_sleep(2)")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, tx.Rollback(bg))
	lanesIdle(t, p, "after the cleanup")

	other, err := p.Begin(bg) // the same connection, now another caller's
	require.NoError(t, err)
	require.PanicsWithValue(t, "pgxlanes: Tx.LargeObjects called after the transaction's connection was released",
		func() { tx.LargeObjects() })
	var n int
	require.NoError(t, other.QueryRow(bg, "select count(*) from pg_largeobject_metadata").Scan(&n))
	assert.Zero(t, n)
	require.NoError(t, other.Rollback(bg))
}

// TestStaleRowsRefuseEveryRead: rows of a held connection still open at Release refuse every
// later read, not only the first.
func TestStaleRowsRefuseEveryRead(t *testing.T) {
	bg := context.Background()
	p := newLanes(t, newDB(t, 1), "pool_max_conns=2")
	c, err := p.Acquire(bg)
	require.NoError(t, err)
	rows, err := c.Query(bg, "select g from generate_series(1, 3) g")
	require.NoError(t, err)
	require.True(t, rows.Next())
	c.Release()
	for range 3 {
		var v int
		require.ErrorIs(t, rows.Scan(&v), pgxlanes.ErrReleased)
		_, err := rows.Values()
		require.ErrorIs(t, err, pgxlanes.ErrReleased)
		require.False(t, rows.Next())
	}
	rows.Close()
	require.ErrorIs(t, rows.Err(), pgxlanes.ErrReleased)
}
