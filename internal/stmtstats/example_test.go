package stmtstats_test

import (
	"fmt"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// A lookup that waits once on a row lock stays fast; a report that overruns three times is
// demoted while its third run is still going, and promoted when it is fast again.
func Example() {
	t, err := stmtstats.New(stmtstats.Config{Threshold: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	lookup := t.Key("select name from users where id = $1")
	report := t.Key("select count(*) from orders")

	for range 100 {
		t.Done(lookup, 2*time.Millisecond, false)
	}
	fmt.Println("lookup waits 600ms on a lock:", t.Done(lookup, 600*time.Millisecond, false))
	fmt.Println("lookup demoted:", t.Demoted(lookup))

	for i := range 3 {
		// The caller's timer fired: the run is still going after 100ms.
		fmt.Printf("report run %d overran: %v\n", i+1, t.Overran(report))
	}
	fmt.Println("report demoted:", t.Demoted(report))
	for range 3 {
		t.Done(report, 1500*time.Millisecond, true) // counted already: no change
	}

	// An index was added: the report is fast now, in whatever lane it runs.
	for i := range 4 {
		if c := t.Done(report, 5*time.Millisecond, false); c != stmtstats.None {
			fmt.Printf("report fast run %d: %v\n", i+1, c)
		}
	}
	fmt.Printf("%+v\n", t.Stat())
	// Output:
	// lookup waits 600ms on a lock: none
	// lookup demoted: false
	// report run 1 overran: none
	// report run 2 overran: none
	// report run 3 overran: demoted
	// report demoted: true
	// report fast run 4: promoted
	// {Entries:4096 Tracked:2 Demoted:0 Demotions:1 Promotions:1 Evictions:0 EvictedDemoted:0}
}
