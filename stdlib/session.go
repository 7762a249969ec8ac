package stdlib

import (
	"context"
	"runtime"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// taker is who takes a connection out of database/sql's pool, as Connect and ResetSession see it.
type taker uint8

const (
	takerUnseen  taker = iota // not DB.conn: database/sql's opener goroutine (Connect only)
	takerDBCall               // DB.conn for a db call
	takerSQLConn              // DB.conn under DB.Conn
)

// takenBy reports who is taking the connection out: Connect and ResetSession are called from
// DB.conn, under DB.Conn for a sql.Conn (DB.Conn, DB.retry, DB.conn). It is the one thing that
// tells a sql.Conn, which database/sql promises is one connection until its Close, from a db
// call, which needs a connection for its own duration: database/sql passes the driver nothing
// else. Connect is also called by database/sql's opener goroutine (DB.openNewConnection, when
// SetMaxOpenConns is reached and a caller waits), which hands the connection to a caller without
// telling the driver: takerUnseen, and the first call decides (see Conn.decide). It walks a few
// frames once per checkout (well under a microsecond).
func takenBy() taker {
	var pcs [8]uintptr
	n := runtime.Callers(3, pcs[:]) // from the caller of Connect or ResetSession up
	by := takerUnseen
	for _, pc := range pcs[:n] {
		switch frameAt(pc) {
		case frameDBConn:
			return takerSQLConn
		case frameDBconn:
			by = takerDBCall
		}
	}
	return by
}

// frame is what a return address is in, as far as takenBy cares.
type frame uint8

const (
	frameOther  frame = iota
	frameDBconn       // database/sql.(*DB).conn
	frameDBConn       // database/sql.(*DB).Conn
)

// framePCs caches, per return address, what function it is in: the few call paths of
// database/sql give few addresses.
var framePCs sync.Map // uintptr → frame

// frameAt reports whether the return address pc is in DB.Conn or DB.conn. FuncForPC names the
// function at pc-1 without the file and line that runtime.CallersFrames also resolves; where
// DB.Conn's body was inlined, the innermost function there is still DB.Conn.
func frameAt(pc uintptr) frame {
	if v, ok := framePCs.Load(pc); ok {
		return v.(frame)
	}
	fr := frameOther
	if f := runtime.FuncForPC(pc - 1); f != nil {
		switch f.Name() {
		case "database/sql.(*DB).Conn":
			fr = frameDBConn
		case "database/sql.(*DB).conn":
			fr = frameDBconn
		}
	}
	framePCs.Store(pc, fr)
	return fr
}

// calledBySQLConn reports whether the driver call under way is a sql.Conn's: every call of a
// sql.Conn reaches the driver through a method of database/sql's Conn (ExecContext, QueryContext,
// PingContext, PrepareContext, BeginTx, Raw), and a db call, a Tx's or a Stmt's through none. It
// looks at the nearest run of database/sql's frames above the driver (a driver wrapper's frames
// may come between): the run holds a method of Conn or not. With no database/sql frame in reach,
// the call comes from user code under sql.Conn.Raw, deeper than the walk: a sql.Conn's too. It
// resolves up to 32 frames, inlined ones included, once per checkout that the driver was not
// told of (a connection of database/sql's opener goroutine, before its first return).
func calledBySQLConn() bool {
	var pcs [32]uintptr
	n := runtime.Callers(2, pcs[:]) // from the caller of calledBySQLConn up
	frames := runtime.CallersFrames(pcs[:n])
	inSQL := false
	for {
		f, more := frames.Next()
		switch {
		case strings.HasPrefix(f.Function, "database/sql.(*Conn)."):
			return true
		case strings.HasPrefix(f.Function, "database/sql."):
			inSQL = true
		case inSQL:
			return false
		}
		if !more {
			return !inSQL
		}
	}
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
