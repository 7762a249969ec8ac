package stdlib_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

// Code on database/sql (sqlx, GORM, ent, bun) gets the lanes through OpenDBFromPool. The
// example needs a server, so it is compiled but not run.
func ExampleOpenDBFromPool() {
	ctx := context.Background()
	pool, err := pgxlanes.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool) // leave SetMaxOpenConns unset: the lanes bound it
	defer db.Close()

	// A statement: the Short lane, its slot held only while it runs.
	var name string
	_ = db.QueryRowContext(ctx, "select name from users where id = $1", 42).Scan(&name)

	// A transaction: the Tx lane, with a budget of its own, until Commit or Rollback.
	tx, err := db.BeginTx(pgxlanes.WithBudget(ctx, 10*time.Second), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	_, _ = tx.ExecContext(ctx, "update users set seen = now() where id = $1", 42)
	_ = tx.Commit()

	// Session state across statements: a sql.Conn is one session (on Tx, or the lane its ctx
	// names) from its first call until Close.
	conn, err := db.Conn(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	_, _ = conn.ExecContext(ctx, "select pg_advisory_lock(1)")
	_, _ = conn.ExecContext(ctx, "select pg_advisory_unlock(1)")
}
