package stdlib

import (
	"context"
	"runtime"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// takenBySQLConn reports whether database/sql's DB.Conn is taking the connection out: Connect
// and ResetSession are called from DB.conn, under DB.Conn (DB.Conn, DB.retry, DB.conn). It is
// the one thing that tells a sql.Conn, which database/sql promises is one connection until its
// Close, from a db call, which needs a connection for its own duration: database/sql passes the
// driver nothing else. It walks a few frames once per checkout (well under a microsecond).
func takenBySQLConn() bool {
	var pcs [8]uintptr
	n := runtime.Callers(3, pcs[:]) // from the caller of Connect or ResetSession up
	for _, pc := range pcs[:n] {
		if inDBConn(pc) {
			return true
		}
	}
	return false
}

// dbConnPCs caches, per return address, whether it is in database/sql's DB.Conn: the few call
// paths of database/sql give few addresses.
var dbConnPCs sync.Map // uintptr → bool

// inDBConn reports whether the return address pc is in DB.Conn. FuncForPC names the function
// at pc-1 without the file and line that runtime.CallersFrames also resolves; where DB.Conn's
// body was inlined, the innermost function there is still DB.Conn.
func inDBConn(pc uintptr) bool {
	if v, ok := dbConnPCs.Load(pc); ok {
		return v.(bool)
	}
	f := runtime.FuncForPC(pc - 1)
	in := f != nil && f.Name() == "database/sql.(*DB).Conn"
	dbConnPCs.Store(pc, in)
	return in
}

// Conn returns the *pgx.Conn of the server session that this connection pins, as pgx's
// stdlib.Conn.Conn does: the way to what database/sql cannot do (CopyFrom, LISTEN and
// WaitForNotification, large objects, pgx's types). Reach it through sql.Conn.Raw, with the same
// line as for pgx's stdlib (only the import path differs):
//
//	err := sqlConn.Raw(func(driverConn any) error {
//		conn := driverConn.(*stdlib.Conn).Conn() // *pgx.Conn
//		...
//	})
//
// If no call pinned a session yet, Conn pins one, on the lane the sql.Conn's ctx named (Tx
// otherwise), and returns nil if that acquire fails (the lane's acquire timeout): call the
// sql.Conn's PingContext first to pin it and see the error. Inside an open transaction it is the
// transaction's connection.
//
// The *pgx.Conn stays the pool's, and the sql.Conn's statements run on it: use it while the
// sql.Conn is open and from one goroutine with it, never after Close (the session then serves
// other callers). Do not Close it, and end what you start on it (a transaction begun with
// pgx, LISTEN, a session setting) before closing the sql.Conn: the pool resets its lane's
// timeouts, not your state. A connection it closed is destroyed by the pool, not reused.
func (c *Conn) Conn() *pgx.Conn {
	switch {
	case c.closed:
		return nil
	case c.tx != nil:
		return c.tx.Conn()
	case c.held != nil:
		return c.held.Conn()
	}
	ctx, named := c.callCtx(context.Background())
	if !named {
		ctx = pgxlanes.WithLane(ctx, pgxlanes.Tx)
	}
	held, err := c.pin(ctx)
	if err != nil {
		return nil
	}
	return held.Conn()
}
