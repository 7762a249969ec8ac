package txguard_test

import (
	"fmt"
	"time"

	"github.com/pgxlanes/pgxlanes/txguard"
)

// owner prints what the guard decides; a real owner cancels a statement or terminates a session.
type owner struct{ acts chan txguard.Action }

func (o owner) Act(a txguard.Action, _ time.Duration) { o.acts <- a }

// A lease with a 100 ms budget and the Cancel ladder: a warning at half the budget, a cancel at
// the budget. The owner ends the lease after the cancel, so the terminate due at twice the budget
// never comes.
func Example() {
	g := txguard.New()
	defer g.Close()

	o := owner{acts: make(chan txguard.Action, 4)}
	l := &txguard.Lease{Owner: o, Start: time.Now(), Budget: 100 * time.Millisecond, Action: txguard.Cancel}
	g.Watch(l)
	fmt.Println("at half the budget:", <-o.acts)
	fmt.Println("at the budget:", <-o.acts)
	g.Unwatch(l) // the statement was cancelled and the connection returned
	fmt.Println("last step due after", txguard.LastStep(l.Budget, l.Action))
	// Output:
	// at half the budget: flag
	// at the budget: cancel
	// last step due after 200ms
}
