package pgxlanes

import (
	"fmt"
	"time"
)

// Action is what the pool does when a lease (a transaction, a held connection, a query's open
// rows) exceeds its lane's budget. See LaneConfig.OverBudget for the escalation ladder. The zero
// value means the lane's default.
type Action uint8

const (
	// ActionFlag logs a warning with the lease's lane, tag, backend PID, elapsed time and call
	// site, and an info line when the lease is finally returned. The work goes on.
	ActionFlag Action = iota + 1
	// ActionCancel cancels the running statement: the caller gets control back at once, the
	// transaction is aborted and the lease's next call fails with ErrBudgetExceeded. The
	// connection survives.
	ActionCancel
	// ActionTerminate ends the server session (pg_terminate_backend over the pool's guard
	// session), so the server rolls back and drops the locks at once, and gives the slot back to
	// its lane. It is reported as done only once the backend is verified gone.
	ActionTerminate
)

// String returns "flag", "cancel" or "terminate".
func (a Action) String() string {
	switch a {
	case ActionFlag:
		return "flag"
	case ActionCancel:
		return "cancel"
	case ActionTerminate:
		return "terminate"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction returns the action called name ("flag", "cancel" or "terminate").
func ParseAction(name string) (Action, error) {
	for _, a := range []Action{ActionFlag, ActionCancel, ActionTerminate} {
		if a.String() == name {
			return a, nil
		}
	}
	return 0, fmt.Errorf("pgxlanes: unknown over-budget action %q (actions are flag, cancel, terminate)", name)
}

// Violation describes one lease that exceeded its budget and what was done about it. It is a
// struct so that fields can be added later.
type Violation struct {
	Lane    Lane
	Tag     string
	Action  Action
	PID     uint32        // the backend PID the server gave at connect; behind PgBouncer, PgBouncer's key
	Budget  time.Duration // the budget that was exceeded
	Elapsed time.Duration // how long the lease had been held when the action was taken
	// Warning is true for the early warning at half the budget (cancel and terminate lanes): the
	// lease is not over its budget yet and nothing was done to it. Action is then ActionFlag.
	Warning bool
	// OverBudget is the lane's action for the lease past its budget: what a warning announces.
	OverBudget Action
	// CallSite is where the lease was acquired ("file.go:123 pkg.Func"), when stack capture is on;
	// "" otherwise.
	CallSite string
	// Err is non-nil when the action failed: a terminate whose backend could not be verified
	// gone. The pool then closed its own socket to the session instead, which frees the slot; the
	// server ends the session when it notices, or at the idle-in-transaction backstop.
	Err error
}

// ViolationObserver is an optional interface of an Observer: an Observer that implements it also
// receives every budget warning and violation, including failed actions.
type ViolationObserver interface {
	ObserveViolation(Violation)
}
