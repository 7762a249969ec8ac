package reserve

import (
	"errors"
	"fmt"
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
	// ErrNoLane: the lane index names no lane of the pool. It is not wrapped in an
	// *AcquireError, which describes a lane.
	ErrNoLane = errors.New("reserve: no such lane")
)

// noLane is the error of a call with lane index i, which names no lane of p.
func (p *Pool) noLane(fn string, i int) error {
	return fmt.Errorf("%w: %s: lane index i = %d, and the pool has %d lanes", ErrNoLane, fn, i, len(p.lanes))
}

// AcquireError is the error returned by a failed Acquire. It carries the lane's figures at the
// moment of failure, so that the message alone says why: "reserve: short lane: acquire timed out
// after 1s (in use 4/4, waiting 12)". Err is one of the sentinels or the ctx's error; use
// errors.Is.
type AcquireError struct {
	Lane     string
	Waited   time.Duration // how long the caller queued; 0 if it did not
	InUse    int           // slots the lane held
	MaxConns int           // the lane's effective cap (Config.Reachable)
	Waiting  int           // callers queued on the lane, not counting this one
	Err      error
}

func (e *AcquireError) Error() string {
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
	return fmt.Sprintf("reserve: %s lane: %s (in use %d/%d, waiting %d)", e.Lane, what, e.InUse, e.MaxConns, e.Waiting)
}

func (e *AcquireError) Unwrap() error { return e.Err }

// errorLocked builds the error for a failed acquire on lane i. Caller must hold p.mu.
func (p *Pool) errorLocked(i int, waited time.Duration, err error) *AcquireError {
	l := &p.lanes[i]
	return &AcquireError{Lane: l.cfg.Name, Waited: waited, InUse: l.held, MaxConns: l.cap, Waiting: l.waiting, Err: err}
}
