package reserve

import (
	"errors"
	"fmt"
	"time"
)

// AcquireError is the error returned by a failed Acquire. It carries the lane's figures at the
// moment of failure, so that the message alone says why: "reserve: short lane: acquire timed out
// after 1s (in use 4/4, waiting 12)". Err is one of the sentinels or the ctx's error; use errors.Is.
type AcquireError struct {
	Lane     string
	Waited   time.Duration
	InUse    int // slots the lane held
	MaxConns int // the lane's cap
	Waiting  int // callers queued on the lane, not counting this one
	Err      error
}

func (e *AcquireError) Error() string { return "reserve: " + e.Detail() }

// Detail is the message without the package prefix, for wrappers that use their own prefix.
func (e *AcquireError) Detail() string {
	var what string
	switch {
	case errors.Is(e.Err, ErrAcquireTimeout):
		what = fmt.Sprintf("acquire timed out after %v", e.Waited)
	case errors.Is(e.Err, ErrLaneFull):
		what = "wait queue full, caller refused"
	case errors.Is(e.Err, ErrClosed):
		what = "pool closed"
	default:
		what = fmt.Sprintf("acquire gave up after %v: %v", e.Waited, e.Err)
	}
	return fmt.Sprintf("%s lane: %s (in use %d/%d, waiting %d)", e.Lane, what, e.InUse, e.MaxConns, e.Waiting)
}

func (e *AcquireError) Unwrap() error { return e.Err }

// errorLocked builds the error for a failed acquire on lane i. Caller must hold p.mu.
func (p *Pool) errorLocked(i int, waited time.Duration, err error) *AcquireError {
	l := &p.lanes[i]
	return &AcquireError{Lane: l.cfg.Name, Waited: waited, InUse: l.held, MaxConns: l.cap, Waiting: l.waiting, Err: err}
}

// LaneStat is a snapshot of one lane.
type LaneStat struct {
	Name       string
	Bounded    bool
	Reserved   int
	MaxConns   int
	MaxWaiters int
	// InUse is the number of slots the lane holds; Borrowed is how many of them lie beyond its
	// reserve (shared slots or, for a bounded lane, other lanes' idle reserve).
	InUse    int
	Borrowed int
	// Waiting is the number of queued callers; OldestWait is how long the first of them has waited.
	Waiting    int
	OldestWait time.Duration

	// Cumulative counters.
	Acquires      int64         // successful acquires
	EmptyAcquires int64         // successful acquires that had to wait
	AcquireWait   time.Duration // total wait of successful acquires
	Timeouts      int64         // acquires that ended with ErrAcquireTimeout
	Rejections    int64         // acquires refused with ErrLaneFull
	Cancels       int64         // acquires that ended because their ctx ended
}

// Stat is a snapshot of the pool taken under its lock.
type Stat struct {
	Size   int
	Free   int
	Shared int // slots no lane reserves
	Lanes  []LaneStat
}

// Stat returns a consistent snapshot of all lanes.
func (p *Pool) Stat() Stat {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stat{Size: p.size, Free: p.free, Shared: p.shared, Lanes: make([]LaneStat, len(p.lanes))}
	for i := range p.lanes {
		s.Lanes[i] = p.laneStatLocked(i, now)
	}
	return s
}

// LaneStat returns a snapshot of lane i without allocating.
func (p *Pool) LaneStat(i int) LaneStat {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.laneStatLocked(i, now)
}

func (p *Pool) laneStatLocked(i int, now time.Time) LaneStat {
	l := &p.lanes[i]
	ls := LaneStat{
		Name: l.cfg.Name, Bounded: l.cfg.Bounded, Reserved: l.cfg.Reserved, MaxConns: l.cap,
		MaxWaiters: l.cfg.MaxWaiters, InUse: l.held, Borrowed: max(0, l.held-l.cfg.Reserved),
		Waiting: l.waiting, Acquires: l.acquires, EmptyAcquires: l.emptyAcquires,
		AcquireWait: l.acquireWait, Timeouts: l.timeouts, Rejections: l.rejections, Cancels: l.cancels,
	}
	if l.waitHead != nil {
		ls.OldestWait = now.Sub(l.waitHead.since)
	}
	return ls
}
