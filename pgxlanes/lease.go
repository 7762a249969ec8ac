package pgxlanes

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/reserve"
	"github.com/pgxlanes/pgxlanes/txguard"
)

const (
	// resetTimeout bounds the RESET that restores a connection's session before it goes back.
	resetTimeout = 5 * time.Second
	// cancelSettle is how long a connection whose statement the guard cancelled waits before it
	// is reused: the server may deliver a cancel a little after it acknowledged it, and it must
	// not hit the next caller's query (pgconn waits the same).
	cancelSettle = 100 * time.Millisecond
)

// leaseState is guarded by lease.mu.
type leaseState uint8

const (
	leaseActive leaseState = iota
	leaseReleased
	// leaseTerminated: the guard ended the session, took the connection out of pgxpool and freed
	// the slot; the owner still has to close its *pgx.Conn.
	leaseTerminated
)

// lease is one call's hold on a connection and its lane slot, from acquire to release. Every
// wrapper (rows, row, batch, tx, conn) releases through it, exactly once, and the guard acts on it
// through Act (budget.go).
type lease struct {
	p    *Pool
	pc   *pgxpool.Conn
	conn *pgx.Conn // pc.Conn(), captured once: callers never touch pc again
	slot reserve.Slot
	lane Lane
	tag  string
	pid  uint32

	acquired time.Time // the connection was ready

	reset string // SQL restoring the session before release; "" if nothing to restore

	// The wrapper handed to the caller lives inside the lease, to spare an allocation per call.
	rows leaseRows
	row  leaseRow
	tx   poolTx
	held Conn

	guard    txguard.Lease
	callSite txguard.CallSite
	// violation is set by the guard when it cancels or terminates; the wrappers then fail the
	// lease's calls with it.
	violation atomic.Pointer[BudgetError]
	flagged   atomic.Bool

	// mu orders the owner's release against the guard's cancel and terminate, so that the guard
	// never cancels or terminates a connection already handed to someone else.
	mu          sync.Mutex
	state       leaseState
	cancelledAt time.Time // when the guard cancelled, zero if it did not
}

// release returns the connection to pgxpool and the slot to the lane. It is safe to call more
// than once; only the first call does anything.
func (l *lease) release() {
	l.mu.Lock()
	switch l.state {
	case leaseReleased:
		l.mu.Unlock()
		return
	case leaseTerminated:
		// The guard freed the slot; the connection is dead and no longer pgxpool's.
		l.state = leaseReleased
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = l.conn.Close(ctx)
		cancel()
		return
	}
	l.state = leaseReleased
	cancelledAt := l.cancelledAt
	l.mu.Unlock()

	l.p.guard.Unwatch(&l.guard)
	l.afterCancel(cancelledAt)
	if l.reset != "" && !l.conn.IsClosed() && l.conn.PgConn().TxStatus() == 'I' {
		// A connection not idle is destroyed by pgxpool's Release anyway.
		ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
		_, err := l.conn.Exec(ctx, l.reset)
		cancel()
		if err != nil {
			l.closeConn()
			l.finish()
			l.logReturned()
			return
		}
	}
	l.pc.Release()
	l.finish()
	l.logReturned()
}

// destroy closes the connection instead of returning it (its session could not be prepared). It
// runs before the lease is watched or handed out.
func (l *lease) destroy() {
	l.state = leaseReleased
	l.closeConn()
	l.p.leased.Add(-1)
	l.p.res.Release(l.slot)
}

// hijack takes the connection out of the pool for the caller and frees the slot. A connection the
// guard terminated is handed over as it is: dead, for the caller to close.
func (l *lease) hijack() *pgx.Conn {
	l.mu.Lock()
	switch l.state {
	case leaseReleased:
		l.mu.Unlock()
		panic("pgxlanes: cannot hijack a connection already released or hijacked")
	case leaseTerminated:
		l.state = leaseReleased
		l.mu.Unlock()
		return l.conn
	}
	l.state = leaseReleased
	cancelledAt := l.cancelledAt
	l.mu.Unlock()
	l.p.guard.Unwatch(&l.guard)
	l.afterCancel(cancelledAt)
	c := l.pc.Hijack()
	l.p.open.Add(-1) // out of pgxpool without BeforeClose
	l.finish()
	return c
}

// afterCancel, for a connection whose statement the guard cancelled at cancelledAt (zero if it
// did not), lets a late cancel land here rather than on the connection's next user, and takes back
// the socket deadline the guard set as a backstop.
func (l *lease) afterCancel(cancelledAt time.Time) {
	if cancelledAt.IsZero() {
		return
	}
	if d := time.Until(cancelledAt.Add(cancelSettle)); d > 0 {
		time.Sleep(d)
	}
	if !l.conn.IsClosed() {
		_ = l.conn.PgConn().Conn().SetDeadline(time.Time{})
	}
}

func (l *lease) closeConn() {
	c := l.pc.Hijack()
	l.p.open.Add(-1)
	ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
	_ = c.Close(ctx)
	cancel()
}

// finish frees the slot and reports the hold time. The connection is already back in pgxpool
// or out of it.
func (l *lease) finish() {
	l.p.leased.Add(-1)
	if l.lane != Short {
		l.p.holders.remove(l)
	}
	l.p.res.Release(l.slot)
	if l.p.observed() { // reading the clock is not free: only for observers
		l.p.observeRelease(ReleaseEvent{Lane: l.lane, Tag: l.tag, Hold: time.Since(l.acquired)})
	}
}
