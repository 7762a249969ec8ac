package pgxlanes_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// A transfer retried under SERIALIZABLE. The function may run several times, so it records the
// transfer under the caller's idempotency key, in a unique index, before it moves the money: a
// second run, or a second call with the same key after an unknown outcome, finds the key and
// changes nothing.
//
//	create table transfers (key text primary key, src int not null, dst int not null, amount bigint not null);
func ExampleRetryTx() {
	ctx := context.Background()
	pool, err := pgxlanes.New(ctx, "postgres://app@127.0.0.1/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	key, src, dst, amount := "order-7781-refund", 1, 2, int64(1500) // the key comes from the caller
	err = pgxlanes.RetryTx(ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `insert into transfers (key, src, dst, amount) values ($1, $2, $3, $4)
			on conflict (key) do nothing`, key, src, dst, amount)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil // done already
		}
		if _, err := tx.Exec(ctx, `update accounts set balance = balance - $2 where id = $1`, src, amount); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `update accounts set balance = balance + $2 where id = $1`, dst, amount)
		return err
	})
	switch {
	case errors.Is(err, pgxlanes.ErrRetryCommitUnknown):
		// The transfer may have committed: call again with the same key, now or from a queue.
	case errors.Is(err, pgxlanes.ErrRetryGaveUp):
		// Still conflicting after the cap: report it, retry later.
	case err != nil:
		// Not retryable: the function's own error, or the database's.
	}
}

// RetryOptions.Do is the loop under RetryTx, for transactions that are not begun on a pool or a
// pgx.Conn. Here the attempts are scripted: two serialization failures, then a commit.
func ExampleRetryOptions_Do() {
	attempt := 0
	err := pgxlanes.RetryOptions{MaxAttempts: 5}.Do(context.Background(), nil, func(ctx context.Context) (err, commitErr error) {
		attempt++
		fmt.Println("attempt", attempt)
		if attempt < 3 {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}, nil
		}
		return nil, nil // the transaction committed
	})
	fmt.Println("err:", err)

	err = pgxlanes.RetryOptions{MaxAttempts: 2}.Do(context.Background(), nil, func(ctx context.Context) (err, commitErr error) {
		return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, nil
	})
	fmt.Println(errors.Is(err, pgxlanes.ErrRetryGaveUp))
	// Output:
	// attempt 1
	// attempt 2
	// attempt 3
	// err: <nil>
	// true
}
