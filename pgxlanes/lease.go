package pgxlanes

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// resetTimeout bounds the RESET that restores a connection's session before it goes back.
const resetTimeout = 5 * time.Second

// lease is one call's hold on a connection and its lane slot, from acquire to release. Every
// wrapper (rows, row, batch, tx, conn) releases through it, exactly once.
type lease struct {
	p    *Pool
	pc   *pgxpool.Conn
	conn *pgx.Conn // pc.Conn(), captured once: callers never touch pc again
	slot reserve.Slot
	lane Lane
	tag  string

	start    time.Time // the call began waiting
	acquired time.Time // the connection was ready

	cancel context.CancelFunc // ends the client-side statement deadline; nil if none
	reset  string             // SQL restoring the session before release; "" if nothing to restore

	released atomic.Bool
}

// release returns the connection to pgxpool and the slot to the lane. It is safe to call more
// than once; only the first call does anything.
func (l *lease) release() {
	if !l.released.CompareAndSwap(false, true) {
		return
	}
	if l.cancel != nil {
		l.cancel()
	}
	if l.reset != "" && !l.conn.IsClosed() && l.conn.PgConn().TxStatus() == 'I' {
		// A connection not idle is destroyed by pgxpool's Release anyway.
		ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
		_, err := l.conn.Exec(ctx, l.reset)
		cancel()
		if err != nil {
			l.closeConn()
			l.finish()
			return
		}
	}
	l.pc.Release()
	l.finish()
}

// destroy closes the connection instead of returning it (its session could not be prepared).
func (l *lease) destroy() {
	if !l.released.CompareAndSwap(false, true) {
		return
	}
	if l.cancel != nil {
		l.cancel()
	}
	l.closeConn()
	l.p.res.Release(l.slot)
}

// hijack takes the connection out of the pool for the caller and frees the slot.
func (l *lease) hijack() *pgx.Conn {
	if !l.released.CompareAndSwap(false, true) {
		panic("pgxlanes: cannot hijack a connection already released or hijacked")
	}
	if l.cancel != nil {
		l.cancel()
	}
	c := l.pc.Hijack()
	l.finish()
	return c
}

func (l *lease) closeConn() {
	c := l.pc.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
	_ = c.Close(ctx)
	cancel()
}

// finish frees the slot and reports the hold time.
func (l *lease) finish() {
	l.p.res.Release(l.slot)
	l.p.observeRelease(ReleaseEvent{Lane: l.lane, Tag: l.tag, Hold: time.Since(l.acquired)})
}
