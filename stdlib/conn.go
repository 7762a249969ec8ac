package stdlib

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// rollbackTimeout bounds a rollback whose transaction's ctx has ended, and the rollback of a
// transaction left open on a connection that database/sql closes.
const rollbackTimeout = 5 * time.Second

// querier is what a statement runs on: the pool (a lease per statement), a pinned held
// connection, or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Conn is a database/sql driver connection on a pgxlanes pool. Between calls it holds nothing
// of the pool, unless it is pinned (see the package documentation) or a transaction is open.
// database/sql uses it from one goroutine at a time, and so do its fields' rules.
type Conn struct {
	pool     *pgxlanes.Pool
	defaults pgxlanes.Annotations // the connector's: OptionPinLane

	// checkout is what the ctx said that database/sql took the connection out with (Connect,
	// ResetSession), merged with defaults; it applies to calls whose ctx lacks it. IsValid,
	// called when database/sql takes the connection back, ends the checkout.
	checkout pgxlanes.Annotations
	// session is set when the checkout is a sql.Conn (DB.Conn took the connection out): the
	// first call pins a session, on Tx unless a lane is named, and a transaction begun first
	// runs inside it.
	session bool
	// unseen is set while database/sql may take the connection out without telling the driver:
	// from a Connect on database/sql's opener goroutine until the first ResetSession (database/sql
	// resets a connection at every checkout after its first return). pending is set while such a
	// checkout is under way and no call has decided yet whether it is a sql.Conn's (decide).
	unseen  bool
	pending bool
	held    *pgxlanes.Conn // the pinned connection, until the checkout ends
	pins    uint64         // counts the pinned connections: a Stmt knows its session by it
	// prepared counts the Stmts prepared on held by their SQL (the statement's name on the
	// server, as with pgx's stdlib); what is left is deallocated when held is released.
	prepared map[string]int
	tx       pgx.Tx // the open transaction: on its own lease, or inside held
	closed   bool
}

// checkOut starts a checkout with the annotations of ctx; session says whether it is a sql.Conn's.
func (c *Conn) checkOut(ctx context.Context, session bool) {
	c.checkout = pgxlanes.AnnotationsFrom(ctx)
	c.session = session
	if !c.checkout.LaneSet {
		c.checkout.Lane, c.checkout.LaneSet = c.defaults.Lane, c.defaults.LaneSet
	}
	if session && !c.checkout.LaneSet {
		c.checkout.Lane, c.checkout.LaneSet = pgxlanes.Tx, true
	}
}

// decide settles a checkout that the driver was not told of (pending), at its first call: it is
// a sql.Conn's if the call comes through database/sql's Conn (calledBySQLConn), and then pins a
// session as one that DB.Conn took out does, on Tx or the lane the call's ctx names. db.Conn's
// ctx never reached the driver, so its annotations do not apply.
func (c *Conn) decide() {
	c.pending = false
	if calledBySQLConn() {
		c.session = true
		if !c.checkout.LaneSet {
			c.checkout.Lane, c.checkout.LaneSet = pgxlanes.Tx, true
		}
	}
}

// callCtx returns ctx with the checkout's annotations where ctx has none of its own, and whether
// a lane is named: a statement then pins a connection of that lane.
func (c *Conn) callCtx(ctx context.Context) (context.Context, bool) {
	a := pgxlanes.AnnotationsFrom(ctx)
	co := c.checkout
	if !a.LaneSet && co.LaneSet {
		ctx, a.LaneSet = pgxlanes.WithLane(ctx, co.Lane), true
	}
	if a.Budget == 0 && co.Budget != 0 {
		ctx = pgxlanes.WithBudget(ctx, co.Budget)
	}
	if a.Tag == "" && co.Tag != "" {
		ctx = pgxlanes.WithTag(ctx, co.Tag)
	}
	return ctx, a.LaneSet
}

// route returns where a statement of ctx runs, and the ctx to run it with: the open
// transaction, the pinned connection, a connection it pins now (ctx or the checkout names a
// lane), or the pool, which takes a lease for the statement alone.
func (c *Conn) route(ctx context.Context) (context.Context, querier, error) {
	switch {
	case c.closed:
		return nil, nil, driver.ErrBadConn
	case c.tx != nil:
		return ctx, c.tx, nil
	case c.held != nil:
		return ctx, c.held, nil
	}
	if c.pending {
		c.decide()
	}
	ctx, pin := c.callCtx(ctx)
	if !pin {
		return ctx, c.pool, nil
	}
	held, err := c.pin(ctx)
	if err != nil {
		return nil, nil, err
	}
	return ctx, held, nil
}

// pin acquires the connection that the checkout keeps, on the lane ctx names (callCtx merged
// the checkout's in). ctx bounds the acquire only.
func (c *Conn) pin(ctx context.Context) (*pgxlanes.Conn, error) {
	held, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	c.held = held
	c.pins++
	return held, nil
}

// unpin deallocates the statements prepared on the pinned connection and not closed, and
// releases the connection, if any.
func (c *Conn) unpin() {
	if c.held == nil {
		return
	}
	if len(c.prepared) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
		for name := range c.prepared {
			_ = c.held.Conn().Deallocate(ctx, name)
		}
		cancel()
		clear(c.prepared)
	}
	c.held.Release()
	c.held = nil
}

// badConn turns an error that left the request unsent into driver.ErrBadConn, so that
// database/sql retries a db call on another connection, as pgx's stdlib does.
func badConn(err error) error {
	if pgconn.SafeToRetry(err) {
		return driver.ErrBadConn
	}
	return err
}

func (c *Conn) ExecContext(ctx context.Context, query string, argsV []driver.NamedValue) (driver.Result, error) {
	ctx, q, err := c.route(ctx)
	if err != nil {
		return nil, err
	}
	args := make([]any, len(argsV))
	convertNamedArguments(args, argsV)
	ct, err := q.Exec(ctx, query, args...)
	if err != nil {
		return nil, badConn(err)
	}
	return driver.RowsAffected(ct.RowsAffected()), nil
}

// QueryContext runs query and reads its first row, as pgx's stdlib does, so that an error of the
// statement is returned here. The lease of an unpinned connection is held until the rows are
// closed or read to the end.
func (c *Conn) QueryContext(ctx context.Context, query string, argsV []driver.NamedValue) (driver.Rows, error) {
	ctx, q, err := c.route(ctx)
	if err != nil {
		return nil, err
	}
	args := make([]any, 1+len(argsV))
	args[0] = databaseSQLResultFormats
	convertNamedArguments(args[1:], argsV)
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, badConn(err)
	}
	return newRows(rows)
}

// Ping checks a connection of the Short lane (or the lane named), or the pinned one.
func (c *Conn) Ping(ctx context.Context) error {
	ctx, q, err := c.route(ctx)
	if err != nil {
		return err
	}
	switch q := q.(type) {
	case *pgxlanes.Pool:
		return badConn(q.Ping(ctx))
	case *pgxlanes.Conn:
		if err := q.Ping(ctx); err != nil {
			if q.Conn().IsClosed() {
				return driver.ErrBadConn
			}
			return err
		}
		return nil
	default: // a transaction: what pgconn's Ping sends
		_, err := q.Exec(ctx, "-- ping")
		return err
	}
}

// BeginTx begins a transaction: inside the pinned connection if there is one or the checkout is a
// sql.Conn's (which pins one now), otherwise on a lease of its own from Pool.BeginTx, on Tx or the lane ctx (or the checkout) names, with that
// lane's settings and budget. As with database/sql, ctx bounds the whole transaction: when it
// ends, database/sql rolls back.
func (c *Conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	switch {
	case c.closed:
		return nil, driver.ErrBadConn
	case c.tx != nil:
		return nil, errors.New("pgxlanes/stdlib: BeginTx: a transaction is already open on this connection")
	}
	txo, err := txOptions(opts)
	if err != nil {
		return nil, err
	}
	if c.pending && c.held == nil {
		c.decide()
	}
	var tx pgx.Tx
	lctx, _ := c.callCtx(ctx)
	switch {
	case c.held != nil:
		tx, err = c.held.BeginTx(ctx, txo)
	case c.session:
		var held *pgxlanes.Conn
		if held, err = c.pin(lctx); err == nil {
			tx, err = held.BeginTx(ctx, txo)
		}
	default:
		tx, err = c.pool.BeginTx(lctx, txo)
	}
	if err != nil {
		return nil, err
	}
	c.tx = tx
	return &wrapTx{c: c, ctx: ctx}, nil
}

// txOptions converts database/sql's transaction options as pgx's stdlib does.
func txOptions(opts driver.TxOptions) (pgx.TxOptions, error) {
	var o pgx.TxOptions
	switch sql.IsolationLevel(opts.Isolation) {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		o.IsoLevel = pgx.ReadUncommitted
	case sql.LevelReadCommitted:
		o.IsoLevel = pgx.ReadCommitted
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		o.IsoLevel = pgx.RepeatableRead
	case sql.LevelSerializable:
		o.IsoLevel = pgx.Serializable
	default:
		return o, fmt.Errorf("pgxlanes/stdlib: BeginTx: unsupported isolation level %v", sql.IsolationLevel(opts.Isolation))
	}
	if opts.ReadOnly {
		o.AccessMode = pgx.ReadOnly
	}
	return o, nil
}

func (c *Conn) Begin() (driver.Tx, error) { return c.BeginTx(context.Background(), driver.TxOptions{}) }

func (c *Conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// CheckNamedValue passes every argument through: pgx encodes driver.Valuer, sql.Scanner's
// counterparts and its own types natively, as with pgx's stdlib.
func (c *Conn) CheckNamedValue(*driver.NamedValue) error { return nil }

// ResetSession starts a checkout: database/sql calls it with the ctx of the call that takes the
// connection out of its pool again.
func (c *Conn) ResetSession(ctx context.Context) error {
	if c.closed || c.tx != nil || c.held != nil {
		return driver.ErrBadConn // cannot happen: IsValid ended the last checkout
	}
	c.unseen, c.pending = false, false
	c.checkOut(ctx, takenBy() == takerSQLConn)
	return nil
}

// IsValid ends a checkout: database/sql calls it whenever it takes the connection back. The
// pinned connection, if any, goes back to the pool, so database/sql's idle connections hold no
// lane capacity.
func (c *Conn) IsValid() bool {
	if c.tx != nil {
		return false // cannot happen: database/sql takes a connection back after its transaction; Close ends it
	}
	c.unpin()
	c.checkout, c.session, c.pending = c.defaults, false, c.unseen
	return !c.closed
}

// Close rolls back a transaction left open, if any, and releases the pinned connection.
func (c *Conn) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	if c.tx != nil {
		ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
		_ = c.tx.Rollback(ctx)
		cancel()
		c.tx = nil
	}
	c.unpin()
	return nil
}

// wrapTx is a transaction as database/sql sees it.
type wrapTx struct {
	c   *Conn
	ctx context.Context
}

func (w *wrapTx) Commit() error {
	tx := w.c.tx
	if tx == nil {
		return sql.ErrTxDone
	}
	w.c.tx = nil
	return tx.Commit(w.ctx)
}

// Rollback rolls back. database/sql calls it when the transaction's ctx ends, too: the rollback
// then runs on a ctx of its own, bounded by rollbackTimeout, so that the server session is kept
// (pgx closes a connection whose rollback failed).
func (w *wrapTx) Rollback() error {
	tx := w.c.tx
	if tx == nil {
		return sql.ErrTxDone
	}
	w.c.tx = nil
	ctx := w.ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
	}
	return tx.Rollback(ctx)
}

func convertNamedArguments(args []any, argsV []driver.NamedValue) {
	for i, v := range argsV {
		args[i] = v.Value
	}
}

var (
	_ driver.Conn               = (*Conn)(nil)
	_ driver.ConnBeginTx        = (*Conn)(nil)
	_ driver.ConnPrepareContext = (*Conn)(nil)
	_ driver.ExecerContext      = (*Conn)(nil)
	_ driver.QueryerContext     = (*Conn)(nil)
	_ driver.Pinger             = (*Conn)(nil)
	_ driver.SessionResetter    = (*Conn)(nil)
	_ driver.Validator          = (*Conn)(nil)
	_ driver.NamedValueChecker  = (*Conn)(nil)
	_ driver.StmtExecContext    = (*Stmt)(nil)
	_ driver.StmtQueryContext   = (*Stmt)(nil)
)
