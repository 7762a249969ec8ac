package pgxlanes

import (
	"context"
	"errors"
	"fmt"

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
	gen     uint64 // the hold the transaction belongs to
	release bool
	// violated: the guard had acted on the lease when this transaction released it, or when its
	// Rollback saw it: a later Rollback returns nil, as the first did.
	violated bool
}

// check refuses a call after the lease ended: for a transaction of the pool's, as pgx does after
// Commit or Rollback (ErrTxClosed); for one of a held connection, with ErrReleased.
func (tx *leaseTx) check() error {
	if tx.l.stale(tx.gen) {
		return tx.closedErr()
	}
	return tx.l.check(tx.gen)
}

// closedErr is the error of a call made after the transaction's hold is over.
func (tx *leaseTx) closedErr() error {
	if tx.release {
		return pgx.ErrTxClosed
	}
	return ErrReleased
}

// releaseLease ends the hold of a transaction of the pool's, noting first whether the guard acted
// on it (the lease is not read after its release).
func (tx *leaseTx) releaseLease() {
	if tx.l.violation.Load() != nil {
		tx.violated = true
	}
	tx.l.release(tx.gen)
}

// Begin starts a pseudo nested transaction (a savepoint) on the same lease.
func (tx *leaseTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t, err := run(tx.l, tx.check(), func() (pgx.Tx, error) { return tx.t.Begin(ctx) })
	if err != nil {
		return nil, err
	}
	return tx.l.newTx(t, false), nil
}

// ErrCommitOutcomeUnknown is wrapped by the error of a Commit whose connection was lost, or
// whose session the guard terminated, after the COMMIT was sent: the server may or may not have
// committed, and only the data can tell. Such an error is never errors.Is ErrBudgetExceeded,
// and pgconn.SafeToRetry says false for it: retrying may apply the work twice.
var ErrCommitOutcomeUnknown = errors.New("pgxlanes: connection lost during COMMIT; the transaction may have committed")

// Commit commits, and releases the connection of a transaction of the pool's. It reports failure
// only for a transaction that did not commit:
//   - nil when the server acknowledged the COMMIT, even if the lease went over its budget
//     meanwhile (the violation is still counted and reported): the guard does not interrupt a
//     COMMIT in flight, and a terminate waits for it (commitWait at most);
//   - a *BudgetError (errors.Is ErrBudgetExceeded) when the guard acted before the COMMIT was
//     sent, and pgx.ErrTxCommitRollback after an interrupted statement: the COMMIT is not sent,
//     the transaction is rolled back;
//   - an error wrapping ErrCommitOutcomeUnknown when the connection was lost after the COMMIT was
//     sent.
func (tx *leaseTx) Commit(ctx context.Context) error {
	if tx.l.stale(tx.gen) {
		return tx.closedErr()
	}
	if v := tx.l.violation.Load(); v != nil {
		return tx.abandon(ctx, v)
	}
	if tx.l.w.Draining() {
		return tx.abandon(ctx, pgx.ErrTxCommitRollback)
	}
	if err := tx.l.beginCommit(); err != nil {
		if errors.Is(err, ErrReleased) {
			return tx.check()
		}
		return tx.abandon(ctx, err)
	}
	err := tx.t.Commit(ctx)
	terminated := tx.l.endCommit()
	if err != nil {
		err = tx.commitError(err, terminated)
	}
	if tx.release {
		tx.releaseLease()
	}
	return err
}

// commitError is what Commit returns for err, the error of a COMMIT that was sent: unknown when
// the session was lost before the server's answer arrived, the server's own error (through fail)
// otherwise.
func (tx *leaseTx) commitError(err error, terminated bool) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Severity != "FATAL" && pgErr.Severity != "PANIC" {
		if cause := tx.l.w.Cause(); pgErr.Code == "57014" && cause != nil {
			// The COMMIT was ended early (internal/wire): by the caller's context, which returns
			// the caller at its deadline; the server may have committed meanwhile.
			var be *BudgetError
			if errors.As(cause, &be) {
				// Not the guard's doing (it never interrupts a COMMIT), but never a budget
				// failure that invites a retry either.
				return &commitUnknownError{err: fmt.Errorf("%s: %w", be.Error(), err)}
			}
			return &commitUnknownError{err: tx.l.fail(err)}
		}
		return tx.l.fail(err) // the server answered: it did not commit
	}
	if errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, pgx.ErrTxCommitRollback) {
		// Not sent, or answered ROLLBACK (a statement had aborted the transaction): nothing
		// committed, and the error is pgx's own, as pgxpool returns it.
		return err
	}
	if pgErr != nil || terminated || tx.l.conn.IsClosed() || !pgconn.SafeToRetry(err) {
		cause := err
		if v := tx.l.violation.Load(); v != nil {
			cause = fmt.Errorf("%s: %w", v.Error(), err)
		}
		return &commitUnknownError{err: cause}
	}
	return tx.l.fail(err)
}

// commitUnknownError is the error of a Commit whose outcome is unknown.
type commitUnknownError struct{ err error }

func (e *commitUnknownError) Error() string {
	return ErrCommitOutcomeUnknown.Error() + ": " + e.err.Error()
}
func (e *commitUnknownError) Unwrap() []error   { return []error{ErrCommitOutcomeUnknown, e.err} }
func (e *commitUnknownError) SafeToRetry() bool { return false }

// abandon ends a transaction that cannot commit and returns err. The server has rolled it back or
// will: an interrupted statement aborted it, and the lease's end rolls it back once the
// connection is clean, off the caller's path.
func (tx *leaseTx) abandon(ctx context.Context, err error) error {
	if !tx.release {
		_ = tx.t.Rollback(ctx) // a held connection's transaction: roll back what the owner began
		return err
	}
	tx.releaseLease()
	return err
}

// Rollback rolls back, and releases the connection of a transaction of the pool's. After the
// guard acted on the transaction, or while an interrupted statement of it is being cleaned up, it
// returns nil at once: the server has rolled back or will.
func (tx *leaseTx) Rollback(ctx context.Context) error {
	if tx.violated {
		return nil
	}
	if tx.l.stale(tx.gen) {
		return tx.closedErr()
	}
	if tx.l.violation.Load() != nil {
		tx.violated = true
		if tx.release {
			tx.releaseLease()
		} else {
			_ = tx.t.Rollback(ctx)
		}
		return nil
	}
	if tx.release && tx.l.w.Draining() {
		tx.releaseLease()
		return nil
	}
	err := tx.t.Rollback(ctx)
	err = tx.l.fail(err)
	if tx.l.violation.Load() != nil {
		tx.violated = true
		err = nil // the guard acted meanwhile: the server has rolled back or will
	}
	if tx.release {
		tx.releaseLease()
	}
	return err
}

func (tx *leaseTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	return run(tx.l, tx.check(), func() (int64, error) { return tx.t.CopyFrom(ctx, tableName, columnNames, rowSrc) })
}

func (tx *leaseTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := tx.check(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if err := flushForExecBatch(ctx, tx.l); err != nil {
		return pgx.FailedBatchResults(b, tx.l.fail(err))
	}
	return &leaseBatch{br: tx.t.SendBatch(ctx, b), l: tx.l, gen: tx.gen}
}

// LargeObjects returns the transaction's large objects. It panics once the lease ended, when the
// connection may serve another caller, as Conn does. pgx.LargeObjects is pgx's own type and calls
// the connection directly: do not keep one past the end of its transaction.
func (tx *leaseTx) LargeObjects() pgx.LargeObjects {
	if tx.l.stale(tx.gen) {
		panic("pgxlanes: Tx.LargeObjects called after the transaction's connection was released")
	}
	return tx.t.LargeObjects()
}

func (tx *leaseTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return run(tx.l, tx.check(), func() (*pgconn.StatementDescription, error) { return tx.t.Prepare(ctx, name, sql) })
}

func (tx *leaseTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	return run(tx.l, tx.check(), func() (pgconn.CommandTag, error) { return tx.t.Exec(ctx, sql, arguments...) })
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
	return tx.l.newRow(tx.t.QueryRow(ctx, sql, args...), false)
}

// Conn returns the underlying *pgx.Conn. It panics once the lease ended, when the connection
// may serve another caller. Over TLS with channel binding it first waits for a drain, as
// Conn.Conn does.
func (tx *leaseTx) Conn() *pgx.Conn {
	if tx.l.stale(tx.gen) {
		panic("pgxlanes: Tx.Conn called after the transaction's connection was released")
	}
	awaitDrainBeside(tx.l)
	return tx.t.Conn()
}

// queryOn runs a query of a transaction or held connection, whose wrapper found the lease's hold
// current; its rows leave the lease to its owner.
func queryOn(l *lease, f func(context.Context, string, ...any) (pgx.Rows, error), ctx context.Context, sql string, args []any) (pgx.Rows, error) {
	rows, err := f(ctx, sql, args...)
	if err != nil {
		err = l.fail(err)
		return errRows{err: err}, err
	}
	return l.newRows(rows, false), nil
}
