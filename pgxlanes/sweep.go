package pgxlanes

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgxlanes/pgxlanes/txguard"
)

// The guard watches a lease only once it may need it. Most leases end in milliseconds, long
// before the first step of their ladder (Budget/2 or Budget) or their mark (the slow threshold),
// and for them a Watch and an Unwatch, two locks of the guard's one mutex, were the largest item
// of an acquire and release after the clock. So a lease whose first step is eagerWithin (200 ms)
// or more away is not watched at acquire: it is published in its server's live table, one atomic store,
// and a sweep every sweepEvery, run while such leases are held, watches those that will reach
// their first step within two sweeps. The guard then acts at the same times as before: a lease
// is watched at least one sweep (50 ms) before its first step is due, so a sweep's own delay of up
// to that leaves every step on time. A lease whose first step is sooner is watched at acquire,
// as before. An idle pool has no sweep: the first lease published arms it, and a sweep that
// finds nothing to watch or wait for stops.
//
// The table has one entry per reserve slot of the server (reserve.Slot.Index), each on a cache
// line of its own (leases acquired at once have neighbouring slots), up to liveMax entries: a
// pool may have a MaxConns of millions and hold a few. A lease whose slot is past the table is
// watched at acquire. The entry also notes the PID of a Short lease holding the slot, for the
// lock-holder lookup (holders).
const (
	sweepEvery  = 50 * time.Millisecond
	eagerWithin = 4 * sweepEvery
	liveMax     = 4096 // 256 KiB at most, for a MaxConns of 4,096 or more
)

// liveEntry is a live table's entry: the lease holding the slot, if it is published, and the
// backend PID of a Short lease holding it (holders), 0 for none.
type liveEntry struct {
	l   atomic.Pointer[lease]
	pid atomic.Uint32
	_   [52]byte
}

// holdsShort reports whether a Short lease of srv holds the session of backend pid, as far as the
// live table knows: a Short lease whose slot is past the table is not noted.
func (srv *server) holdsShort(pid uint32) bool {
	if pid == 0 {
		return false
	}
	for i := range srv.live {
		if srv.live[i].pid.Load() == pid {
			return true
		}
	}
	return false
}

// sweeper runs a pool's sweeps, on a timer armed only while a published lease is held.
type sweeper struct {
	mu     sync.Mutex // serialises the sweeps and Close
	timer  *time.Timer
	armed  atomic.Bool // the timer is set, or a sweep is under way that will set it if needed
	closed bool        // guarded by mu
}

// startSweeper makes p's sweeper, its timer stopped.
func (p *Pool) startSweeper() {
	p.sweep.timer = time.AfterFunc(time.Hour, p.runSweep)
	p.sweep.timer.Stop()
}

// publish hands lease l, which is not watched, to the sweep: from now on the sweep may watch it,
// under l.mu. Every field the sweep reads (the guard's Lease, lazyAt) is written before.
func (p *Pool) publish(l *lease) {
	l.pub.Store(l.guard.Gen) // the hold's generation, as newLease gave it to the guard's entry
	l.srv.live[l.slot.Index()].l.Store(l)
	if !p.sweep.armed.Load() && p.sweep.armed.CompareAndSwap(false, true) {
		p.sweep.timer.Reset(sweepEvery)
	}
}

// unpublish takes l out of its server's live table, before its slot goes back to the reserve.
func (l *lease) unpublish() { l.srv.live[l.slot.Index()].l.Store(nil) }

// watch has the guard watch lease l, whose guard entry is filled but for its Start, from now on:
// at acquire (newLease), or under l.mu once its first step nears (the sweep). watched is set
// first: once watched, the guard may act (and end the lease) at once.
func (l *lease) watch() {
	l.watched = true
	l.guard.Start = l.acquired.time()
	l.p.guard.Watch(&l.guard)
}

// lazyAt returns when a lease acquired at acquired, whose first step is first after that, must
// be watched: two sweeps before the step.
func lazyAt(acquired mono, first time.Duration) mono {
	return acquired + mono(first-2*sweepEvery)
}

// ladderFirst returns how long after its start the first step of the ladder of budget b and
// action a is due; 0 for no budget. A lane keeps it for its own budget (laneRuntime.ladderFirst).
func ladderFirst(b time.Duration, a Action) time.Duration {
	if b <= 0 {
		return 0
	}
	return txguard.FirstStep(b, guardAction(a))
}

// firstStep returns how long after its start a lease's first step is due: its ladder's (0 for
// none) or its mark (0 for none), whichever comes first.
func firstStep(ladder, mark time.Duration) time.Duration {
	if ladder <= 0 || mark > 0 && mark < ladder {
		return mark
	}
	return ladder
}

// runSweep is the timer's function: one sweep, then the timer again if a published lease is
// still unwatched.
func (p *Pool) runSweep() {
	s := &p.sweep
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if p.sweepOnce() {
		s.timer.Reset(sweepEvery)
		return
	}
	// Nothing left to wait for: disarm, then look once more, for a lease published after the
	// look above by an acquire that found the sweep still armed and so did not arm it.
	s.armed.Store(false)
	if p.sweepOnce() && s.armed.CompareAndSwap(false, true) {
		s.timer.Reset(sweepEvery)
	}
}

// sweepOnce watches every published lease that is due to be watched, and reports whether any
// published lease is left unwatched.
func (p *Pool) sweepOnce() (pending bool) {
	now := monoNow()
	for _, srv := range p.servers {
		for i := range srv.live {
			l := srv.live[i].l.Load()
			if l == nil {
				continue
			}
			// The lease may have ended, been reused and published again since the load: its
			// fields are read only for the hold whose publication pub shows, and only while that
			// hold is under way (its end leaves phase active or committing under l.mu first).
			l.mu.Lock()
			st := l.st.Load()
			if ph := leasePhase(st & phaseMask); st>>genShift == l.pub.Load() && (ph == phActive || ph == phCommitting) && !l.watched {
				if l.lazyAt <= now {
					l.watch()
				} else {
					pending = true
				}
			}
			l.mu.Unlock()
		}
	}
	return pending
}

// closeSweeper stops the sweeps; one under way finishes first.
func (p *Pool) closeSweeper() {
	s := &p.sweep
	s.mu.Lock()
	s.closed = true
	s.timer.Stop()
	s.mu.Unlock()
}
