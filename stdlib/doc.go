// Package stdlib puts database/sql on a pgxlanes pool, for code written against *sql.DB: sqlx,
// GORM, ent, bun, sqlc's database/sql mode. It mirrors pgx's stdlib.OpenDBFromPool:
//
//	pool, err := pgxlanes.New(ctx, os.Getenv("DATABASE_URL"))
//	...
//	db := stdlib.OpenDBFromPool(pool) // closing db does not close pool
//
// # Routing
//
// A database/sql connection of this package holds nothing between calls. Every call takes a
// lease of the pool for its own duration, routed as the pool's own methods are:
//   - a statement (ExecContext, QueryContext, QueryRowContext, PingContext) goes to Short, or to
//     the lane its ctx names, or to Long's capacity if the pool learned it as slow; its slot is
//     held until it returns, or for a query until its rows are closed;
//   - a transaction (BeginTx) goes to Tx, or to the lane its ctx names, with the lane's session
//     settings and budget (Pool.BeginTx); its slot is held until Commit or Rollback.
//
// WithLane, WithBudget and WithTag on the ctx pass through. So a connection that database/sql
// used for a statement and then uses for a transaction never carries a transaction on the Short
// lane, and database/sql's idle connections hold no lane capacity: unlike pgx's stdlib, there is
// no need to set MaxIdleConns to 0. A transaction that the application forgets to end is bounded
// by its lane's budget.
//
// Leave SetMaxOpenConns unset: the lanes bound the connections, and database/sql's own limit is
// one FIFO queue shared by every kind of call, the head-of-line blocking that lanes remove.
// SetMaxIdleConns, SetConnMaxLifetime and SetConnMaxIdleTime have no effect on server sessions;
// the pool's configuration (pool_max_conn_lifetime, ...) governs those.
//
// # Pinning
//
// Session state across calls (SET, temporary tables, session advisory locks, LISTEN, a BEGIN
// sent as SQL) needs one server session. A database/sql connection keeps one, a held connection
// of the pool (Pool.Acquire), once a lane is named: by the ctx given to db.Conn (or to the call
// that took the connection out of database/sql's pool), by a call's ctx, or for every connection
// with OptionPinLane. From the first statement after that until database/sql takes the connection
// back (sql.Conn.Close, the end of a db call, Rows.Close), every call runs on that session, and
// a transaction begun on it runs inside it, on the pinned lane. A transaction begun before the
// first statement takes a lease of its own on the named lane (Pool.BeginTx, with the lane's
// transaction settings); the statements after it pin a session then.
//
//	conn, err := db.Conn(pgxlanes.WithLane(ctx, pgxlanes.Tx)) // one session until conn.Close
//
// The trade-off: a sql.Conn whose ctx names no lane does not pin a session. Each of its
// statements takes a Short lease of its own, so state set by one statement is not seen by the
// next, a BEGIN sent as SQL is lost (the pool closes a session returned inside a transaction, and
// the next statements autocommit), and a session advisory lock taken through it stays with a
// session that went back to the pool. Name a lane for such code, or give it a *sql.DB of its own opened with OptionPinLane
// (a migration tool, for instance). Naming a lane costs nothing until the first call: the
// connection is acquired then.
//
// database/sql hands a connection that its background opener created (only when SetMaxOpenConns
// is set and reached) to a waiting caller without showing the driver that caller's ctx; pinning
// by db.Conn's ctx then waits for a call whose own ctx names the lane.
//
// # Differences from pgx's stdlib
//
//   - PrepareContext does not prepare on the server: a statement has no session of its own to
//     live in. pgx's statement cache prepares it on each server session that runs it, so the
//     round trips are the same; a syntax error is reported when the statement first runs, and
//     Stmt.NumInput is -1 (database/sql does not check the argument count).
//   - A Rollback after the transaction's ctx ended (database/sql rolls back when it ends) runs on
//     a ctx of its own, so the server session is kept instead of closed.
//   - Values are converted to driver.Value exactly as pgx's stdlib converts them (the code is
//     pgx's); PostgreSQL arrays and other pgtype types scan through pgtype.Map.SQLScanner, as with
//     pgx's stdlib before Go 1.27.
package stdlib
