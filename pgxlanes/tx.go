package pgxlanes

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// poolTx is a transaction from Pool.Begin: its connection and lane slot are released by Commit or
// Rollback. Both are safe to call more than once, so defer tx.Rollback(ctx) is fine after Commit.
// Once the guard cancelled or terminated the transaction for exceeding its budget, every call
// but Rollback fails with a *BudgetError (errors.Is(err, ErrBudgetExceeded)).
type poolTx struct {
	t pgx.Tx
	l *lease
}

// Begin starts a pseudo nested transaction (a savepoint).
func (tx *poolTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := tx.l.over(); err != nil {
		return nil, err
	}
	t, err := tx.t.Begin(ctx)
	return t, tx.l.wrap(err)
}

// Commit commits and releases the connection. If the guard acted on the transaction, it rolls
// back instead and returns the *BudgetError.
func (tx *poolTx) Commit(ctx context.Context) error {
	if err := tx.l.over(); err != nil {
		_ = tx.t.Rollback(ctx)
		tx.l.release()
		return err
	}
	err := tx.t.Commit(ctx)
	tx.l.release()
	return tx.l.wrap(err)
}

// Rollback rolls back and releases the connection. After the guard acted on the transaction it
// returns nil: the server has rolled back (or will, as the session ends).
func (tx *poolTx) Rollback(ctx context.Context) error {
	err := tx.t.Rollback(ctx)
	tx.l.release()
	if tx.l.over() != nil {
		return nil
	}
	return err
}

func (tx *poolTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := tx.l.over(); err != nil {
		return 0, err
	}
	n, err := tx.t.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, tx.l.wrap(err)
}

func (tx *poolTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := tx.l.over(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return &poolBatchResults{br: tx.t.SendBatch(ctx, b), l: tx.l}
}

func (tx *poolTx) LargeObjects() pgx.LargeObjects { return tx.t.LargeObjects() }

func (tx *poolTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := tx.l.over(); err != nil {
		return nil, err
	}
	sd, err := tx.t.Prepare(ctx, name, sql)
	return sd, tx.l.wrap(err)
}

func (tx *poolTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	return exec(tx.l, tx.t.Exec, ctx, sql, arguments)
}

func (tx *poolTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return query(tx.l, tx.t.Query, ctx, sql, args)
}

func (tx *poolTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return queryRow(tx.l, tx.t.QueryRow, ctx, sql, args)
}

func (tx *poolTx) Conn() *pgx.Conn { return tx.t.Conn() }

// exec, query and queryRow run a statement of a transaction or held connection, failing fast
// and translating errors once the guard acted on its lease. A lock timeout is blamed on its
// likely holders, as for the pool's own statements.
func exec(l *lease, f func(context.Context, string, ...any) (pgconn.CommandTag, error), ctx context.Context, sql string, args []any) (pgconn.CommandTag, error) {
	if err := l.over(); err != nil {
		return pgconn.CommandTag{}, err
	}
	ct, err := f(ctx, sql, args...)
	if err != nil {
		l.p.blameLockTimeout(l, err)
	}
	return ct, l.wrap(err)
}

func query(l *lease, f func(context.Context, string, ...any) (pgx.Rows, error), ctx context.Context, sql string, args []any) (pgx.Rows, error) {
	if err := l.over(); err != nil {
		return errRows{err: err}, err
	}
	rows, err := f(ctx, sql, args...)
	if err != nil {
		l.p.blameLockTimeout(l, err)
		err = l.wrap(err)
		return errRows{err: err}, err
	}
	return &leaseRows{Rows: rows, l: l}, nil
}

func queryRow(l *lease, f func(context.Context, string, ...any) pgx.Row, ctx context.Context, sql string, args []any) pgx.Row {
	if err := l.over(); err != nil {
		return errRow{err: err}
	}
	return &leaseRow{r: f(ctx, sql, args...), l: l}
}
