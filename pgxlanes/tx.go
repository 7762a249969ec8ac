package pgxlanes

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// leaseTx is a transaction on a lease: from Pool.Begin (release: Commit and Rollback release the
// connection, and are safe to call more than once, so defer tx.Rollback(ctx) is fine after
// Commit), from a held Conn, or a savepoint of either. Once the guard cancelled or terminated the
// lease for exceeding its budget, every call but Rollback fails with a *BudgetError.
type leaseTx struct {
	t       pgx.Tx
	l       *lease
	release bool
}

// check refuses a call after the lease ended: for a transaction of the pool's, as pgx does after
// Commit or Rollback (ErrTxClosed); for one of a held connection, with ErrReleased.
func (tx *leaseTx) check() error {
	if tx.l.released.Load() {
		if tx.release {
			return pgx.ErrTxClosed
		}
		return ErrReleased
	}
	return tx.l.check()
}

// Begin starts a pseudo nested transaction (a savepoint) on the same lease.
func (tx *leaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	t, err := tx.t.Begin(ctx)
	if err != nil {
		return nil, tx.l.fail(err)
	}
	return &leaseTx{t: t, l: tx.l}, nil
}

// Commit commits, and releases the connection of a transaction of the pool's. If the guard acted
// on the transaction, or one of its statements was interrupted, it rolls back instead and says so.
func (tx *leaseTx) Commit(ctx context.Context) error {
	if err := tx.check(); err != nil {
		if v := tx.l.violation.Load(); v != nil && !tx.l.released.Load() {
			return tx.abandon(ctx, v)
		}
		return err
	}
	if tx.l.w.Draining() {
		return tx.abandon(ctx, pgx.ErrTxCommitRollback)
	}
	err := tx.t.Commit(ctx)
	err = tx.l.fail(err)
	if tx.release {
		tx.l.release()
	}
	return err
}

// abandon ends a transaction that cannot commit and returns err. The server has rolled it back or
// will: an interrupted statement aborted it, and the lease's end rolls it back once the
// connection is clean, off the caller's path.
func (tx *leaseTx) abandon(ctx context.Context, err error) error {
	if !tx.release {
		_ = tx.t.Rollback(ctx) // a held connection's transaction: roll back what the owner began
		return err
	}
	tx.l.release()
	return err
}

// Rollback rolls back, and releases the connection of a transaction of the pool's. After the
// guard acted on the transaction, or while an interrupted statement of it is being cleaned up, it
// returns nil at once: the server has rolled back or will.
func (tx *leaseTx) Rollback(ctx context.Context) error {
	if tx.l.violation.Load() != nil {
		if tx.release {
			tx.l.release()
		} else if !tx.l.released.Load() {
			_ = tx.t.Rollback(ctx)
		}
		return nil
	}
	if tx.l.released.Load() {
		if tx.release {
			return pgx.ErrTxClosed
		}
		return ErrReleased
	}
	if tx.release && tx.l.w.Draining() {
		tx.l.release()
		return nil
	}
	err := tx.t.Rollback(ctx)
	err = tx.l.fail(err)
	if tx.release {
		tx.l.release()
	}
	if tx.l.violation.Load() != nil {
		return nil // the guard acted meanwhile: the server has rolled back or will
	}
	return err
}

func (tx *leaseTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if err := tx.check(); err != nil {
		return 0, err
	}
	n, err := tx.t.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, tx.l.fail(err)
}

func (tx *leaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := tx.check(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return &leaseBatch{br: tx.t.SendBatch(ctx, b), l: tx.l}
}

// LargeObjects returns the transaction's large objects. It panics once the lease ended, when the
// connection may serve another caller, as Conn does. pgx.LargeObjects is pgx's own type and calls
// the connection directly: do not keep one past the end of its transaction.
func (tx *leaseTx) LargeObjects() pgx.LargeObjects {
	if tx.l.released.Load() {
		panic("pgxlanes: Tx.LargeObjects called after the transaction's connection was released")
	}
	return tx.t.LargeObjects()
}

func (tx *leaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := tx.check(); err != nil {
		return nil, err
	}
	sd, err := tx.t.Prepare(ctx, name, sql)
	return sd, tx.l.fail(err)
}

func (tx *leaseTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if err := tx.check(); err != nil {
		return pgconn.CommandTag{}, err
	}
	ct, err := tx.t.Exec(ctx, sql, arguments...)
	return ct, tx.l.fail(err)
}

func (tx *leaseTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := tx.check(); err != nil {
		return errRows{err: err}, err
	}
	return queryOn(tx.l, tx.t.Query, ctx, sql, args)
}

func (tx *leaseTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := tx.check(); err != nil {
		return errRow{err: err}
	}
	return &leaseRow{r: tx.t.QueryRow(ctx, sql, args...), l: tx.l}
}

// Conn returns the underlying *pgx.Conn. It panics once the lease ended, when the connection
// may serve another caller.
func (tx *leaseTx) Conn() *pgx.Conn {
	if tx.l.released.Load() {
		panic("pgxlanes: Tx.Conn called after the transaction's connection was released")
	}
	return tx.t.Conn()
}

// queryOn runs a query of a transaction or held connection; its rows leave the lease to its owner.
func queryOn(l *lease, f func(context.Context, string, ...any) (pgx.Rows, error), ctx context.Context, sql string, args []any) (pgx.Rows, error) {
	rows, err := f(ctx, sql, args...)
	if err != nil {
		err = l.fail(err)
		return errRows{err: err}, err
	}
	return &leaseRows{Rows: rows, l: l}, nil
}
