package pgxlanes

import (
	"context"
	"time"

	"github.com/pgxlanes/pgxlanes/txguard"
)

// terminateTimeout bounds one terminate: reaching the guard session, ending the backend and
// seeing it gone.
const terminateTimeout = 5 * time.Second

// guardAction is a's action in the guard's ladder.
func guardAction(a Action) txguard.Action {
	switch a {
	case ActionCancel:
		return txguard.Cancel
	case ActionTerminate:
		return txguard.Terminate
	}
	return txguard.Flag
}

// Act is txguard.Owner's method; the guard calls ActGen, which says which hold the action is for.
func (l *lease) Act(a txguard.Action, elapsed time.Duration) { l.ActGen(l.gen(), a, elapsed) }

// ActGen carries out the guard's decision about hold gen of the lease; it implements
// txguard.GenOwner. An action for a hold that is over does nothing: the lease may serve another
// caller by now (slab.go), so every action checks gen under l.mu before it reads the lease. It
// never does network I/O while holding l.mu, so the owner's release never waits for it, and what
// it reports (log lines, observers, OnViolation, the learner's changes) runs on the reporter's
// goroutine (report.go), so that a slow handler delays no other lease's action:
//   - Mark tells the learner that the statement is still running past the slow threshold.
//   - Flag marks the lease and reports it.
//   - Cancel interrupts the request in flight, if any (internal/wire: the owner's call returns at
//     once with a *BudgetError, and the connection is cleaned in the background), and makes the
//     lease's later calls fail.
//   - Terminate ends the session over the guard session and reports it only once the backend is
//     verified gone (see terminate).
func (l *lease) ActGen(gen uint64, a txguard.Action, elapsed time.Duration) {
	switch a {
	case txguard.Mark:
		l.mu.Lock()
		if !l.stale(gen) && l.mark(fOverran) {
			// The learner counts it now, in order with the lease's end; what changed is reported
			// off the guard's goroutine (learn.go, onChange).
			l.p.learn.OverranText(l.rt.key, l.sql)
		}
		l.mu.Unlock()
		return
	case txguard.Flag:
		l.mu.Lock()
		if l.stale(gen) {
			l.mu.Unlock()
			return
		}
		v := l.violationOf(ActionFlag, elapsed, nil)
		if !v.Warning {
			l.mark(fFlagged) // over budget on a flag lane; a warning flags nothing
		}
		p, srv := l.p, l.srv
		l.mu.Unlock()
		p.counted(v)
		srv.term.report(func() { p.violated(v) })
		return
	case txguard.Cancel:
		l.cancel(gen, elapsed)
		return
	}
	l.mu.Lock()
	pooler := !l.stale(gen) && l.p.pooler
	l.mu.Unlock()
	if pooler {
		// Behind a transaction pooler the PID is the pooler's, not the server's: the ladder's
		// last step cancels again instead.
		l.cancel(gen, elapsed)
		return
	}
	l.terminate(gen, elapsed)
}

// cancel marks hold gen of the lease as over its budget and interrupts its request in flight.
// Interrupt does no I/O, so it runs under l.mu: the connection cannot have been handed to someone
// else. A COMMIT in flight is not interrupted: the violation is recorded and reported, and the
// COMMIT's own outcome is what the owner gets.
func (l *lease) cancel(gen uint64, elapsed time.Duration) {
	l.mu.Lock()
	if l.stale(gen) {
		l.mu.Unlock()
		return
	}
	v := l.violationOf(ActionCancel, elapsed, nil)
	p, srv := l.p, l.srv
	switch l.phase() {
	case phActive:
		be := l.budgetError(ActionCancel, elapsed, nil)
		l.violation.Store(be)
		p.counted(v) // before the owner can return be
		l.w.Interrupt(be)
	case phCommitting:
		l.violation.CompareAndSwap(nil, l.budgetError(ActionCancel, elapsed, nil))
		p.counted(v)
	default:
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	srv.term.report(func() { p.violated(v) })
}

// terminate ends the session of hold gen of the lease: active -> terminating under l.mu, then its
// I/O without it (the owner's release meanwhile only records that the owner is done), then the
// verdict: terminated if the backend is verified gone; otherwise the failure, after which the
// pool closes its own socket to the session (the server notices at its next read, or at the
// idle-in-transaction backstop). Either way the slot is freed now and the owner's calls fail with
// a *BudgetError that says which. A COMMIT in flight is waited for, commitWait at most, so that a
// transaction the server committed is not reported failed. From terminating on, only this
// goroutine moves the lease on: it ends the lease, and reuses it if the owner let go meanwhile;
// otherwise the owner's release does (close).
func (l *lease) terminate(gen uint64, elapsed time.Duration) {
	l.mu.Lock()
	if !l.stale(gen) && l.phase() == phCommitting {
		ch := make(chan struct{})
		l.committed = ch
		l.mu.Unlock()
		t := time.NewTimer(commitWait)
		select {
		case <-ch:
		case <-t.C:
		}
		t.Stop()
		l.mu.Lock()
	}
	if l.stale(gen) { // ended meanwhile, perhaps reused
		l.mu.Unlock()
		return
	}
	switch l.phase() {
	case phActive, phCommitting:
		// From here the owner's calls fail at once: they would reach a session being killed.
		l.violation.Store(l.budgetError(ActionTerminate, elapsed, nil))
		l.setLocked(phTerminating)
	default:
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()

	p, srv := l.p, l.srv
	ctx, cancel := context.WithTimeout(context.Background(), terminateTimeout)
	err := srv.term.terminate(ctx, l.pid)
	cancel()
	l.violation.Store(l.budgetError(ActionTerminate, elapsed, err))
	v := l.violationOf(ActionTerminate, elapsed, err)
	p.counted(v)
	l.end(endTerminated) // the phase stays terminating (or abandoned) until it is done

	l.mu.Lock()
	last := l.phase() == phAbandoned // the owner let go meanwhile
	if last {
		l.setLocked(phEnded)
	} else {
		l.setLocked(phTerminated)
	}
	l.mu.Unlock()
	srv.term.report(func() { p.violated(v) })
	if last {
		l.recycle()
	}
}

func (l *lease) budgetError(a Action, elapsed time.Duration, failed error) *BudgetError {
	return &BudgetError{Lane: l.rt.lane, Tag: l.rt.tag, Action: a, Budget: l.budget, Elapsed: elapsed,
		CallSite: l.callSite.String(), Failed: failed}
}

func (l *lease) violationOf(a Action, elapsed time.Duration, err error) Violation {
	return Violation{Lane: l.rt.lane, Tag: l.rt.tag, Action: a, PID: l.pid, Budget: l.budget, Elapsed: elapsed,
		Warning: a == ActionFlag && l.action != ActionFlag, OverBudget: l.action, CallSite: l.callSite.String(), Err: err}
}
