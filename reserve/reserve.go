// Package reserve decides which caller may take one of a fixed number of slots.
//
// A Pool has Size slots shared by named lanes. Each lane has
//
//   - Reserved: slots that no other lane's unbounded work may ever occupy;
//   - MaxConns: a cap on the slots the lane holds at once;
//   - Bounded: whether its holders release within a known time (a short query under a
//     statement timeout) or not (a transaction, a report);
//   - MaxWaiters and AcquireTimeout: a bounded wait queue and a bounded wait.
//
// The slots that no lane reserves, Size - sum(Reserved), are shared.
//
// # Admission rule
//
// A lane may take a free slot when it is below its cap and
//
//   - it is bounded: any free slot, including another lane's idle reserved slots (borrowing);
//   - it is unbounded and below its own reserve: the slot comes out of its reserve;
//   - it is unbounded and at or above its reserve: only while the unbounded lanes together hold
//     fewer than the shared slots beyond their reserves.
//
// # The invariant
//
// Let U be the slots held by unbounded lanes. The rule keeps
//
//	U ≤ Σ Reserved(unbounded lanes) + Shared = Size − Σ Reserved(bounded lanes)
//
// because an unbounded lane below its reserve stays inside that reserve, and one above it counts
// against Shared, which the unbounded lanes never exceed together. Hence at every instant at least
// Σ Reserved(bounded lanes) slots are free or held by bounded work: a bounded (short) caller only
// ever waits behind bounded work, whose hold time is bounded. Likewise no unbounded lane ever holds
// a slot of another unbounded lane's reserve. Borrowing is safe because only bounded work borrows:
// a lane whose reserve was borrowed gets it back within one bounded hold time, and it is served
// first when it does (see below).
//
// # Who gets a released slot
//
// A released slot goes, among the lanes whose first waiter may take it, to a lane below its
// reserve first, then to the waiter that arrived first. Within a lane waiters are served strictly
// FIFO: a later waiter never overtakes an earlier one of the same lane, so no waiter starves
// while slots keep being released. The pool is work-conserving: a slot is never left free while a
// waiter that may take it waits. A new caller never overtakes a waiter of its own lane.
//
// # Cost
//
// An acquire that does not wait takes one mutex and allocates nothing. A waiter costs one small
// allocation and one channel; cancelling it unlinks it from a doubly linked list, so its cost does
// not depend on how many others wait. There is no background goroutine.
//
// # Releasing
//
// Acquire returns a Slot value that names the slot and its generation. Releasing a Slot that is
// not held, or releasing it twice, is a bug in the caller and panics, as x/sync/semaphore does on
// over-release; the generation makes even a late double release of a slot that was since taken by
// someone else detectable.
package reserve

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Sentinel errors, to be checked with errors.Is. Acquire wraps them in an *AcquireError.
var (
	// ErrAcquireTimeout: the lane's AcquireTimeout ran out before a slot was granted.
	ErrAcquireTimeout = errors.New("reserve: acquire timed out")
	// ErrLaneFull: the lane already had MaxWaiters callers waiting; the caller was refused at once.
	ErrLaneFull = errors.New("reserve: lane wait queue full")
	// ErrClosed: the pool was closed before a slot was granted.
	ErrClosed = errors.New("reserve: pool closed")
)

// LaneConfig configures one lane.
type LaneConfig struct {
	// Name identifies the lane in errors and Stat. It must be unique and not empty.
	Name string
	// Reserved is the number of slots that no other lane's unbounded work may take.
	Reserved int
	// MaxConns caps the slots the lane holds at once. 0 means Pool.Size.
	MaxConns int
	// MaxWaiters bounds the lane's wait queue. A caller that would exceed it fails at once with
	// ErrLaneFull. 0 means unlimited.
	MaxWaiters int
	// Bounded says the lane's holders release within a known time. Only bounded lanes may borrow
	// free slots beyond their reserve and the shared slots.
	Bounded bool
	// AcquireTimeout bounds how long a caller waits for a slot. 0 means it waits until its ctx ends.
	AcquireTimeout time.Duration
}

// Config configures a Pool.
type Config struct {
	// Size is the total number of slots.
	Size int
	// Lanes are the lanes; Acquire refers to a lane by its index in this slice.
	Lanes []LaneConfig
}

// Slot is a granted slot. Its zero value is not a slot.
type Slot struct {
	idx  int32
	gen  uint32
	lane int32
}

// Lane returns the index of the lane that holds s.
func (s Slot) Lane() int { return int(s.lane) }

// Valid reports whether s was returned by a successful Acquire (it may since have been released).
func (s Slot) Valid() bool { return s.gen != 0 }

// Pool hands out slots to lanes. It is safe for concurrent use.
type Pool struct {
	size   int
	shared int // size - sum(Reserved)

	mu sync.Mutex
	// All fields below are guarded by mu.
	free          int
	sharedInUse   int // Σ max(0, held-Reserved) over unbounded lanes; never exceeds shared
	seq           uint64
	closed        bool
	lanes         []lane
	slots         []slotState
	freeSlots     []int32 // stack of free slot indexes
	laneNameToIdx map[string]int
}

type slotState struct {
	gen  uint32
	lane int32
	held bool
}

type lane struct {
	cfg      LaneConfig
	cap      int
	held     int
	waitHead *waiter
	waitTail *waiter
	waiting  int

	acquires      int64
	emptyAcquires int64
	acquireWait   time.Duration
	timeouts      int64
	rejections    int64
	cancels       int64
}

// waiter is one queued caller. When it is granted a slot or the pool closes, slot or err is
// written and then a token is sent on ready (buffered, so the sender never blocks). Exactly one
// token is sent per wait and the waiter takes it, in Acquire or in abandon, so a waiter whose wait
// is over holds no token, is linked nowhere, and is put back in waiterPool with its channel and
// timer for the next wait: a waiting acquire allocates nothing in the steady state.
type waiter struct {
	ready      chan struct{}
	timer      *time.Timer // the acquire timeout, created on first use and reused
	slot       Slot
	err        error
	lane       int
	seq        uint64
	since      time.Time
	waited     time.Duration // set by the grant
	prev, next *waiter
	queued     bool // guarded by Pool.mu
}

// New validates cfg and returns a Pool. The error names the lane and field at fault.
func New(cfg Config) (*Pool, error) {
	if cfg.Size <= 0 {
		return nil, fmt.Errorf("reserve: Size must be at least 1, got %d", cfg.Size)
	}
	if len(cfg.Lanes) == 0 {
		return nil, errors.New("reserve: at least one lane is required")
	}
	p := &Pool{
		size:          cfg.Size,
		free:          cfg.Size,
		lanes:         make([]lane, len(cfg.Lanes)),
		slots:         make([]slotState, cfg.Size),
		freeSlots:     make([]int32, cfg.Size),
		laneNameToIdx: make(map[string]int, len(cfg.Lanes)),
	}
	reserved := 0
	for i, lc := range cfg.Lanes {
		if lc.Name == "" {
			return nil, fmt.Errorf("reserve: lane %d: Name must not be empty", i)
		}
		if _, dup := p.laneNameToIdx[lc.Name]; dup {
			return nil, fmt.Errorf("reserve: lane %q: duplicate Name", lc.Name)
		}
		p.laneNameToIdx[lc.Name] = i
		switch {
		case lc.Reserved < 0:
			return nil, fmt.Errorf("reserve: lane %q: Reserved must not be negative, got %d", lc.Name, lc.Reserved)
		case lc.MaxConns < 0:
			return nil, fmt.Errorf("reserve: lane %q: MaxConns must not be negative, got %d", lc.Name, lc.MaxConns)
		case lc.MaxWaiters < 0:
			return nil, fmt.Errorf("reserve: lane %q: MaxWaiters must not be negative, got %d", lc.Name, lc.MaxWaiters)
		case lc.AcquireTimeout < 0:
			return nil, fmt.Errorf("reserve: lane %q: AcquireTimeout must not be negative, got %v", lc.Name, lc.AcquireTimeout)
		case lc.MaxConns > cfg.Size:
			return nil, fmt.Errorf("reserve: lane %q: MaxConns %d exceeds Size %d", lc.Name, lc.MaxConns, cfg.Size)
		}
		c := lc.MaxConns
		if c == 0 {
			c = cfg.Size
		}
		if lc.Reserved > c {
			return nil, fmt.Errorf("reserve: lane %q: Reserved %d exceeds MaxConns %d", lc.Name, lc.Reserved, c)
		}
		reserved += lc.Reserved
		p.lanes[i] = lane{cfg: lc, cap: c}
	}
	if reserved > cfg.Size {
		return nil, fmt.Errorf("reserve: lanes reserve %d slots in all, more than Size %d", reserved, cfg.Size)
	}
	p.shared = cfg.Size - reserved
	for i, l := range p.lanes {
		if !l.cfg.Bounded && l.cfg.Reserved == 0 && p.shared == 0 {
			return nil, fmt.Errorf("reserve: lane %q: unbounded lane with Reserved 0 and no shared slots could never acquire", cfg.Lanes[i].Name)
		}
	}
	for i := range p.freeSlots {
		p.freeSlots[i] = int32(cfg.Size - 1 - i)
	}
	return p, nil
}

// Size returns the total number of slots.
func (p *Pool) Size() int { return p.size }

// Lanes returns the number of lanes.
func (p *Pool) Lanes() int { return len(p.lanes) }

// LaneIndex returns the index of the lane called name.
func (p *Pool) LaneIndex(name string) (int, bool) {
	i, ok := p.laneNameToIdx[name]
	return i, ok
}

// LaneConfig returns the configuration of lane i, with MaxConns resolved.
func (p *Pool) LaneConfig(i int) LaneConfig {
	c := p.lanes[i].cfg
	c.MaxConns = p.lanes[i].cap
	return c
}

// Acquire waits for a slot for lane i. It returns when a slot is granted, when the lane's
// AcquireTimeout runs out (ErrAcquireTimeout), when ctx ends (the error wraps ctx.Err(), so
// errors.Is(err, context.DeadlineExceeded) holds), at once when the lane's queue is full
// (ErrLaneFull), or when the pool is closed (ErrClosed). Every error is an *AcquireError.
// A caller whose ctx is already done never gets a slot. A cancelled or timed-out caller leaves the
// queue at once; if it was granted a slot at the same instant, the slot is given back.
func (p *Pool) Acquire(ctx context.Context, i int) (Slot, error) {
	done := ctx.Done()
	p.mu.Lock()
	l := &p.lanes[i]
	select {
	case <-done:
		l.cancels++
		err := p.errorLocked(i, 0, ctx.Err())
		p.mu.Unlock()
		return Slot{}, err
	default:
	}
	if p.closed {
		err := p.errorLocked(i, 0, ErrClosed)
		p.mu.Unlock()
		return Slot{}, err
	}
	if l.waitHead == nil && p.mayTakeLocked(i) {
		s := p.takeLocked(i)
		l.acquires++
		p.mu.Unlock()
		return s, nil
	}
	if l.cfg.MaxWaiters > 0 && l.waiting >= l.cfg.MaxWaiters {
		l.rejections++
		err := p.errorLocked(i, 0, ErrLaneFull)
		p.mu.Unlock()
		return Slot{}, err
	}
	w := newWaiter(i)
	p.enqueueLocked(w)
	timeout := l.cfg.AcquireTimeout
	p.mu.Unlock()
	defer w.recycle()

	var expired <-chan time.Time
	if timeout > 0 {
		if w.timer == nil {
			w.timer = time.NewTimer(timeout)
		} else {
			w.timer.Reset(timeout)
		}
		expired = w.timer.C
	}
	select {
	case <-w.ready:
		if w.err != nil {
			return Slot{}, w.err
		}
		return w.slot, nil
	case <-done:
		return p.abandon(w, ctx.Err())
	case <-expired:
		return p.abandon(w, ErrAcquireTimeout)
	}
}

var waiterPool = sync.Pool{New: func() any { return &waiter{ready: make(chan struct{}, 1)} }}

// newWaiter returns a waiter for lane i, reused from earlier waits when possible.
func newWaiter(i int) *waiter {
	w := waiterPool.Get().(*waiter)
	w.lane, w.since = i, time.Now()
	return w
}

// recycle returns w to waiterPool once its wait is over: it is unlinked and its token taken.
// Since Go 1.23 Stop alone guarantees that no stale value is received from the timer; the drain
// keeps that true for a program that turns the old semantics back on (GODEBUG=asynctimerchan=1).
func (w *waiter) recycle() {
	if w.timer != nil && !w.timer.Stop() {
		select {
		case <-w.timer.C:
		default:
		}
	}
	w.slot, w.err, w.waited, w.seq = Slot{}, nil, 0, 0
	waiterPool.Put(w)
}

// TryAcquire takes a slot for lane i if it can do so without waiting.
func (p *Pool) TryAcquire(i int) (Slot, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.lanes[i]
	if p.closed || l.waitHead != nil || !p.mayTakeLocked(i) {
		return Slot{}, false
	}
	l.acquires++
	return p.takeLocked(i), true
}

// abandon removes a waiter that gave up with reason. If the waiter was granted a slot in the
// meantime, the slot goes back to the pool: the caller sees only the error.
func (p *Pool) abandon(w *waiter, reason error) (Slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-w.ready:
		if w.err != nil { // closed in the meantime
			return Slot{}, w.err
		}
		// Granted just as we gave up: the grant counted an acquire, so undo it and pass the slot on.
		l := &p.lanes[w.lane]
		l.acquires--
		l.emptyAcquires--
		l.acquireWait -= w.waited
		p.releaseLocked(w.slot)
	default:
		// Still queued. Removing a waiter never makes another waiter eligible (eligibility depends
		// on the slots held, not on the queue), so there is nobody to notify.
		p.unlinkLocked(w)
	}
	l := &p.lanes[w.lane]
	if errors.Is(reason, ErrAcquireTimeout) {
		l.timeouts++
	} else {
		l.cancels++
	}
	return Slot{}, p.errorLocked(w.lane, time.Since(w.since), reason)
}

// Release gives s back. Releasing a slot that is not held, or releasing it twice, panics.
func (p *Pool) Release(s Slot) {
	p.mu.Lock()
	if s.idx < 0 || int(s.idx) >= len(p.slots) || s.gen == 0 {
		p.mu.Unlock()
		panic("reserve: Release of an invalid Slot")
	}
	st := p.slots[s.idx]
	if !st.held || st.gen != s.gen {
		p.mu.Unlock()
		panic(fmt.Sprintf("reserve: slot %d of lane %q released twice", s.idx, p.lanes[s.lane].cfg.Name))
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
			w.err = p.errorLocked(i, time.Since(w.since), ErrClosed)
			w.ready <- struct{}{}
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

// takeLocked gives lane i a free slot. Caller must hold p.mu and have checked mayTakeLocked.
func (p *Pool) takeLocked(i int) Slot {
	l := &p.lanes[i]
	if !l.cfg.Bounded && l.held >= l.cfg.Reserved {
		p.sharedInUse++
	}
	l.held++
	p.free--
	idx := p.freeSlots[len(p.freeSlots)-1]
	p.freeSlots = p.freeSlots[:len(p.freeSlots)-1]
	st := &p.slots[idx]
	st.gen++
	if st.gen == 0 { // wrapped: 0 marks the zero Slot
		st.gen = 1
	}
	st.held = true
	st.lane = int32(i)
	return Slot{idx: idx, gen: st.gen, lane: int32(i)}
}

// releaseLocked frees s and hands free slots to eligible waiters. Caller must hold p.mu.
func (p *Pool) releaseLocked(s Slot) {
	st := &p.slots[s.idx]
	st.held = false
	p.freeSlots = append(p.freeSlots, s.idx)
	l := &p.lanes[st.lane]
	if !l.cfg.Bounded && l.held > l.cfg.Reserved {
		p.sharedInUse--
	}
	l.held--
	p.free++
	p.grantLocked()
}

// grantLocked hands free slots to waiters until no waiter may take one. Among lanes whose first
// waiter may take a slot, a lane below its reserve goes first, then the earliest arrival. Caller
// must hold p.mu.
func (p *Pool) grantLocked() {
	for p.free > 0 {
		best := -1
		var bestBelow bool
		for i := range p.lanes {
			l := &p.lanes[i]
			if l.waitHead == nil || !p.mayTakeLocked(i) {
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
		p.unlinkLocked(w)
		w.slot = p.takeLocked(best)
		l.acquires++
		l.emptyAcquires++
		w.waited = time.Since(w.since)
		l.acquireWait += w.waited
		w.ready <- struct{}{}
	}
}

// enqueueLocked appends w to its lane's queue. Caller must hold p.mu.
func (p *Pool) enqueueLocked(w *waiter) {
	l := &p.lanes[w.lane]
	p.seq++
	w.seq = p.seq
	w.queued = true
	w.prev = l.waitTail
	if l.waitTail != nil {
		l.waitTail.next = w
	} else {
		l.waitHead = w
	}
	l.waitTail = w
	l.waiting++
}

// unlinkLocked removes w from its lane's queue in O(1). Caller must hold p.mu.
func (p *Pool) unlinkLocked(w *waiter) {
	if !w.queued {
		return
	}
	l := &p.lanes[w.lane]
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
	w.prev, w.next, w.queued = nil, nil, false
	l.waiting--
}
