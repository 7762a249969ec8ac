// Package txguard watches leases (transactions, held connections, open rows) against their
// budgets with one goroutine and one timer, and walks each late lease up an escalation ladder:
//
//	action     at Budget/2   at Budget    at 2×Budget
//	Flag       -             flag         -
//	Cancel     flag          cancel       terminate (if still held)
//	Terminate  flag          terminate    -
//
// A flag is a warning with the lease's call site; cancel stops the running statement; terminate
// ends the server session. A lease may also ask for a Mark at a time of its own (a statement that
// is still running past a threshold). The guard only schedules: the lease's Owner carries the
// actions out, and this package knows nothing of connections or of its caller.
//
// Cost: Watch and Unwatch are O(1) under one mutex and allocate nothing; there is no goroutine
// per lease. The leases of a lane come due in the order they were watched, so the guard keeps
// them in a few lists, one per step, in that order (queue.go); past 32 distinct steps (odd
// per-lease budgets) the rest go to a heap, O(log n). The timer is re-armed only when a
// lease is due earlier than every other, so a stream of short leases that end on time wakes the
// goroutine about once per budget, not once per lease.
//
// Subpackage pgxguard puts this guard on a plain *pgxpool.Pool, through pgxpool's acquire and
// release tracers: the first step of a rollout that changes no pool (docs/migration.md). pgxlanes
// uses it for its lanes' budgets.
package txguard

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Action is what happens to a lease that outlives its budget.
type Action uint8

const (
	Flag Action = iota + 1
	Cancel
	Terminate
	// Mark is the lease's own early notice, due at Start + Lease.Mark; it does not escalate.
	Mark
)

func (a Action) String() string {
	switch a {
	case Flag:
		return "flag"
	case Cancel:
		return "cancel"
	case Terminate:
		return "terminate"
	case Mark:
		return "mark"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// Owner carries out the guard's decisions about one lease. Act runs on the guard's goroutine for
// Flag and Mark, and on a goroutine of its own for Cancel and Terminate, so a slow cancel or
// termination does not delay other leases. Act must cope with a lease that ended in the meantime.
type Owner interface {
	Act(a Action, elapsed time.Duration)
}

// GenOwner is an Owner that reuses its Lease for one hold after another. The guard calls ActGen
// instead of Act, with the Gen the Lease had when the step came due, so that an action decided
// for an earlier hold, and carried out after that hold ended and the Lease was watched again,
// can be told apart and dropped. ActGen runs where Act would.
type GenOwner interface {
	Owner
	ActGen(gen uint64, a Action, elapsed time.Duration)
}

// Lease is one watched hold. The owner fills Owner, Start, Budget and Action before Watch and
// does not change them while watched. Keep it inside the owner's own struct: Watch allocates
// nothing.
type Lease struct {
	Owner  Owner
	Start  time.Time
	Budget time.Duration // 0 or less: no budget ladder
	Action Action        // the ladder: Flag, Cancel or Terminate
	Mark   time.Duration // > 0: a Mark is due at Start + Mark
	// Gen tells one hold of a reused Lease from another: a GenOwner's ActGen gets it back.
	Gen uint64

	// Guarded by Guard.mu while watched. Watch writes steps, n and cur before it takes the lock:
	// the lease is not watched then.
	guard      *Guard  // the guard watching the lease; nil when not watched
	list       *list   // the list the lease is in; nil when not watched or in the overflow heap
	prev, next *Lease  // neighbours in list, earlier and later
	index      int     // position in the overflow heap, while in it
	at         int64   // when the next step is due, in nanoseconds since Guard.epoch
	steps      [4]step // the steps to come, in order; kept here so Watch allocates nothing
	n          uint8   // number of steps
	cur        uint8   // the next step
}

type step struct {
	action Action
	after  time.Duration // due at Start + after
}

// rung is a step of a ladder: what to do at which multiple of half the budget.
type rung struct {
	action Action
	halves int
}

var (
	flagLadder      = []rung{{Flag, 2}}
	cancelLadder    = []rung{{Flag, 1}, {Cancel, 2}, {Terminate, 4}}
	terminateLadder = []rung{{Flag, 1}, {Terminate, 2}}
)

// ladder returns the ladder of action a; anything but Cancel and Terminate only flags.
func ladder(a Action) []rung {
	switch a {
	case Cancel:
		return cancelLadder
	case Terminate:
		return terminateLadder
	}
	return flagLadder
}

// plan fills l.steps from Budget, Action and Mark.
func (l *Lease) plan() {
	var n uint8
	if b := l.Budget; b > 0 {
		if half := b / 2; half <= math.MaxInt64/4 {
			// The ladders spelled out (the tables above, without a loop): Watch runs this for
			// every lease.
			switch l.Action {
			case Cancel:
				l.steps[0] = step{Flag, half}
				l.steps[1] = step{Cancel, 2 * half}
				l.steps[2] = step{Terminate, 4 * half}
				n = 3
			case Terminate:
				l.steps[0] = step{Flag, half}
				l.steps[1] = step{Terminate, 2 * half}
				n = 2
			default:
				l.steps[0] = step{Flag, 2 * half}
				n = 1
			}
		} else {
			for _, s := range ladder(l.Action) {
				l.steps[n] = step{s.action, stepAfter(b, s.halves)}
				n++
			}
		}
	}
	if m := l.Mark; m > 0 {
		i := n
		for i > 0 && l.steps[i-1].after > m {
			l.steps[i] = l.steps[i-1]
			i--
		}
		l.steps[i] = step{Mark, m}
		n++
	}
	l.n, l.cur = n, 0
}

// FirstStep returns how long after the start of a lease with budget b and action a the ladder's
// first step is due: the earliest time the guard may act on it (a Mark aside). A caller that
// watches its leases only once they may need the guard uses it (pgxlanes does, for its lanes).
func FirstStep(b time.Duration, a Action) time.Duration {
	return stepAfter(b, ladder(a)[0].halves)
}

// LastStep returns how long after the start of a lease with budget b and action a the ladder's
// last step is due: the latest time the guard may act. Server-side backstops are set just
// beyond it.
func LastStep(b time.Duration, a Action) time.Duration {
	r := ladder(a)
	return stepAfter(b, r[len(r)-1].halves)
}

// stepAfter is halves × budget/2, saturating instead of overflowing for huge budgets.
func stepAfter(budget time.Duration, halves int) time.Duration {
	half := budget / 2
	if half > math.MaxInt64/time.Duration(halves) {
		return math.MaxInt64
	}
	return time.Duration(halves) * half
}

// dueAt returns when the step at offset d of l is due, in nanoseconds since g.epoch, saturating
// at the far future. An int64 rather than a time.Time: the schedule compares these often.
func (g *Guard) dueAt(l *Lease, d time.Duration) int64 {
	s := int64(l.Start.Sub(g.epoch)) // Sub saturates
	if s > 0 && int64(d) > math.MaxInt64-s {
		return math.MaxInt64
	}
	return s + int64(d)
}

// Guard schedules the ladders of all watched leases.
type Guard struct {
	mu       sync.Mutex
	lists    [maxLists]list // guarded by mu; the first nlists have a key
	nlists   int            // guarded by mu
	overflow leaseHeap      // guarded by mu; leases whose key has no list
	watched  int            // guarded by mu; the leases in lists and overflow
	epoch    time.Time      // the origin of Lease.at
	timer    *time.Timer
	timerAt  int64 // guarded by mu; when timer fires, since epoch
	armed    bool  // guarded by mu; the timer is set to fire at timerAt
	arms     int   // guarded by mu; how many times the timer was set (for the tests)
	closed   bool  // guarded by mu

	stop    chan struct{}
	stopped chan struct{}
	acts    sync.WaitGroup
}

// New starts a guard and its goroutine. Close stops it.
func New() *Guard {
	g := &Guard{
		epoch:   time.Now(),
		timer:   time.NewTimer(time.Hour),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	g.timer.Stop()
	go g.run()
	return g
}

// Watch starts watching l. A lease with no budget and no mark is not watched: Watch takes no
// lock for it, and its owner need not call Unwatch. Watching a lease twice without Unwatch
// panics: it is a bug in the owner.
func (g *Guard) Watch(l *Lease) {
	l.plan()
	if l.n == 0 || l.Owner == nil {
		return
	}
	at := g.dueAt(l, l.steps[0].after)
	g.mu.Lock()
	if l.guard != nil {
		g.mu.Unlock()
		panic("txguard: lease watched twice")
	}
	if g.closed {
		g.mu.Unlock()
		return
	}
	l.guard, l.at = g, at
	g.placeLocked(l)
	g.watched++
	if !g.armed || at < g.timerAt {
		g.armLocked(at)
	}
	g.mu.Unlock()
}

// Unwatch stops watching l. It is safe on a lease that is not (or no longer) watched.
func (g *Guard) Unwatch(l *Lease) {
	g.mu.Lock()
	if l.guard == g {
		g.removeLocked(l)
		g.watched--
		l.guard = nil
	}
	g.mu.Unlock()
}

// Close stops the guard's goroutine and waits for actions under way. Leases still watched are
// dropped.
func (g *Guard) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	g.dropAllLocked()
	g.watched = 0
	g.mu.Unlock()
	close(g.stop)
	<-g.stopped
	g.acts.Wait()
}

// armLocked makes the timer fire at at. Caller must hold g.mu.
func (g *Guard) armLocked(at int64) {
	g.timerAt, g.armed = at, true
	g.arms++
	g.timer.Reset(time.Duration(at) - time.Since(g.epoch))
}

type due struct {
	owner   Owner
	gen     uint64
	action  Action
	elapsed time.Duration
}

// act carries out d on its owner.
func (d due) act() {
	if o, ok := d.owner.(GenOwner); ok {
		o.ActGen(d.gen, d.action, d.elapsed)
		return
	}
	d.owner.Act(d.action, d.elapsed)
}

func (g *Guard) run() {
	defer close(g.stopped)
	var batch []due
	for {
		select {
		case <-g.stop:
			g.timer.Stop()
			return
		case <-g.timer.C:
		}
		batch = g.collect(batch[:0], time.Now())
		for _, d := range batch {
			if d.action == Flag || d.action == Mark {
				d.act()
				continue
			}
			g.acts.Add(1)
			go func() {
				defer g.acts.Done()
				d.act()
			}()
		}
	}
}

// collect takes the steps due by now off the schedule, moves their leases to their next steps
// and re-arms the timer for the next step due.
func (g *Guard) collect(batch []due, now time.Time) []due {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = false
	nowAt := int64(now.Sub(g.epoch))
	for {
		l := g.earliestLocked()
		if l == nil {
			return batch
		}
		if l.at > nowAt {
			g.armLocked(l.at)
			return batch
		}
		batch = append(batch, due{l.Owner, l.Gen, l.steps[l.cur].action, now.Sub(l.Start)})
		g.removeLocked(l)
		l.cur++
		if l.cur < l.n {
			l.at = g.dueAt(l, l.steps[l.cur].after)
			g.placeLocked(l)
		} else {
			g.watched--
			l.guard = nil
		}
	}
}
