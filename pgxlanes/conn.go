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
	l *lease
}

// Release returns the connection to the pool and its slot to the lane. It is safe to call more
// than once. A connection that is closed, busy or inside a transaction is destroyed, not reused.
func (c *Conn) Release() { c.l.release() }

// Hijack takes the connection out of the pool: the caller owns and must close it. The lane slot
// is freed at once, and the session is back at its defaults before its next statement. It panics
// if the connection was already released or hijacked, as pgxpool's does.
func (c *Conn) Hijack() *pgx.Conn { return c.l.hijack() }

// Lane returns the lane the connection was acquired on.
func (c *Conn) Lane() Lane { return c.l.rt.lane }

func (c *Conn) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if err := c.l.check(); err != nil {
		return pgconn.CommandTag{}, err
	}
	ct, err := c.l.conn.Exec(ctx, sql, arguments...)
	return ct, c.l.fail(err)
}

func (c *Conn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := c.l.check(); err != nil {
		return errRows{err: err}, err
	}
	return queryOn(c.l, c.l.conn.Query, ctx, sql, args)
}

func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := c.l.check(); err != nil {
		return errRow{err: err}
	}
	return &leaseRow{r: c.l.conn.QueryRow(ctx, sql, args...), l: c.l}
}

func (c *Conn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := c.l.check(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if err := flushForExecBatch(ctx, c.l); err != nil {
		return pgx.FailedBatchResults(b, c.l.fail(err))
	}
	return &leaseBatch{br: c.l.conn.SendBatch(ctx, b), l: c.l}
}

func (c *Conn) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := c.l.check(); err != nil {
		return 0, err
	}
	n, err := c.l.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, c.l.fail(err)
}

// Begin starts a transaction on the held connection, under the lane's timeouts. Ending the
// transaction does not release the connection.
func (c *Conn) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx is Begin with options. The transaction's calls fail with a *BudgetError once the guard
// acted on the connection, as the connection's own calls do.
func (c *Conn) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	if err := c.l.check(); err != nil {
		return nil, err
	}
	t, err := c.l.conn.BeginTx(ctx, txOptions)
	if err != nil {
		return nil, c.l.fail(err)
	}
	return &leaseTx{t: t, l: c.l}, nil
}

func (c *Conn) Ping(ctx context.Context) error {
	if err := c.l.check(); err != nil {
		return err
	}
	return c.l.fail(c.l.conn.Ping(ctx))
}

// Conn returns the underlying *pgx.Conn. It stays owned by the pool. It panics after Release,
// when the connection may serve another caller.
func (c *Conn) Conn() *pgx.Conn {
	if c.l.released.Load() {
		panic("pgxlanes: Conn.Conn called after Release or Hijack")
	}
	return c.l.conn
}
