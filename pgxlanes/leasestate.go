package pgxlanes

import "time"

// The lease's life is one state word, lease.st: a phase in the low bits, two flags above, and the
// lease's generation in the high bits (see slab.go: a lease is reused, and every hold of it has a
// generation of its own, which its wrappers keep and check). Every
// change of phase is made under lease.mu by one of the functions below (but releasing -> ended,
// which nothing else can race), every write is a compare-and-swap, and the wrappers read the
// word without the lock (check). The transitions, and who makes them:
//
//	from          event                              to            what happens
//	active        Commit starts (beginCommit)        committing
//	committing    Commit returns (endCommit)         active
//	active        owner's Release / Close (close)    releasing     then ended, after a drain if one is under way
//	releasing     the drain ends, or none (finish)   ended         slot freed, connection back to pgxpool or closed
//	active        owner's Hijack (hijack)            ended         slot freed, connection handed over
//	active        guard's cancel                     active        violation recorded, request in flight interrupted
//	committing    guard's cancel                     committing    violation recorded only: the COMMIT is not interrupted
//	active        guard's terminate                  terminating   the guard's I/O runs without lease.mu
//	committing    guard's terminate                  -             the guard waits (commitWait at most) for the COMMIT
//	terminating   owner's Release / Hijack           abandoned     the owner does not wait: the guard ends the lease
//	terminating   the guard's verdict                terminated    slot freed, socket closed; calls fail with the verdict
//	abandoned     the guard's verdict                ended         the same
//	terminated    owner's Release / Hijack           ended         nothing more to free (Hijack hands the dead connection)
//	terminating   Commit starts                      terminating   refused: the COMMIT is never sent (it would race the kill)
//
// Every other event leaves the phase as it is: a second Release, a late guard action on a lease
// that ended, a cancel during a terminate.
type leasePhase uint32

const (
	phActive leasePhase = iota
	phCommitting
	phTerminating
	phAbandoned
	phTerminated
	phReleasing
	phEnded

	phaseMask = 0xff
	// fFlagged: the guard flagged the lease over its budget (a flag lane's action). fOverran: the
	// learner was told that its statement ran past the slow threshold.
	fFlagged = 1 << 8
	fOverran = 1 << 9
	// genShift: the generation is st >> genShift, 48 bits: a wrapper kept past its hold would
	// have to outlive 2^48 reuses of its lease to be taken for a later hold's.
	genShift = 16
)

var phaseNames = [...]string{"active", "committing", "terminating", "abandoned", "terminated", "releasing", "ended"}

func (p leasePhase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase?"
}

// commitWait bounds how long the guard's terminate waits for a COMMIT in flight to return: a
// COMMIT is quick unless the server is stuck, and a lease the server acknowledged must not be
// reported failed (see beginCommit).
const commitWait = time.Second

// phase returns the lease's phase. It needs no lock.
func (l *lease) phase() leasePhase { return leasePhase(l.st.Load() & phaseMask) }

// has reports whether flag f is set. It needs no lock.
func (l *lease) has(f uint64) bool { return l.st.Load()&f != 0 }

// gen returns the lease's generation: that of its current hold. It needs no lock.
func (l *lease) gen() uint64 { return l.st.Load() >> genShift }

// setLocked moves the lease to phase p, keeping its flags. Caller must hold l.mu, except for
// releasing -> ended, which only the owner's path makes (end).
func (l *lease) setLocked(p leasePhase) {
	for {
		s := l.st.Load()
		if l.st.CompareAndSwap(s, s&^phaseMask|uint64(p)) {
			return
		}
	}
}

// mark sets flag f and reports whether it was clear before. It needs no lock: every write of
// the word is a compare-and-swap.
func (l *lease) mark(f uint64) bool {
	for {
		s := l.st.Load()
		if s&f != 0 {
			return false
		}
		if l.st.CompareAndSwap(s, s|f) {
			return true
		}
	}
}

// released reports whether the owner released or hijacked the lease: its wrappers refuse calls.
// Only the lease's own code (its acquire, the guard) asks it; a wrapper asks stale.
func (l *lease) released() bool { return releasedPhase(leasePhase(l.st.Load() & phaseMask)) }

func releasedPhase(p leasePhase) bool {
	switch p {
	case phAbandoned, phReleasing, phEnded:
		return true
	}
	return false
}

// stale reports whether a wrapper of hold gen may no longer reach the lease: its owner released
// or hijacked it, or the lease was reused since (one atomic load). Until the owner releases it,
// a lease is not reused, so an owner that found it fresh may use its fields until it releases.
func (l *lease) stale(gen uint64) bool {
	s := l.st.Load()
	return s>>genShift != gen || releasedPhase(leasePhase(s&phaseMask))
}

// terminating reports whether the guard is terminating the lease's session.
func (l *lease) terminating() bool {
	p := l.phase()
	return p == phTerminating || p == phAbandoned
}

// beginCommit moves an active lease to committing, so that the guard does not interrupt its
// COMMIT: interrupted, a COMMIT the server may already have carried out would be reported
// failed. It returns the error to fail the Commit with instead, when the guard acted first.
func (l *lease) beginCommit() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.phase() {
	case phActive:
		if v := l.violation.Load(); v != nil {
			return v
		}
		l.setLocked(phCommitting)
		return nil
	case phTerminating, phTerminated:
		if v := l.violation.Load(); v != nil {
			return v
		}
		return l.budgetError(ActionTerminate, l.acquired.since(), nil)
	}
	return ErrReleased
}

// endCommit moves a committing lease back to active and wakes a terminate waiting for it.
// It reports whether the guard started a terminate meanwhile (after commitWait): the COMMIT's
// outcome is then unknown if the call failed.
func (l *lease) endCommit() (terminated bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.phase() == phCommitting {
		l.setLocked(phActive)
	} else {
		terminated = true
	}
	if l.committed != nil {
		close(l.committed)
		l.committed = nil
	}
	return terminated
}
