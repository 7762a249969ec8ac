package pgxlanes

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conn is a held connection from Pool.Acquire. It has the methods of *pgxpool.Conn. It and its
// lane slot are held until Release or Hijack. It must not be used by two goroutines at once.
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
	return c.l.conn.Exec(ctx, sql, arguments...)
}

func (c *Conn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return c.l.conn.Query(ctx, sql, args...)
}

func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return c.l.conn.QueryRow(ctx, sql, args...)
}

func (c *Conn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return c.l.conn.SendBatch(ctx, b)
}

func (c *Conn) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	return c.l.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

// Begin starts a transaction on the held connection; the lane's timeouts are already set on its
// session. Ending the transaction does not release the connection.
func (c *Conn) Begin(ctx context.Context) (pgx.Tx, error) { return c.l.conn.Begin(ctx) }

// BeginTx is Begin with options.
func (c *Conn) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	return c.l.conn.BeginTx(ctx, txOptions)
}

func (c *Conn) Ping(ctx context.Context) error { return c.l.conn.Ping(ctx) }

// Conn returns the underlying *pgx.Conn. It stays owned by the pool.
func (c *Conn) Conn() *pgx.Conn { return c.l.conn }
