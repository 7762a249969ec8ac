package pgxlanes

import (
	"time"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// sentinel is an error value that also matches the reserve package's sentinel it stands for.
type sentinel struct {
	msg  string
	base error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.base }

// Sentinel errors. Use errors.Is: the errors returned are *AcquireError values that wrap them.
var (
	// ErrAcquireTimeout: the lane's AcquireTimeout ran out before a connection was ready.
	ErrAcquireTimeout error = &sentinel{"pgxlanes: acquire timed out", reserve.ErrAcquireTimeout}
	// ErrLaneFull: the lane's queue already held MaxWaiters callers; the caller was refused at once.
	ErrLaneFull error = &sentinel{"pgxlanes: lane wait queue full", reserve.ErrLaneFull}
	// ErrClosed: the pool is closed.
	ErrClosed error = &sentinel{"pgxlanes: pool closed", reserve.ErrClosed}
)

// AcquireError is returned when a call gets no connection. It carries the lane and the lane's
// figures when it failed, so the message alone explains it:
//
//	pgxlanes: short lane: acquire timed out after 1s (in use 4/4, waiting 12)
//
// Err is ErrAcquireTimeout, ErrLaneFull, ErrClosed, or the caller's ctx error (so
// errors.Is(err, context.DeadlineExceeded) holds when the caller's own deadline came first).
type AcquireError struct {
	Lane     Lane
	Tag      string
	Waited   time.Duration
	InUse    int // connections the lane held
	MaxConns int // the lane's cap
	Waiting  int // other callers queued on the lane
	Err      error
}

func (e *AcquireError) Error() string {
	re := reserve.AcquireError{Lane: e.Lane.String(), Waited: e.Waited.Round(time.Millisecond), InUse: e.InUse,
		MaxConns: e.MaxConns, Waiting: e.Waiting, Err: e.Err}
	return "pgxlanes: " + re.Detail()
}

func (e *AcquireError) Unwrap() error { return e.Err }

// fromReserve converts reserve's error into ours, mapping its sentinels to ours.
func fromReserve(l Lane, tag string, re *reserve.AcquireError) *AcquireError {
	e := &AcquireError{Lane: l, Tag: tag, Waited: re.Waited, InUse: re.InUse, MaxConns: re.MaxConns, Waiting: re.Waiting, Err: re.Err}
	switch re.Err {
	case reserve.ErrAcquireTimeout:
		e.Err = ErrAcquireTimeout
	case reserve.ErrLaneFull:
		e.Err = ErrLaneFull
	case reserve.ErrClosed:
		e.Err = ErrClosed
	}
	return e
}
