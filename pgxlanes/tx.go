package pgxlanes

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// poolTx is a transaction from Pool.Begin: its connection and lane slot are released by Commit or
// Rollback. Both are safe to call more than once, so defer tx.Rollback(ctx) is fine after Commit.
type poolTx struct {
	t pgx.Tx
	l *lease
}

// Begin starts a pseudo nested transaction (a savepoint).
func (tx *poolTx) Begin(ctx context.Context) (pgx.Tx, error) { return tx.t.Begin(ctx) }

func (tx *poolTx) Commit(ctx context.Context) error {
	err := tx.t.Commit(ctx)
	tx.l.release()
	return err
}

func (tx *poolTx) Rollback(ctx context.Context) error {
	err := tx.t.Rollback(ctx)
	tx.l.release()
	return err
}

func (tx *poolTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	return tx.t.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (tx *poolTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return tx.t.SendBatch(ctx, b)
}

func (tx *poolTx) LargeObjects() pgx.LargeObjects { return tx.t.LargeObjects() }

func (tx *poolTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return tx.t.Prepare(ctx, name, sql)
}

func (tx *poolTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	return tx.t.Exec(ctx, sql, arguments...)
}

func (tx *poolTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return tx.t.Query(ctx, sql, args...)
}

func (tx *poolTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return tx.t.QueryRow(ctx, sql, args...)
}

func (tx *poolTx) Conn() *pgx.Conn { return tx.t.Conn() }
