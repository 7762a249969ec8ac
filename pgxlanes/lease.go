package pgxlanes

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/internal/wire"
	"github.com/pgxlanes/pgxlanes/reserve"
	"github.com/pgxlanes/pgxlanes/txguard"
)

// closeTimeout bounds the Terminate a destroyed connection sends; its socket is already closed,
// so it returns at once.
const closeTimeout = time.Second

// endHow says how a lease ends.
type endHow uint8

const (
	endReturn     endHow = iota // back to pgxpool, if the connection is fit; destroyed otherwise
	endCleaned                  // the same, after a drain: a transaction left open is rolled back
	endDestroy                  // closed
	endHijack                   // handed to the caller
	endTerminated               // the guard ended the session; the connection leaves pgxpool
)

// lease is one call's hold on a connection and its lane slot, from acquire to its end. Every
// wrapper (rows, row, batch, tx, conn) runs through it, and every ending (release, destroy,
// hijack, the guard's terminate, the end of a drain) passes through end, the one function that
// touches the reserve, the pool's counts, the lock-holder registry, the learner and the
// observers.
//
// A lease is reused once its hold is over (slab.go): mu, st and the wrapper slabs outlive a
// hold; hold is zeroed. Each hold has a generation (in st); a wrapper keeps the generation of its
// hold and checks it (stale) before it touches anything else, and so does every late action of
// the guard (ActGen), so that neither reaches a later hold.
type lease struct {
	// mu orders the owner's transitions against the guard's (leasestate.go); it is never held
	// across network I/O. st is the state word: written under mu, read without it.
	mu sync.Mutex
	st atomic.Uint64
	// pub is the generation of the hold last published to the sweep (sweep.go), stored after
	// that hold's fields: the sweep reads them only if pub is the lease's generation.
	pub atomic.Uint64

	hold

	// wrappers: the wrappers handed to callers, taken by the holder alone (slab.go).
	wrappers wrappers
}

// hold is a lease's state for one hold, zeroed when the lease is reused.
type hold struct {
	p    *Pool
	srv  *server // the server of the lease's lane
	pc   *pgxpool.Conn
	conn *pgx.Conn  // pc.Conn(), captured once
	w    *wire.Conn // the socket under conn
	slot reserve.Slot
	rt   route
	sql  string // the statement, for a learned one
	// fleetSlot is the fleet slot a Long lease holds (fleet.go), -1 for none.
	fleetSlot int32
	pid       uint32
	epoch     uint32 // the parking epoch pc was acquired from pgxpool in (park.go)
	kind      callKind
	// watched: the guard watches the lease (it has a budget or a mark; written by the sweep
	// under mu, for a published lease); registered: it is in srv.holders (a Tx or Long lease);
	// published: it is in srv.live, for the sweep to watch once its first step nears.
	watched, registered, published bool
	// lazyAt: when a published lease must be watched (sweep.go).
	lazyAt mono

	acquired mono          // the connection was ready
	budget   time.Duration // the lease's budget; 0 for none
	action   Action        // what happens past it

	guard    txguard.Lease
	callSite callSite
	// violation is set by the guard when it cancels or terminates, before the lease leaves
	// active; the wrappers then fail the lease's calls with it.
	violation atomic.Pointer[BudgetError]

	// committed is closed when a COMMIT in flight returns; made by a terminate that waits for
	// it. Guarded by mu.
	committed chan struct{}
}

// newLease turns a pgxpool connection and a lane slot into a lease: it stages the session
// settings the lease needs and starts watching its budget.
func (p *Pool) newLease(pc *pgxpool.Conn, slot reserve.Slot, rt *route, kind callKind, sql string, fleetSlot int32, acquired mono) *lease {
	conn := pc.Conn()
	w := wireOf(conn.PgConn())
	srv := p.lanes[rt.lane].srv
	// The guard session opens with the first lease, in the background: not at New, where
	// pgxpool opens nothing and calls no hook, nor with MinConns' background connections, which
	// pgx's own tests count through BeforeConnect.
	srv.term.warm()
	l := newLeaseValue()
	l.p, l.srv, l.pc, l.conn, l.w, l.slot = p, srv, pc, conn, w, slot
	l.rt, l.kind, l.pid, l.fleetSlot = *rt, kind, conn.PgConn().PID(), fleetSlot
	srv.leased.Add(1)
	set := &p.lanes[rt.set]
	l.budget, l.action = on(set.cfg.Budget), set.cfg.OverBudget
	ladder := set.ladderFirst // when the budget's first step is due (sweep.go)
	if rt.budget != 0 {
		l.budget = on(rt.budget)
		ladder = ladderFirst(l.budget, l.action)
	}
	switch {
	case kind != kindTx:
		w.Stage(set.session)
	case !p.pooler && l.budget == set.cfg.Budget:
		w.Stage(set.txSession)
	case !p.pooler:
		w.Stage(srv.sql.session(set.cfg, true, l.budget))
	}
	if p.config.CaptureCallSites {
		l.callSite = captureCallSite()
	}
	l.acquired = acquired // before the registry publishes the lease: Status and blame read it
	if rt.lane != Short {
		l.registered = true
		srv.holders.add(l) // after every field the lock-holder lookup reads is written
	} else if i := slot.Index(); i < len(srv.live) {
		srv.live[i].pid.Store(l.pid)
	}
	var mark time.Duration
	if rt.learn {
		l.sql = sql
		mark = p.config.Short.SlowThreshold
	}
	// The guard watches a lease with a budget or a mark; one with neither has no ladder, and costs
	// it nothing (its Lease stays zero: end does not Unwatch it). One whose first step is far
	// off is watched by the sweep if it lasts (sweep.go); the others now.
	if l.budget > 0 || mark > 0 {
		// Field by field: the hold, and so l.guard, is zero (recycle). Its Start is set by
		// whoever watches it (watch), here or in the sweep.
		g := &l.guard
		g.Owner, g.Budget, g.Action, g.Gen, g.Mark = l, l.budget, guardAction(l.action), l.gen(), mark
		if first := firstStep(ladder, mark); first >= eagerWithin && slot.Index() < len(srv.live) {
			l.published, l.lazyAt = true, lazyAt(l.acquired, first)
			p.publish(l)
		} else {
			l.watch()
		}
	}
	return l
}

// txLocal returns the SET LOCALs that follow the BEGIN of this lease's transaction behind a
// transaction pooler.
func (l *lease) txLocal() string {
	set := &l.p.lanes[l.rt.set]
	if l.budget == set.cfg.Budget {
		return set.txLocal
	}
	return l.srv.sql.local(set.cfg, l.budget)
}

// release ends hold gen of the lease and returns its connection to pgxpool, or closes it if it
// is not fit for reuse. It is safe to call more than once, and after the lease was reused: only
// the first call for a hold does anything.
func (l *lease) release(gen uint64) { l.close(gen, endReturn) }

// close is the owner's end of hold gen (see the table in leasestate.go). It does nothing if that
// hold is already over.
func (l *lease) close(gen uint64, how endHow) {
	l.mu.Lock()
	if l.gen() != gen {
		l.mu.Unlock()
		return
	}
	switch l.phase() {
	case phActive, phCommitting:
		l.setLocked(phReleasing)
		l.mu.Unlock()
		l.end(how)
	case phTerminating:
		// The guard is terminating the session: it ends the lease when done. The owner does not
		// wait for its network I/O.
		l.setLocked(phAbandoned)
		l.mu.Unlock()
	case phTerminated:
		// The guard ended the lease and is done with it: the owner was the last to hold it.
		l.setLocked(phEnded)
		l.mu.Unlock()
		l.recycle()
	default:
		l.mu.Unlock()
	}
}

// hijack ends the lease and hands its connection to the caller, with the session's settings
// back at the defaults before its next statement. During or after a terminate by the guard it
// hands over the connection as it is, being killed or dead, for the caller to close; the slot is
// freed by the guard once its verdict is in, not before.
func (l *lease) hijack(gen uint64) *pgx.Conn {
	l.mu.Lock()
	if l.gen() == gen {
		switch l.phase() {
		case phActive, phCommitting:
			l.setLocked(phEnded)
			l.mu.Unlock()
			return l.end(endHijack)
		case phTerminating:
			l.setLocked(phAbandoned)
			conn := l.conn
			l.mu.Unlock()
			return conn
		case phTerminated:
			l.setLocked(phEnded)
			conn := l.conn
			l.mu.Unlock()
			l.recycle()
			return conn
		}
	}
	l.mu.Unlock()
	panic("pgxlanes: cannot hijack a connection already released or hijacked")
}

// end is the one exit of a lease. A connection whose interrupted request is still being
// cleaned stays leased, its slot held, until the drain ends; the drain then calls end again.
// Once it is over, the lease is reused (recycle), but after a terminate: the guard's goroutine
// decides then who holds it last (terminate).
func (l *lease) end(how endHow) *pgx.Conn {
	p := l.p
	if l.published {
		// Out of the sweep's table first: the phase left active under l.mu before end, so the
		// sweep watches the lease no more, and watched below is what it last set.
		l.published = false
		l.unpublish()
	}
	if l.watched {
		l.watched = false
		p.guard.Unwatch(&l.guard)
	}
	if how == endReturn {
		// The common case, in one lock of the wire.Conn: no drain under way, so the interrupt is
		// dropped and the defaults are staged for whoever comes next.
		draining, fit := l.w.Finish(l, &p.lanes[l.rt.lane].counts.cleaning)
		if draining {
			return nil // counted as cleaning; Cleaned ends the lease when the drain does
		}
		l.setLocked(phEnded) // releasing -> ended: no other transition leaves releasing
		now := monoNow()
		if !fit {
			l.closeConn()
		}
		if !fit || !l.park(now) {
			l.pc.Release() // pgxpool destroys a connection that is closed, busy or in a transaction
		}
		l.done(now)
		l.recycle()
		return nil
	}
	if how != endHijack && how != endTerminated {
		l.setLocked(phEnded) // releasing -> ended: no other transition leaves releasing
	}
	var hijacked *pgx.Conn
	l.w.ClearInterrupt()
	switch how {
	case endCleaned:
		switch {
		case l.w.Broken() || l.w.Failed():
			l.closeConn()
		case l.conn.PgConn().TxStatus() != 'I':
			// A transaction whose statement was interrupted: roll it back here, on the drain's
			// goroutine, so that the session is kept.
			ctx, cancel := context.WithTimeout(context.Background(), p.config.CancelGrace)
			if _, err := l.conn.Exec(ctx, "rollback"); err != nil {
				l.closeConn()
			}
			cancel()
		}
		l.w.Stage("")  // the defaults, before the next statement of whoever comes next
		l.pc.Release() // pgxpool destroys a connection that is closed, busy or in a transaction
	case endDestroy:
		l.closeConn()
		l.pc.Release()
	case endHijack:
		l.w.Stage("")
		hijacked = l.pc.Hijack()
		l.srv.open.Add(-1) // out of pgxpool without BeforeClose
	case endTerminated:
		// The owner may still be using the *pgx.Conn; only its socket is closed here (net.Conn
		// allows that while another goroutine reads), and pgxpool never sees it again.
		_ = l.w.Close()
		l.pc.Hijack()
		l.srv.open.Add(-1)
	}
	l.done(monoNow())
	if how != endTerminated {
		l.recycle()
	}
	return hijacked
}

// done is the end's last part, once the connection is back or gone: the registry, the counts, the
// slot, the learner and the observers.
func (l *lease) done(now mono) {
	p, srv := l.p, l.srv
	if l.registered {
		srv.holders.remove(l)
	} else if i := l.slot.Index(); i < len(srv.live) {
		srv.live[i].pid.Store(0)
	}
	srv.leased.Add(-1)
	if a := int64(l.acquired); a-srv.lastUse.Load() >= int64(time.Millisecond) {
		srv.lastUse.Store(a) // at most once a millisecond: a load is cheaper than a store
	}
	if l.fleetSlot >= 0 {
		p.fleet.release(l.fleetSlot)
	}
	srv.res.Release(l.slot)
	hold := time.Duration(now - l.acquired)
	p.holds.record(l.rt.lane, hold, now)
	if l.rt.learn {
		p.learned(l, hold)
	}
	if flagged := l.has(fFlagged); flagged || p.obs.any() {
		p.obs.release(ReleaseEvent{Lane: l.rt.lane, Tag: l.rt.tag, Hold: hold, PID: l.pid, Budget: l.budget,
			Flagged: flagged, CallSite: l.callSite.String()})
	}
}

// park parks the lease's connection for the next lease (park.go), if pgxpool would take it back
// as it is (not closed, busy or in a transaction) and it has not outlived MaxConnLifetime.
func (l *lease) park(now mono) bool {
	srv := l.srv
	if !srv.parks.Load() {
		return false
	}
	pg := l.conn.PgConn()
	if pg.IsClosed() || pg.IsBusy() || pg.TxStatus() != 'I' {
		return false
	}
	if srv.expired(l.w, now) {
		return false // pgxpool closes it, or keeps it within MaxConnLifetimeJitter
	}
	return srv.park.put(l.pc, l.w, l.epoch, now)
}

// Cleaned is the drain's callback (wire.Cleaner): releasing -> ended, once the connection is clean.
func (l *lease) Cleaned(ok bool) {
	l.p.lanes[l.rt.lane].counts.cleaning.Add(-1)
	if ok {
		l.end(endCleaned)
	} else {
		l.end(endDestroy)
	}
}

// closeConn closes the connection of a lease whose owner is done with it: the socket first, so
// that pgconn's Terminate fails at once instead of waiting on a dead or frozen server.
func (l *lease) closeConn() {
	_ = l.w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	_ = l.conn.Close(ctx)
	cancel()
}

// run is how a wrapper makes a call on its lease: refuse it if the lease is released or the guard
// acted (refuse is the wrapper's check, made first), make it, and turn its error into the
// caller's (fail).
func run[T any](l *lease, refuse error, call func() (T, error)) (T, error) {
	if refuse != nil {
		var zero T
		return zero, refuse
	}
	v, err := call()
	return v, l.fail(err)
}

// check is called by every wrapper of hold gen before it touches the connection: a released
// lease never reaches its connection again, nor a later hold of it, and one the guard acted on
// fails at once.
func (l *lease) check(gen uint64) error {
	if l.stale(gen) {
		return ErrReleased
	}
	if v := l.violation.Load(); v != nil {
		return v
	}
	return nil
}

// fail turns the error of a call on the lease into what the caller gets: the context's error
// when the call's context ended while the server was working (the connection is being cleaned),
// a *BudgetError once the guard acted, and otherwise the error itself, after naming the likely
// holders of a lock the statement gave up on.
func (l *lease) fail(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	isPg := errors.As(err, &pgErr)
	if isPg && pgErr.Code == "57014" {
		if cause := l.w.Cause(); cause != nil {
			var be *BudgetError
			if errors.As(cause, &be) {
				return be.with(err)
			}
			return &interruptedError{lane: l.rt.lane, cause: cause, err: err}
		}
	}
	if v := l.violation.Load(); v != nil {
		return v.with(err)
	}
	if isPg && pgErr.Code == "57P01" && l.terminating() {
		// The server's own word that the guard's terminate happened.
		return l.budgetError(ActionTerminate, l.acquired.since(), nil).with(err)
	}
	if isPg && pgErr.Code == "55P03" {
		l.p.blameLockTimeout(l)
	}
	return err
}
