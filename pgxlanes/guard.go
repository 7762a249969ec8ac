package pgxlanes

import (
	"context"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/txguard"
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

// Act carries out the guard's decision about the lease; it implements txguard.Owner. It never
// does network I/O while holding l.mu, so the owner's release never waits for it:
//   - Mark tells the learner that the statement is still running past the slow threshold.
//   - Flag marks the lease and reports it.
//   - Cancel interrupts the request in flight, if any (internal/wire: the owner's call returns at
//     once with a *BudgetError, and the connection is cleaned in the background), and makes the
//     lease's later calls fail.
//   - Terminate ends the session over the guard session and reports it only once the backend is
//     verified gone (see terminate).
func (l *lease) Act(a txguard.Action, elapsed time.Duration) {
	switch a {
	case txguard.Mark:
		if !l.released.Load() && l.overran.CompareAndSwap(false, true) {
			l.p.overran(l)
		}
		return
	case txguard.Flag:
		if l.released.Load() {
			return
		}
		l.flagged.Store(true)
		l.p.violated(l.violationOf(ActionFlag, elapsed, nil))
		return
	case txguard.Cancel:
		l.cancel(elapsed)
		return
	}
	if l.p.pooler {
		// Behind a transaction pooler the PID is the pooler's, not the server's: the ladder's
		// last step cancels again instead.
		l.cancel(elapsed)
		return
	}
	l.terminate(elapsed)
}

// cancel marks the lease as over its budget and interrupts its request in flight. Interrupt does
// no I/O, so it runs under l.mu: the connection cannot have been handed to someone else.
func (l *lease) cancel(elapsed time.Duration) {
	l.mu.Lock()
	if l.state != leaseActive {
		l.mu.Unlock()
		return
	}
	be := l.budgetError(ActionCancel, elapsed, nil)
	l.violation.Store(be)
	l.w.Interrupt(be)
	l.mu.Unlock()
	l.p.violated(l.violationOf(ActionCancel, elapsed, nil))
}

// terminate ends the lease's session. It marks the lease under l.mu, then does its I/O without
// it: the owner's release meanwhile only records that the owner is done. It records the verdict
// after the action: terminated if the backend is verified gone; otherwise the failure, after
// which the pool closes its own socket to the session (the server notices at its next read, or
// at the idle-in-transaction backstop). Either way the slot is freed now and the owner's calls
// fail with a *BudgetError that says which.
func (l *lease) terminate(elapsed time.Duration) {
	l.mu.Lock()
	if l.state != leaseActive || l.terminating.Load() {
		l.mu.Unlock()
		return
	}
	l.terminating.Store(true)
	l.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), terminateTimeout)
	err := l.srv.term.terminate(ctx, l.pid)
	cancel()
	l.violation.Store(l.budgetError(ActionTerminate, elapsed, err))

	l.mu.Lock()
	st := l.state
	l.state = leaseEnded
	l.terminating.Store(false)
	l.mu.Unlock()
	if st != leaseEnded {
		l.end(endTerminated)
	} else {
		_ = l.w.Close() // hijacked meanwhile: it was over its budget all the same
	}
	l.p.violated(l.violationOf(ActionTerminate, elapsed, err))
}

func (l *lease) budgetError(a Action, elapsed time.Duration, failed error) *BudgetError {
	return &BudgetError{Lane: l.rt.lane, Tag: l.rt.tag, Action: a, Budget: l.budget, Elapsed: elapsed,
		CallSite: l.callSite.String(), Failed: failed}
}

func (l *lease) violationOf(a Action, elapsed time.Duration, err error) Violation {
	return Violation{Lane: l.rt.lane, Tag: l.rt.tag, Action: a, PID: l.pid, Budget: l.budget, Elapsed: elapsed,
		Warning: a == ActionFlag && l.action != ActionFlag, CallSite: l.callSite.String(), Err: err}
}
