package pgxlanes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/pgxlanes/pgxlanes/txguard"
)

// ErrBudgetExceeded: the lease (a transaction, a held connection, a query's rows) outlived its
// budget and was cancelled or terminated. Use errors.Is; the error is a *BudgetError.
var ErrBudgetExceeded = errors.New("pgxlanes: budget exceeded")

// BudgetError is returned by the calls of a lease that the guard cancelled or terminated, from
// the first call after the action on (Commit included). Err is the error of the call itself, if
// it got one from the server.
type BudgetError struct {
	Lane     Lane
	Tag      string
	Action   Action
	Budget   time.Duration
	Elapsed  time.Duration // how long the lease had been held when the guard acted
	CallSite string        // where it was acquired, when Config.CaptureCallSites is on
	Err      error
}

func (e *BudgetError) Error() string {
	verb := "cancelled"
	if e.Action == ActionTerminate {
		verb = "terminated"
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

// over returns the lease's budget error if the guard acted on it, else nil. Wrappers call it
// before running anything on the lease.
func (l *lease) over() error {
	if v := l.violation.Load(); v != nil {
		return v
	}
	return nil
}

// wrap turns a call's error into a BudgetError when the guard acted on the lease.
func (l *lease) wrap(err error) error {
	if err == nil {
		return nil
	}
	if v := l.violation.Load(); v != nil {
		e := *v
		e.Err = err
		return &e
	}
	return err
}

// Act carries out the guard's decision; it implements txguard.Owner. It holds l.mu throughout a
// cancel or terminate, so the owner's release waits for it and never hands the connection to
// someone else while the guard still acts on it. The report (log, observers, OnViolation) comes
// after, outside the lock.
func (l *lease) Act(a Action, elapsed time.Duration) {
	v, err, acted := l.act(a, elapsed)
	if acted {
		l.p.reportViolation(v, err)
	}
}

func (l *lease) act(a Action, elapsed time.Duration) (Violation, error, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != leaseActive {
		return Violation{}, nil, false
	}
	if a == ActionTerminate && l.p.config.TransactionPooler {
		// Behind a transaction pooler the PID is the pooler's, not the server's: the cancel
		// ladder's last step cancels again instead.
		a = ActionCancel
	}
	v := Violation{Lane: l.lane, Tag: l.tag, Action: a, PID: l.pid, Budget: l.guard.Budget, Elapsed: elapsed,
		Warning: a == ActionFlag && l.guard.Action != ActionFlag, CallSite: l.callSite.String()}
	var err error
	switch a {
	case ActionFlag:
		l.flagged.Store(true)
	case ActionCancel:
		l.violation.Store(l.budgetError(a, elapsed, v.CallSite))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = l.conn.PgConn().CancelRequest(ctx)
		cancel()
		l.cancelledAt = time.Now()
		// If the server does not answer the cancel (frozen, or the network is gone), the socket
		// times out after CancelGrace and the connection is destroyed. net.Conn allows this
		// call while the owner reads; release and hijack take the deadline back.
		_ = l.conn.PgConn().Conn().SetDeadline(l.cancelledAt.Add(l.p.config.CancelGrace))
	case ActionTerminate:
		l.violation.Store(l.budgetError(a, elapsed, v.CallSite))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = l.p.term.Terminate(ctx, l.pid)
		cancel()
		if err == nil {
			// The backend is gone, and its locks with it: free the slot now, not when the
			// application gets round to Rollback, and close the socket (net.Conn allows it
			// while the owner reads) so that a lease never returned holds no descriptor.
			l.pc.Hijack()
			l.p.open.Add(-1)
			_ = l.conn.PgConn().Conn().Close()
			l.state = leaseTerminated
			l.finish()
		}
	}
	return v, err, true
}

func (l *lease) budgetError(a Action, elapsed time.Duration, callSite string) *BudgetError {
	return &BudgetError{Lane: l.lane, Tag: l.tag, Action: a, Budget: l.guard.Budget, Elapsed: elapsed, CallSite: callSite}
}

// reportViolation logs v and tells the observers and OnViolation. err is the action's own failure.
func (p *Pool) reportViolation(v Violation, err error) {
	attrs := []slog.Attr{
		slog.String("lane", v.Lane.String()), slog.String("tag", v.Tag), slog.String("action", v.Action.String()),
		slog.Uint64("pid", uint64(v.PID)), slog.Duration("elapsed", v.Elapsed), slog.Duration("budget", v.Budget),
	}
	if v.CallSite != "" {
		attrs = append(attrs, slog.String("call_site", v.CallSite))
	}
	msg := "pgxlanes: lease over budget"
	switch {
	case err != nil:
		attrs = append(attrs, slog.String("error", err.Error()))
		p.logger.LogAttrs(context.Background(), slog.LevelError, "pgxlanes: over-budget action failed", attrs...)
	case v.Warning:
		p.logger.LogAttrs(context.Background(), slog.LevelWarn, "pgxlanes: lease past half its budget", attrs...)
	default:
		p.logger.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
	}
	if err != nil {
		return
	}
	if obs := p.observers.Load(); obs != nil {
		for _, x := range *obs {
			if vo, ok := x.o.(ViolationObserver); ok {
				vo.ObserveViolation(v)
			}
		}
	}
	if p.config.OnViolation != nil {
		p.config.OnViolation(v)
	}
}

// logReturned logs, for a lease that was flagged, that it was finally returned and after how long.
func (l *lease) logReturned() {
	if !l.flagged.Load() {
		return
	}
	attrs := []slog.Attr{slog.String("lane", l.lane.String()), slog.String("tag", l.tag), slog.Uint64("pid", uint64(l.pid)),
		slog.Duration("held", time.Since(l.acquired)), slog.Duration("budget", l.guard.Budget)}
	if cs := l.callSite.String(); cs != "" {
		attrs = append(attrs, slog.String("call_site", cs))
	}
	l.p.logger.LogAttrs(context.Background(), slog.LevelInfo, "pgxlanes: flagged lease returned", attrs...)
}

// backstop is how long after BEGIN the server itself should end a transaction whose lease has
// budget b and action a: just beyond the guard's last step. 0 for none: flag never ends work, and
// PostgreSQL's timeouts stop at 2^31-1 ms (about 24.8 days), beyond which there is no backstop.
func backstop(b time.Duration, a Action) time.Duration {
	if b <= 0 || a == ActionFlag {
		return 0
	}
	last := (&txguard.Lease{Budget: b, Action: a}).LastStep()
	d := last + max(time.Second, b/10)
	if d < last || d > maxPGTimeout {
		return 0
	}
	return d
}

// maxPGTimeout is the largest value PostgreSQL accepts for its timeout settings (INT_MAX ms).
const maxPGTimeout = math.MaxInt32 * time.Millisecond
