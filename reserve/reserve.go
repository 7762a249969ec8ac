// Package reserve decides which caller may take one of a fixed number of slots: a semaphore
// split into lanes, so that fast work never queues behind slow work that holds every slot. It
// knows nothing of databases; pgxlanes puts it in front of connections, and examples/httplanes in
// front of an HTTP client.
//
//	p, _ := reserve.New(reserve.Config{Size: 4, Lanes: []reserve.LaneConfig{
//		{Name: "fast", Reserved: 1, Bounded: true, AcquireTimeout: time.Second},
//		{Name: "slow"},
//	}})
//	fast, _ := p.Lane("fast")
//	s, err := fast.Acquire(ctx) // ctx bounds the wait, as does the lane's AcquireTimeout
//	if err != nil {
//		return err // an *AcquireError: errors.Is ErrAcquireTimeout, ErrLaneFull, ErrClosed or ctx's error
//	}
//	defer s.Release()
//
// # The contract
//
// A lane marked Bounded may borrow every idle slot, other lanes' reserves included, because its
// callers promise to give a slot back within a bounded time (a request under a timeout, a
// statement under statement_timeout). The package cannot enforce that promise: a caller of a
// bounded lane that holds a slot without bound takes a reserve from the lane it borrowed from.
// Mark a lane Bounded only when its callers bound their hold time.
//
// AcquireTimeout earns its place beside the ctx: it is the lane's own bound on a wait, the same
// for every caller whatever deadline its ctx carries, and its failure is ErrAcquireTimeout with
// the lane's figures, not the caller's context error.
//
// # The model
//
// A Pool has Size slots shared by named lanes. Each lane has
//
//   - Reserved: slots that no other lane's unbounded work may ever occupy;
//   - MaxConns: a cap on the slots the lane holds at once;
//   - Bounded: whether its holders release within a known time (a short query under a
//     statement timeout) or not (a transaction, a report);
//   - MaxWaiters and AcquireTimeout: a bounded wait queue and a bounded wait.
//
// The slots that no lane reserves, Shared = Size − Σ Reserved, are shared. A bounded lane can
// reach every slot; an unbounded one its reserve plus the shared slots (Config.Reachable).
// Validate holds every rule a configuration must follow.
//
// # Admission rule
//
// A lane may take a free slot when it is below its cap and
//
//   - it is bounded: any free slot, including another lane's idle reserved slots (borrowing);
//   - it is unbounded and below its own reserve: the slot comes out of its reserve;
//   - it is unbounded and at or above its reserve: only while the unbounded lanes together hold
//     fewer than Shared slots beyond their reserves.
//
// # The invariant
//
// Let U be the slots held by unbounded lanes. The rule keeps
//
//	U ≤ Σ Reserved(unbounded lanes) + Shared = Size − Σ Reserved(bounded lanes).
//
// Why: split what each unbounded lane holds into the part within its reserve and the part
// beyond it. The first part is at most the lane's reserve. The second only grows by a take that
// the third case allows, which needs the sum of these parts over all unbounded lanes to be
// below Shared; releases only shrink it. So at every instant at least Σ Reserved(bounded lanes)
// slots are free or held by bounded work, and a bounded (short) caller only ever waits behind
// bounded work, whose hold time is bounded. By the same count no unbounded lane ever holds a
// slot of another unbounded lane's reserve. Borrowing is safe because only bounded work borrows:
// a lane whose reserve was borrowed gets it back within one bounded hold time, and it is served
// first when it does (see below).
//
// # Who gets a released slot
//
// A released slot goes, among the lanes whose first waiter may take it, to a lane below its
// reserve first, then to the lane whose oldest waiter arrived first. Within a lane, waiters are
// served FIFO by default. A lane with a PriorityAge serves higher priorities first, FIFO among
// equals, except that a waiter that has waited PriorityAge is served before every waiter that
// arrived after it: ageing bounds every wait (order.go; docs/design.md proves the bound). A lane
// with a MaxTagShare passes over a waiter whose tag holds that many slots for one of another tag.
// A lane with a PriorityHeadroom h grants a caller of negative priority a slot only while it may
// take more than h slots: its last h slots stay for work of priority 0 or more, which then finds
// one at once under a saturating background load. None of this decides whether a lane may take a
// slot, only which of its callers does: no priority or tag takes a lane past its cap or into
// another lane's reserve. The pool is work-conserving: a slot is never left free while a waiter
// that may take it waits. A new caller never overtakes a waiter of its own lane, whatever its
// priority, but one of negative priority that the headroom holds off.
//
// # Releasing
//
// Acquire returns a Slot value that names the slot and its generation. Release it exactly once.
// Releasing a Slot that is not held, or releasing it twice, is a bug in the caller and panics, as
// x/sync/semaphore does on over-release; the generation makes even a late double release of a
// slot that was since taken by someone else detectable. A caller whose wait ends (ctx, timeout)
// at the instant it is granted a slot gets only the error: the slot goes back to the pool. Close
// fails the waiters; slots held stay held until released.
//
// # Cost and memory
//
// An acquire that does not wait takes one mutex and allocates nothing. A waiting acquire
// allocates the channel that wakes it, and waits on it and its ctx; its queue node comes from a
// per-Pool sync.Pool of plain nodes (no channel, no timer), as Vitess keeps one per wait list.
// The AcquireTimeout needs no timer per waiter: the waiters of a lane time out in their order of
// arrival, so one timer per lane, made when its queue fills and dropped when it empties, fails
// each at its deadline (expiry.go). No channel outlives its wait and no timer its queue, so
// nothing made inside a testing/synctest bubble is touched outside it (the waiters of one lane
// are not in and out of a bubble at once). Cancelling a wait unlinks it from a doubly
// linked list, so its cost does not depend on how many others wait; a grant looks at each
// lane's first waiter and, in a lane ordered by priority, at the first of its highest priority
// and the clock. Only a tag share may scan: past the waiters of tags at their share. There is no
// background goroutine.
//
// Memory is in proportion to the lanes and to what is in use, not to Size. The table of slot
// generations grows with the peak number of slots held at once (16 bytes a slot, never past
// that peak, never shrunk), so New(Config{Size: math.MaxInt32, ...}) allocates a few hundred
// bytes. A waiting caller costs its node, its channel and its timer while it waits; idle nodes
// sit in a sync.Pool, which the garbage collector empties.
package reserve

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Slot is a granted slot. Its zero value is not a slot.
//
// It has four fields, no more: the compiler keeps a struct of up to four fields in registers,
// and a fifth (a separate flags byte) put it in memory and cost about 20 ns per acquire and
// release (+45 %).
type Slot struct {
	p   *Pool  // the pool that granted it
	idx int32  // index in Pool.slots
	gen uint32 // Pool.slots[idx].gen when granted; never 0
	lf  uint32 // the lane's index in the low 24 bits (Validate: fewer than 1<<24 lanes), how it was granted in the high 8
}

// How a Slot was granted, in the high byte of Slot.lf.
const (
	slotWaited   uint32 = 1 << (24 + iota) // granted to a waiter
	slotAged                               // by ageing
	slotHeldBack                           // to a waiter passed over for the tag share

	laneMask = 1<<24 - 1
)

// lane returns the index of the slot's lane.
func (s Slot) lane() int32 { return int32(s.lf & laneMask) }

// Index returns the position of s among the pool's slots, from 0 to Size-1. No two slots held
// at once share an index, so a caller can keep state of its own per held slot in an array of
// Size entries; an index is reused once its slot is released.
func (s Slot) Index() int { return int(s.idx) }

// Waited reports whether the acquire that returned s had to queue.
func (s Slot) Waited() bool { return s.lf&slotWaited != 0 }

// Aged reports whether s went to its waiter by ageing: ahead of a waiter of higher priority, or
// into the lane's PriorityHeadroom.
func (s Slot) Aged() bool { return s.lf&slotAged != 0 }

// HeldBack reports whether the waiter that got s was passed over at least once because its tag
// held the lane's tag share; in dry run, whether it would have been.
func (s Slot) HeldBack() bool { return s.lf&slotHeldBack != 0 }

// Pool hands out slots to lanes. It is safe for concurrent use.
type Pool struct {
	size   int
	shared int // size − Σ Reserved

	mu sync.Mutex
	// All fields below are guarded by mu.
	free        int // size − slots held
	sharedInUse int // Σ max(0, held − Reserved) over unbounded lanes; never exceeds shared
	seq         uint64
	closed      bool
	lanes       []lane
	// slots has one entry per slot ever held at once: it grows to the peak number held and
	// never past size. freeSlots lists the entries not held now. A take reuses the last of
	// them, or appends a new entry when there is none.
	slots     []slotState
	freeSlots []int32

	waiters sync.Pool // of *waiter whose wait is over; Get and Put only under mu
}

type slotState struct {
	gen  uint32 // bumped on every grant, so a stale Slot no longer matches
	lane int32
	held bool
}

type lane struct {
	cfg     LaneConfig
	cap     int // Config.Reachable
	held    int
	waiting int
	// waitHead and waitTail are the queue in arrival order, linked through waiter.prev and
	// waiter.next. classes are the same waiters by priority, highest first, kept only when the
	// lane orders by priority (PriorityAge > 0); see order.go.
	waitHead *waiter
	waitTail *waiter
	classes  []class
	// expiry fails the waiters whose AcquireTimeout ran out; set while the lane has waiters and
	// a timeout. episode counts the timers made, so that a stale one does nothing (expiry.go).
	expiry  *time.Timer
	episode uint64
	// ager grants the headroom to the first waiter when it ages, should nothing else happen in
	// the lane by then; set while the lane's waiters are held off its headroom (expiry.go).
	ager      *time.Timer
	agerEpoch uint64
	// tags counts the slots each tag holds and slotTags names the tag of each slot held (by
	// index in Pool.slots), kept only with a tag share; a tag holding none has no entry.
	tags     map[string]int
	slotTags map[int32]string
	// Cumulative counts of the order's decisions, which only the pool sees (see LaneStat).
	agedGrants, shareRefusals int64
}

// waiter is the queue node of one waiting caller. It belongs to the pool: it is touched only
// under Pool.mu, and it goes back to Pool.waiters the moment its wait is over, when it is
// granted a slot (sent on ready), when the pool closes (ready is closed) or when its caller
// gives up. The caller keeps only ready, which is made for this one wait. So a caller that
// finds nothing on ready, under Pool.mu, knows its node is still queued and still its own.
type waiter struct {
	ready        chan Slot // buffered: the one send never blocks
	lane         int
	seq          uint64 // arrival order across lanes
	since        time.Time
	prio         int
	tag          string
	aged         bool // granted by ageing; copied to the Slot
	heldBack     bool // passed over for the tag share; copied to the Slot
	prev, next   *waiter
	cprev, cnext *waiter // in its priority class (lane.classes)
}

// New validates c (see Validate) and returns a Pool.
func New(c Config) (*Pool, error) {
	if err := Validate(c); err != nil {
		return nil, err
	}
	p := &Pool{size: c.Size, shared: c.shared(), free: c.Size, lanes: make([]lane, len(c.Lanes))}
	for i, lc := range c.Lanes {
		p.lanes[i] = lane{cfg: lc, cap: c.Reachable(i)}
		if lc.MaxTagShare > 0 {
			p.lanes[i].tags, p.lanes[i].slotTags = make(map[string]int), make(map[int32]string)
		}
	}
	return p, nil
}

// Acquire waits for a slot for lane i as an untagged caller of priority 0: AcquireAs(ctx, i,
// Caller{}).
func (p *Pool) Acquire(ctx context.Context, i int) (Slot, error) {
	return p.AcquireAs(ctx, i, Caller{})
}

// AcquireAs waits for a slot for lane i on behalf of c. It returns when a slot is granted, when the lane's
// AcquireTimeout runs out (ErrAcquireTimeout), when ctx ends (the error wraps ctx.Err(), so
// errors.Is(err, context.DeadlineExceeded) holds), at once when the lane's queue is full
// (ErrLaneFull), or when the pool is closed (ErrClosed). Every error is an *AcquireError, but
// for an i that names no lane (ErrNoLane).
// A caller whose ctx is already done never gets a slot. A cancelled or timed-out caller leaves the
// queue at once; if it was granted a slot at the same instant, the slot is given back.
// c's priority and tag decide its place among the lane's waiters (see order.go), and whether it
// may take the lane's PriorityHeadroom (not with a negative priority); never whether the lane
// may take a slot, so no priority takes a lane past its cap or into another lane's reserve.
func (p *Pool) AcquireAs(ctx context.Context, i int, c Caller) (Slot, error) {
	if uint(i) >= uint(len(p.lanes)) {
		return Slot{}, p.noLane("AcquireAs", i)
	}
	done := ctx.Done()
	p.mu.Lock()
	select {
	case <-done:
		err := p.errorLocked(i, 0, ctx.Err())
		p.mu.Unlock()
		return Slot{}, err
	default:
	}
	// admitLocked's common case, inline: a slot the caller may take and nobody waiting.
	if l := &p.lanes[i]; l.waitHead == nil && !p.closed && p.mayTakeLocked(i) && (c.Priority >= 0 || !p.headroomLocked(i)) {
		s := p.takeLocked(i)
		if l.tags != nil {
			p.tagLocked(s, c.Tag)
		}
		p.mu.Unlock()
		return s, nil
	}
	s, w, err := p.admitLocked(i, c)
	if w == nil {
		p.mu.Unlock()
		return s, err
	}
	ready, since := w.ready, w.since
	p.mu.Unlock()

	select {
	case s, ok := <-ready:
		if ok && s != expired {
			return s, nil
		}
		// Closed, or failed by the lane's timer (expiry.go): the node is already gone.
		reason := ErrClosed
		if ok {
			reason = ErrAcquireTimeout
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return Slot{}, p.errorLocked(i, time.Since(since), reason)
	case <-done:
		return p.abandon(w, ready, i, since, ctx.Err())
	}
}

// admitLocked admits caller c to lane i: a slot if it may take one now, else its queue node (w
// not nil), else the error (closed, queue full). Caller must hold p.mu.
func (p *Pool) admitLocked(i int, c Caller) (s Slot, w *waiter, err error) {
	l := &p.lanes[i]
	if p.closed {
		return Slot{}, nil, p.errorLocked(i, 0, ErrClosed)
	}
	if l.waitHead == nil && p.mayTakeLocked(i) && (c.Priority >= 0 || !p.headroomLocked(i)) {
		s := p.takeLocked(i)
		if l.tags != nil {
			p.tagLocked(s, c.Tag)
		}
		return s, nil, nil
	}
	if l.cfg.MaxWaiters > 0 && l.waiting >= l.cfg.MaxWaiters {
		return Slot{}, nil, p.errorLocked(i, 0, ErrLaneFull)
	}
	w = p.enqueueLocked(i, c)
	if l.cfg.PriorityHeadroom > 0 && p.mayTakeLocked(i) {
		// The lane had waiters and a slot it may take: they were held off the headroom (nothing
		// else leaves a slot free while a waiter waits). The new caller may take it if its
		// priority is 0 or more, or one of them may have aged since: the order decides.
		ready := w.ready
		p.grantLocked()
		select {
		case s := <-ready:
			s.lf &^= slotWaited // it did not wait
			return s, nil, nil
		default:
		}
	}
	return Slot{}, w, nil
}

// TryAcquire takes a slot for lane i, untagged, if it can do so without waiting.
func (p *Pool) TryAcquire(i int) (Slot, bool) { return p.TryAcquireAs(i, "") }

// TryAcquireAs takes a slot for lane i, for tag, at priority 0, if it can do so without waiting:
// never ahead of a waiter, but of waiters of negative priority held off the lane's
// PriorityHeadroom. An i that names no lane gets none.
func (p *Pool) TryAcquireAs(i int, tag string) (Slot, bool) {
	if uint(i) >= uint(len(p.lanes)) {
		return Slot{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.lanes[i]
	var now time.Time
	if p.closed || !p.mayTakeLocked(i) || l.waitHead != nil && !p.heldOffLocked(i, &now) {
		return Slot{}, false
	}
	s := p.takeLocked(i)
	if l.tags != nil {
		p.tagLocked(s, tag)
	}
	return s, true
}

// abandon ends the wait on lane i, begun at since, of a caller that gave up with reason; w and
// ready are its node and channel. If the caller was granted a slot in the meantime, the slot
// goes back to the pool: the caller sees only the error.
func (p *Pool) abandon(w *waiter, ready <-chan Slot, i int, since time.Time, reason error) (Slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case s, ok := <-ready:
		// The wait ended just as the caller gave up, and w went back to p.waiters: it may
		// already serve another caller, so it is not touched. A slot goes back; a timeout at the
		// same instant leaves the caller's own reason.
		switch {
		case !ok:
			reason = ErrClosed
		case s != expired:
			p.releaseLocked(s)
		}
	default:
		// Still queued, and ours. Removing a waiter never makes another waiter eligible
		// (eligibility depends on the lane and the slots held, not on the queue), so there is
		// nobody to notify.
		p.unlinkLocked(w)
		p.freeLocked(w)
	}
	return Slot{}, p.errorLocked(i, time.Since(since), reason)
}

// Release gives s back. Releasing a slot that is not held, or releasing it twice, panics.
func (p *Pool) Release(s Slot) {
	p.mu.Lock()
	if s.p != p || s.gen == 0 || s.idx < 0 || int(s.idx) >= len(p.slots) {
		p.mu.Unlock()
		panic("reserve: Release of a Slot that Acquire did not return")
	}
	if st := p.slots[s.idx]; !st.held || st.gen != s.gen {
		p.mu.Unlock()
		panic(fmt.Sprintf("reserve: slot %d of lane %q released twice", s.idx, p.lanes[s.lane()].cfg.Name))
	}
	p.releaseLocked(s)
	p.mu.Unlock()
}

// Close wakes every waiter with ErrClosed and makes later Acquires fail. Slots held stay held
// until released; releasing them after Close is fine.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	for i := range p.lanes {
		for w := p.lanes[i].waitHead; w != nil; w = p.lanes[i].waitHead {
			p.unlinkLocked(w)
			close(w.ready)
			p.freeLocked(w)
		}
	}
}

// mayTakeLocked reports whether lane i may take a free slot now. Caller must hold p.mu.
func (p *Pool) mayTakeLocked(i int) bool {
	l := &p.lanes[i]
	if p.free == 0 || l.held >= l.cap {
		return false
	}
	if l.cfg.Bounded || l.held < l.cfg.Reserved {
		return true
	}
	return p.sharedInUse < p.shared
}

// takeLocked gives lane i a free slot. Caller must hold p.mu and have checked mayTakeLocked;
// in a lane with a tag share, it then calls tagLocked.
func (p *Pool) takeLocked(i int) Slot {
	l := &p.lanes[i]
	if !l.cfg.Bounded && l.held >= l.cfg.Reserved {
		p.sharedInUse++
	}
	l.held++
	p.free--
	var idx int32
	if n := len(p.freeSlots); n > 0 {
		idx = p.freeSlots[n-1]
		p.freeSlots = p.freeSlots[:n-1]
	} else {
		// Every entry is held: a new peak. It fits in int32 because Size does.
		idx = int32(len(p.slots))
		p.slots = append(p.slots, slotState{})
	}
	st := &p.slots[idx]
	st.gen++
	if st.gen == 0 { // wrapped: 0 marks the zero Slot
		st.gen = 1
	}
	st.held = true
	st.lane = int32(i)
	return Slot{p: p, idx: idx, gen: st.gen, lf: uint32(i)}
}

// releaseLocked frees s and hands free slots to eligible waiters. Caller must hold p.mu.
func (p *Pool) releaseLocked(s Slot) {
	st := &p.slots[s.idx]
	st.held = false
	p.freeSlots = append(p.freeSlots, s.idx)
	l := &p.lanes[st.lane]
	if l.tags != nil {
		l.untagLocked(s.idx)
	}
	if !l.cfg.Bounded && l.held > l.cfg.Reserved {
		p.sharedInUse--
	}
	l.held--
	p.free++
	p.grantLocked()
}

// grantLocked hands free slots to waiters until no waiter may take one. Among lanes whose first
// waiter may take a slot, a lane below its reserve goes first, then the lane whose oldest
// waiter arrived first. Within the lane, the slot goes to the first waiter in its service order
// (order.go): FIFO, or by priority with ageing. A lane's waiters are never served out of that
// order: letting a later one jump ahead could starve the first. Caller must hold p.mu.
func (p *Pool) grantLocked() {
	var now time.Time // read once, only if an order needs it
	for p.free > 0 {
		best := -1
		var bestBelow bool
		for i := range p.lanes {
			l := &p.lanes[i]
			if l.waitHead == nil || !p.mayTakeLocked(i) {
				continue
			}
			if p.heldOffLocked(i, &now) {
				if l.ager == nil {
					p.ageLaterLocked(i, now)
				}
				continue
			}
			below := l.held < l.cfg.Reserved
			if best < 0 || below && !bestBelow || below == bestBelow && l.waitHead.seq < p.lanes[best].waitHead.seq {
				best, bestBelow = i, below
			}
		}
		if best < 0 {
			return
		}
		l := &p.lanes[best]
		w := l.waitHead
		if l.ordered() || l.shares() {
			w = l.pickLocked(&now, l.cfg.PriorityHeadroom == 0 || !p.headroomLocked(best))
		}
		p.unlinkLocked(w)
		s := p.takeLocked(best)
		if l.tags != nil {
			p.tagLocked(s, w.tag)
		}
		s.lf |= slotWaited
		if w.aged {
			s.lf |= slotAged
		}
		if w.heldBack {
			s.lf |= slotHeldBack
		}
		w.ready <- s
		p.freeLocked(w)
	}
}

// enqueueLocked queues caller c at the end of lane i and returns its node, with a new ready
// channel. Caller must hold p.mu.
func (p *Pool) enqueueLocked(i int, c Caller) *waiter {
	w, _ := p.waiters.Get().(*waiter)
	if w == nil {
		w = new(waiter)
	}
	p.seq++
	*w = waiter{ready: make(chan Slot, 1), lane: i, seq: p.seq, since: time.Now(), prio: c.Priority, tag: c.Tag}
	l := &p.lanes[i]
	if l.ordered() {
		l.addClassLocked(w)
	}
	w.prev = l.waitTail
	if l.waitTail != nil {
		l.waitTail.next = w
	} else {
		l.waitHead = w
	}
	l.waitTail = w
	l.waiting++
	if l.cfg.AcquireTimeout > 0 && l.expiry == nil {
		p.armLocked(i)
	}
	return w
}

// freeLocked gives the node of a wait that is over back to p.waiters. Caller must hold p.mu.
func (p *Pool) freeLocked(w *waiter) {
	*w = waiter{} // drop the channel: it belongs to that one wait
	p.waiters.Put(w)
}

// unlinkLocked removes w from its lane's queue in O(1), plus a look-up among the lane's
// priorities when it orders by them. Caller must hold p.mu and w must be
// queued.
func (p *Pool) unlinkLocked(w *waiter) {
	l := &p.lanes[w.lane]
	if l.ordered() {
		l.removeClassLocked(w)
	}
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.waitHead = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.waitTail = w.prev
	}
	w.prev, w.next = nil, nil
	l.waiting--
	if l.waitHead == nil {
		if l.expiry != nil {
			p.disarmLocked(w.lane)
		}
		if l.ager != nil {
			l.ager.Stop()
			l.ager = nil
		}
	}
}
