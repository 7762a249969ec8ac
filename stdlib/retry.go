package stdlib

import (
	"context"
	"database/sql"
	"errors"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// RetryTx is pgxlanes.RetryTx for database/sql: it runs fn in a transaction begun with
// db.BeginTx(ctx, txOptions) and runs it again in a new transaction when it fails with a
// retryable error (40001, 40P01 by default), after a full-jitter pause, with the defaults of
// pgxlanes.RetryOptions. Every rule of pgxlanes.RetryTx holds: fn must have no effect outside its
// transaction, or only idempotent ones; a cap returns a *pgxlanes.RetryError that matches
// pgxlanes.ErrRetryGaveUp; a Commit whose outcome is unknown returns one that matches
// pgxlanes.ErrRetryCommitUnknown and is never retried.
//
// db may be any *sql.DB. On one opened by OpenDBFromPool, each attempt is a transaction of its own
// on the pool (a new lease on its lane, with its own budget), and the pool's observers see each
// attempt (RetryObserver: the metrics package counts them), on the lane and tag of ctx and the
// connector's OptionPinLane. ctx bounds the whole: every attempt and every pause; as with
// database/sql, database/sql rolls an attempt back when ctx ends.
func RetryTx(ctx context.Context, db *sql.DB, txOptions *sql.TxOptions, fn func(*sql.Tx) error) error {
	return RetryTxWith(ctx, db, pgxlanes.RetryOptions{}, txOptions, fn)
}

// RetryTxWith is RetryTx with the retry options o. Bad options are refused with an error that
// names the field, before any attempt.
func RetryTxWith(ctx context.Context, db *sql.DB, o pgxlanes.RetryOptions, txOptions *sql.TxOptions, fn func(*sql.Tx) error) error {
	if db == nil {
		return errors.New("pgxlanes/stdlib: RetryTx: db is nil")
	}
	if fn == nil {
		return errors.New("pgxlanes/stdlib: RetryTx: fn is nil")
	}
	pool, lctx := poolOf(ctx, db)
	return o.Do(lctx, pool, func(ctx context.Context) (err, commitErr error) {
		tx, err := db.BeginTx(ctx, txOptions)
		if err != nil {
			return err, nil
		}
		defer func() { _ = tx.Rollback() }() // after Commit, or on a panic of fn: a no-op or the rollback
		if err := fn(tx); err != nil {
			if errors.Is(tx.Rollback(), sql.ErrTxDone) && ctx.Err() == nil {
				// fn ended the transaction itself (database/sql also ends it when ctx ends):
				// its error is taken for a Commit's, as pgxlanes.RetryTx does.
				return nil, err
			}
			return err, nil
		}
		err = tx.Commit()
		// database/sql refuses to send COMMIT once the transaction ended or its ctx did, and says
		// so with ErrTxDone or the ctx's own error, unwrapped; the driver's errors are wrapped.
		if errors.Is(err, sql.ErrTxDone) || err == context.Canceled || err == context.DeadlineExceeded { //nolint:errorlint // identity: database/sql's own, not the driver's
			return err, nil
		}
		return nil, err
	})
}

// poolOf returns the pgxlanes pool under db, or nil if db is not on one, and ctx with the
// connector's annotations (OptionPinLane) where ctx has none, so that the attempts are reported
// on the lane their transactions take. It looks through a database/sql connection, which on a
// pool holds nothing: taking it costs no lane slot and no round trip.
func poolOf(ctx context.Context, db *sql.DB) (*pgxlanes.Pool, context.Context) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, ctx // the first BEGIN will fail the same way and say why
	}
	defer conn.Close()
	var pool *pgxlanes.Pool
	lctx := ctx
	_ = conn.Raw(func(dc any) error {
		if c, ok := dc.(*Conn); ok && !c.closed {
			pool = c.pool
			lctx, _ = c.callCtx(ctx)
		}
		return nil
	})
	return pool, lctx
}
