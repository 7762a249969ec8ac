// Package stdlib puts database/sql on a pgxlanes pool, for code written against *sql.DB: sqlx,
// GORM, ent, bun, sqlc's database/sql mode. It mirrors pgx's stdlib.OpenDBFromPool:
//
//	pool, err := pgxlanes.New(ctx, os.Getenv("DATABASE_URL"))
//	...
//	db := stdlib.OpenDBFromPool(pool) // closing db does not close pool
//
// # Routing
//
// A call of the *sql.DB (db.ExecContext, db.BeginTx, ...) takes a lease of the pool for its own
// duration, routed as the pool's own methods are; a sql.Conn keeps one session (see Pinning):
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
// sent as SQL, prepared statements) needs one server session, and database/sql promises one
// connection for a sql.Conn. So a sql.Conn (db.Conn, and what calls it: sqlx's Connx, GORM's
// Connection, the migration tools' locks) pins a held connection of the pool (Pool.Acquire) from
// its first call until sql.Conn.Close, by default: on the Tx lane, or on the lane named by
// db.Conn's ctx or by its first call's ctx. Every call of the sql.Conn runs on that session, and
// a transaction begun on it (first or later) runs inside it, on the pinned lane, so the session
// state, BEGIN sent as SQL and session advisory locks behave as with pgx's stdlib.
//
//	conn, err := db.Conn(ctx)                               // one session on Tx, from its first call to conn.Close
//	conn, err := db.Conn(pgxlanes.WithLane(ctx, pgxlanes.Long)) // the same, on Long
//
// The cost: a sql.Conn holds a lane slot and a server session from its first call until it is
// closed, idle or not, as with pgx's stdlib; nothing is held before the first call. It is a held
// connection of its lane, under the lane's budget (Tx: 30s, cancel): a sql.Conn kept open longer
// than that, as a migration tool's may be, needs Long (or WithBudget on db.Conn's ctx). A
// transaction begun inside the pinned session does not get the lane's transaction settings
// (idle_in_transaction_session_timeout and the budget's backstops) as Pool.BeginTx gives them:
// the pinned session has the lane's session settings.
//
// Calls of the *sql.DB itself (db.ExecContext, db.QueryContext, db.BeginTx, db.PrepareContext)
// make no session promise and pin nothing: each takes a lease for its own duration, as the
// Routing section says. When such a call's ctx names a lane, its connection pins a session of
// that lane until database/sql takes the connection back (the end of the call, Rows.Close). With
// OptionPinLane, a *sql.DB pins every connection on its lane, whatever the ctx: for code that
// needs Long for every session (a migration tool that runs longer than Tx's budget), give it a
// *sql.DB of its own opened with OptionPinLane(pgxlanes.Long).
//
// database/sql tells a driver nothing that separates a sql.Conn from a db call: the bridge sees
// database/sql's DB.Conn on the stack when it takes the connection out (a walk of a few frames
// per checkout, each return address's verdict cached: under 1% of a lookup's CPU). When
// SetMaxOpenConns is set and reached, database/sql's background opener creates connections and
// hands them to a waiting caller, or to a later one from its idle list, without telling the
// driver of that checkout: the bridge then decides at the checkout's first call, which reaches
// the driver through a method of database/sql's Conn for a sql.Conn and through none for a db
// call (a walk of up to 32 frames, once per such checkout; other calls pay nothing). Such a
// sql.Conn is one session as any other, but db.Conn's ctx does not reach the driver: it pins on
// Tx, or on the lane its first call's ctx names (or OptionPinLane's). Leave SetMaxOpenConns unset
// all the same (see Routing).
//
// sql.Conn.Raw gives the *Conn, whose Conn method returns the pinned session's *pgx.Conn with the
// same line as pgx's stdlib (driverConn.(*stdlib.Conn).Conn()): see Conn.Conn for what it may be
// used for.
//
// # Differences from pgx's stdlib
//
//   - PrepareContext prepares on the server only on a pinned session (a sql.Conn's, or a call
//     whose ctx named a lane), as pgx's stdlib does, and the statements left open are deallocated
//     when the session is released. db.PrepareContext and a transaction of db.BeginTx prepare
//     nothing: the statement has no session of its own to live in. pgx's statement cache
//     prepares it on each server session that runs it, so the round trips are the same; a syntax
//     error is reported when the statement first runs, and Stmt.NumInput is -1 (database/sql does
//     not check the argument count).
//   - pgconn.Timeout(err) after a deadline depends on the pool's deadline handling (pgxlanes),
//     not on this package.
//   - A Rollback after the transaction's ctx ended (database/sql rolls back when it ends) runs on
//     a ctx of its own, so the server session is kept instead of closed.
//   - Values are converted to driver.Value exactly as pgx's stdlib converts them (the code is
//     pgx's); PostgreSQL arrays and other pgtype types scan through pgtype.Map.SQLScanner, as with
//     pgx's stdlib before Go 1.27.
package stdlib
