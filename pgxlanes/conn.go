package pgxlanes

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conn is a held connection from Pool.Acquire. It has the methods of *pgxpool.Conn. It and its
// lane slot are held until Release or Hijack. It must not be used by two goroutines at once.
// Once the guard cancelled or terminated it for exceeding its budget, its calls fail with a
// *BudgetError (errors.Is(err, ErrBudgetExceeded)). After Release its calls, and those of rows
// and transactions taken from it, fail with ErrReleased and never reach the connection.
type Conn struct {
	l    *lease
	gen  uint64 // the hold of l this Conn is
	lane Lane
}

// Release returns the connection to the pool and its slot to the lane. It is safe to call more
// than once. A connection that is closed, busy or inside a transaction is destroyed, not reused.
func (c *Conn) Release() { c.l.release(c.gen) }

// Hijack takes the connection out of the pool: the caller owns and must close it. The lane slot
// is freed at once, and the session is back at its defaults before its next statement. It panics
// if the connection was already released or hijacked, as pgxpool's does.
func (c *Conn) Hijack() *pgx.Conn { return c.l.hijack(c.gen) }

// Lane returns the lane the connection was acquired on.
func (c *Conn) Lane() Lane { return c.lane }

func (c *Conn) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	return run(c.l, c.l.check(c.gen), func() (pgconn.CommandTag, error) { return c.l.conn.Exec(ctx, sql, arguments...) })
}

func (c *Conn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := c.l.check(c.gen); err != nil {
		return errRows{err: err}, err
	}
	return queryOn(c.l, c.l.conn.Query, ctx, sql, args)
}

func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := c.l.check(c.gen); err != nil {
		return errRow{err: err}
	}
	return c.l.newRow(c.l.conn.QueryRow(ctx, sql, args...), false)
}

func (c *Conn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := c.l.check(c.gen); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if err := flushForExecBatch(ctx, c.l); err != nil {
		return pgx.FailedBatchResults(b, c.l.fail(err))
	}
	return &leaseBatch{br: c.l.conn.SendBatch(ctx, b), l: c.l, gen: c.gen}
}

func (c *Conn) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	return run(c.l, c.l.check(c.gen), func() (int64, error) { return c.l.conn.CopyFrom(ctx, tableName, columnNames, rowSrc) })
}

// Begin starts a transaction on the held connection, under the lane's timeouts. Ending the
// transaction does not release the connection.
func (c *Conn) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx is Begin with options. The transaction's calls fail with a *BudgetError once the guard
// acted on the connection, as the connection's own calls do.
func (c *Conn) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	t, err := run(c.l, c.l.check(c.gen), func() (pgx.Tx, error) { return c.l.conn.BeginTx(ctx, txOptions) })
	if err != nil {
		return nil, err
	}
	return c.l.newTx(t, false), nil
}

func (c *Conn) Ping(ctx context.Context) error {
	_, err := run(c.l, c.l.check(c.gen), func() (struct{}, error) { return struct{}{}, c.l.conn.Ping(ctx) })
	return err
}

// Conn returns the underlying *pgx.Conn. It stays owned by the pool. It panics after Release,
// when the connection may serve another caller. Over TLS with channel binding it first waits for
// the cleaning of a statement cut by its context, at most CancelGrace: a batch written with the
// *pgx.Conn's PgConn could otherwise be cancelled by it.
func (c *Conn) Conn() *pgx.Conn {
	if c.l.stale(c.gen) {
		panic("pgxlanes: Conn.Conn called after Release or Hijack")
	}
	awaitDrainBeside(c.l)
	return c.l.conn
}
