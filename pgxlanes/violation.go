package pgxlanes

import (
	"fmt"
	"time"

	"github.com/pgxlanes/pgxlanes/txguard"
)

// Action is what the pool does when a lease (a transaction, a held connection, a query's open
// rows) exceeds its lane's budget. See LaneConfig.OverBudget for the escalation ladder.
type Action = txguard.Action

const (
	// ActionFlag logs a warning with the lease's lane, tag, backend PID, elapsed time and call
	// site, and an info line when the lease is finally returned. The work goes on.
	ActionFlag = txguard.Flag
	// ActionCancel sends a protocol cancel request for the running statement: the transaction is
	// aborted and the application's next call fails with ErrBudgetExceeded. The connection
	// survives.
	ActionCancel = txguard.Cancel
	// ActionTerminate ends the server session (pg_terminate_backend over the guard connection),
	// so the server rolls back and drops the locks at once, and gives the slot back to its lane.
	ActionTerminate = txguard.Terminate
)

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
	PID     uint32        // the server backend's process ID
	Budget  time.Duration // the budget that was exceeded
	Elapsed time.Duration // how long the lease had been held when the action was taken
	// Warning is true for the early warning at half the budget (cancel and terminate lanes): the
	// lease is not over its budget yet and nothing was done to it. Action is then ActionFlag.
	Warning bool
	// CallSite is where the lease was acquired ("file.go:123 pkg.Func"), when stack capture is on;
	// "" otherwise.
	CallSite string
}

// ViolationObserver is an optional interface of an Observer: an Observer that implements it also
// receives every budget violation.
type ViolationObserver interface {
	ObserveViolation(Violation)
}
