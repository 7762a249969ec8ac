// Package txguard watches leases (transactions, held connections, open rows) against their
// budgets with one goroutine and a timer heap, and walks each late lease up an escalation ladder:
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
// Cost: Watch and Unwatch are O(log n) under one mutex and allocate nothing; there is no goroutine
// per lease. The timer is re-armed only when a lease is due earlier than every other, so a stream
// of short leases that end on time wakes the goroutine about once per budget, not once per lease.
//
// Subpackage pgxguard puts this guard on a plain *pgxpool.Pool, through pgxpool's acquire and
// release tracers: the first step of a rollout that changes no pool (docs/migration.md). pgxlanes
// uses it for its lanes' budgets.
package txguard

import (
	"container/heap"
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

	// Guarded by Guard.mu.
	index int       // position in the heap, -1 when not watched
	steps [4]step   // the steps still to come, in order; kept here so Watch allocates nothing
	n     int       // number of steps
	next  int       // next step
	at    time.Time // when the next step is due
	guard *Guard
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
	l.n, l.next = 0, 0
	if l.Budget > 0 {
		for _, s := range ladder(l.Action) {
			l.steps[l.n] = step{s.action, stepAfter(l.Budget, s.halves)}
			l.n++
		}
	}
	if l.Mark > 0 {
		i := 0
		for i < l.n && l.steps[i].after <= l.Mark {
			i++
		}
		copy(l.steps[i+1:l.n+1], l.steps[i:l.n])
		l.steps[i] = step{Mark, l.Mark}
		l.n++
	}
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

// due returns Start + d, saturating at the far future.
func (l *Lease) due(d time.Duration) time.Time {
	t := l.Start.Add(d)
	if t.Before(l.Start) {
		return l.Start.Add(math.MaxInt64)
	}
	return t
}

// Guard schedules the ladders of all watched leases.
type Guard struct {
	mu      sync.Mutex
	h       leaseHeap
	timer   *time.Timer
	timerAt time.Time // when timer fires; zero when not armed
	closed  bool

	stop    chan struct{}
	stopped chan struct{}
	acts    sync.WaitGroup
}

// New starts a guard and its goroutine. Close stops it.
func New() *Guard {
	g := &Guard{
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
		l.index = -1
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if l.guard != nil {
		panic("txguard: lease watched twice")
	}
	if g.closed {
		l.index = -1
		return
	}
	l.guard = g
	l.at = l.due(l.steps[0].after)
	heap.Push(&g.h, l)
	if g.timerAt.IsZero() || l.at.Before(g.timerAt) {
		g.armLocked(l.at)
	}
}

// Unwatch stops watching l. It is safe on a lease that is not (or no longer) watched.
func (g *Guard) Unwatch(l *Lease) {
	g.mu.Lock()
	if l.index >= 0 && l.guard == g {
		heap.Remove(&g.h, l.index)
	}
	l.guard = nil
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
	for _, l := range g.h {
		l.index, l.guard = -1, nil
	}
	g.h = nil
	g.mu.Unlock()
	close(g.stop)
	<-g.stopped
	g.acts.Wait()
}

// armLocked makes the timer fire at t. Caller must hold g.mu.
func (g *Guard) armLocked(t time.Time) {
	g.timerAt = t
	g.timer.Reset(time.Until(t))
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

// collect takes the steps due by now off the heap, advances their leases' ladders and re-arms the
// timer for the next step due.
func (g *Guard) collect(batch []due, now time.Time) []due {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.timerAt = time.Time{}
	for len(g.h) > 0 && !g.h[0].at.After(now) {
		l := g.h[0]
		batch = append(batch, due{l.Owner, l.Gen, l.steps[l.next].action, now.Sub(l.Start)})
		l.next++
		if l.next < l.n {
			l.at = l.due(l.steps[l.next].after)
			heap.Fix(&g.h, 0)
		} else {
			heap.Pop(&g.h)
			l.guard = nil
		}
	}
	if len(g.h) > 0 {
		g.armLocked(g.h[0].at)
	}
	return batch
}

// leaseHeap orders leases by their next step's time.
type leaseHeap []*Lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*Lease)
	l.index = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.index = -1
	*h = old[:len(old)-1]
	return l
}
