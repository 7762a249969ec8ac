package pgxlanes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Use errors.Is: acquire failures are *AcquireError values that wrap one of the
// first three, budget actions *BudgetError values that wrap ErrBudgetExceeded.
var (
	// ErrAcquireTimeout: the lane's AcquireTimeout ran out before a connection was ready.
	ErrAcquireTimeout = errors.New("pgxlanes: acquire timed out")
	// ErrLaneFull: the lane's queue already held MaxWaiters callers; the caller was refused at once.
	ErrLaneFull = errors.New("pgxlanes: lane wait queue full")
	// ErrClosed: the pool is closed.
	ErrClosed = errors.New("pgxlanes: pool closed")
	// ErrBudgetExceeded: the lease (a transaction, a held connection, a query's rows) outlived its
	// budget and was cancelled or terminated.
	ErrBudgetExceeded = errors.New("pgxlanes: budget exceeded")
	// ErrReleased: a connection, transaction or rows was used after it was released (Release,
	// Commit, Rollback, Close, or Hijack). It never reaches the connection, which may already
	// serve another caller.
	ErrReleased = errors.New("pgxlanes: used after release")
)

// AcquireError is returned when a call gets no connection. It carries the lane and the lane's
// figures when it failed, so the message alone explains it:
//
//	pgxlanes: short lane: acquire timed out after 1s (in use 4/4, waiting 12)
//
// Err is ErrAcquireTimeout, ErrLaneFull, ErrClosed, the caller's ctx error (so
// errors.Is(err, context.DeadlineExceeded) holds when the caller's own deadline came first, and
// then pgconn.Timeout(err) too), or the error of opening a connection.
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
	var what string
	switch {
	case errors.Is(e.Err, ErrAcquireTimeout):
		what = fmt.Sprintf("acquire timed out after %v", e.Waited.Round(time.Millisecond))
		if errors.Is(e.Err, errNoFleetSlot) {
			what += " waiting for a fleet slot"
		}
	case errors.Is(e.Err, ErrLaneFull):
		what = "wait queue full, caller refused"
	case errors.Is(e.Err, ErrClosed):
		what = "pool closed"
	default:
		what = fmt.Sprintf("acquire gave up after %v: %v", e.Waited.Round(time.Millisecond), e.Err)
	}
	return fmt.Sprintf("pgxlanes: %s lane: %s (in use %d/%d, waiting %d)", e.Lane, what, e.InUse, e.MaxConns, e.Waiting)
}

func (e *AcquireError) Unwrap() error { return e.Err }

// As makes pgconn.Timeout(err) hold when the caller's deadline ended the wait, as it holds for
// the error of a statement a deadline interrupted: callers that classify timeouts with pgx's
// predicate need not know where the deadline caught the call.
func (e *AcquireError) As(target any) bool {
	if !errors.Is(e.Err, context.DeadlineExceeded) {
		return false
	}
	return asTimeout(target)
}

// BudgetError is returned by the calls of a lease that the guard cancelled or terminated, from
// the call it interrupted (if one was running) on, Commit included. Err is the error of the call
// itself, if it got one from the server.
type BudgetError struct {
	Lane     Lane
	Tag      string
	Action   Action
	Budget   time.Duration
	Elapsed  time.Duration // how long the lease had been held when the guard acted
	CallSite string        // where it was acquired, when Config.CaptureCallSites is on
	// Failed is the error of a terminate that could not be verified: the pool closed its socket
	// to the session instead.
	Failed error
	Err    error
}

func (e *BudgetError) Error() string {
	verb := "cancelled"
	if e.Action == ActionTerminate {
		verb = "terminated"
		if e.Failed != nil {
			verb = "closed (terminate failed: " + e.Failed.Error() + ")"
		}
	}
	s := fmt.Sprintf("pgxlanes: %s lane: %s after %v, over its budget of %v", e.Lane, verb, e.Elapsed.Round(time.Millisecond), e.Budget)
	if e.Tag != "" {
		s += " (tag " + e.Tag + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *BudgetError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrBudgetExceeded, e.Err}
	}
	return []error{ErrBudgetExceeded}
}

// with returns a copy of e with Err set to err.
func (e *BudgetError) with(err error) *BudgetError {
	c := *e
	c.Err = err
	return &c
}

// interruptedError is returned by a call whose context ended while the server was still working
// on it. The call returns at once; the statement is cancelled and the connection cleaned in the
// background, then reused. errors.Is(err, ctx.Err()) holds, errors.As finds the *pgconn.PgError
// (57014) that pgx returned, and pgconn.Timeout(err) holds when the context's deadline passed, as
// it does for pgxpool's error (a cancelled context is not a timeout, for pgconn as here).
type interruptedError struct {
	lane  Lane
	cause error // the context's error
	err   error // pgx's error
}

func (e *interruptedError) Error() string {
	return fmt.Sprintf("pgxlanes: %s lane: %v: %v", e.lane, e.cause, e.err)
}

func (e *interruptedError) Unwrap() []error {
	if errors.Is(e.cause, context.DeadlineExceeded) {
		if t := pgconnTimeout(); t != nil {
			return []error{t, e.cause, e.err}
		}
	}
	return []error{e.cause, e.err}
}

// pgconnTimeout returns pgconn's own error for a context deadline, the one pgconn returns when a
// deadline ends a read (its type is unexported; pgconn.Timeout finds it with errors.As). It wraps
// context.DeadlineExceeded and nothing else. It is minted once, by a connection attempt that
// dials nothing: its dial waits for a context that has already expired. nil if pgconn gave none.
var pgconnTimeout = sync.OnceValue(func() error {
	cfg, err := pgconn.ParseConfig("host=127.0.0.1 port=1 user=pgxlanes sslmode=disable")
	if err != nil {
		return nil
	}
	cfg.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	cfg.DialFunc = func(ctx context.Context, network, _ string) (net.Conn, error) {
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	_, err = pgconn.ConnectConfig(ctx, cfg)
	return findTimeout(err)
})

// asTimeout sets target to pgconn's timeout error if target points to a variable of its type.
func asTimeout(target any) bool {
	t := pgconnTimeout()
	if t == nil {
		return false
	}
	v := reflect.ValueOf(target)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Type() != reflect.TypeOf(t) {
		return false
	}
	v.Elem().Set(reflect.ValueOf(t))
	return true
}

// findTimeout returns the error in err's tree that pgconn.Timeout recognises and that wraps
// context.DeadlineExceeded directly, or nil.
func findTimeout(err error) error {
	if err == nil {
		return nil
	}
	if errors.Unwrap(err) == context.DeadlineExceeded && pgconn.Timeout(err) {
		return err
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return findTimeout(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if t := findTimeout(e); t != nil {
				return t
			}
		}
	}
	return nil
}
