package pgxlanes

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conn is a held connection from Pool.Acquire. It has the methods of *pgxpool.Conn. It and its
// lane slot are held until Release or Hijack. It must not be used by two goroutines at once.
// Once the guard cancelled or terminated it for exceeding its budget, its calls fail with a
// *BudgetError (errors.Is(err, ErrBudgetExceeded)).
type Conn struct {
	l *lease
}

// Release returns the connection to the pool and its slot to the lane. It is safe to call more
// than once. A connection that is closed or inside a transaction is destroyed, not reused.
func (c *Conn) Release() { c.l.release() }

// Hijack takes the connection out of the pool: the caller owns and must close it. The lane slot
// is freed at once. It panics if the connection was already released or hijacked.
func (c *Conn) Hijack() *pgx.Conn { return c.l.hijack() }

// Lane returns the lane the connection was acquired on.
func (c *Conn) Lane() Lane { return c.l.lane }

func (c *Conn) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	return exec(c.l, c.l.conn.Exec, ctx, sql, arguments)
}

func (c *Conn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return query(c.l, c.l.conn.Query, ctx, sql, args)
}

func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return queryRow(c.l, c.l.conn.QueryRow, ctx, sql, args)
}

func (c *Conn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := c.l.over(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return &poolBatchResults{br: c.l.conn.SendBatch(ctx, b), l: c.l}
}

func (c *Conn) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := c.l.over(); err != nil {
		return 0, err
	}
	n, err := c.l.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, c.l.wrap(err)
}

// Begin starts a transaction on the held connection; the lane's timeouts are already set on its
// session. Ending the transaction does not release the connection.
func (c *Conn) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx is Begin with options.
func (c *Conn) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	if err := c.l.over(); err != nil {
		return nil, err
	}
	t, err := c.l.conn.BeginTx(ctx, txOptions)
	return t, c.l.wrap(err)
}

func (c *Conn) Ping(ctx context.Context) error {
	if err := c.l.over(); err != nil {
		return err
	}
	return c.l.wrap(c.l.conn.Ping(ctx))
}

// Conn returns the underlying *pgx.Conn. It stays owned by the pool.
func (c *Conn) Conn() *pgx.Conn { return c.l.conn }
