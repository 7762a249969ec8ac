package stmtstats_test

import (
	"fmt"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// A lookup with a history of fast runs that waits once on a row lock stays fast; a new report
// with no fast run on record is demoted by its first overrun, while it is still going, and stays
// demoted for at least MinPeriod.
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

	// An index was added: the report is fast now, in whatever lane it runs. It stays demoted
	// for Config.MinPeriod (default 10 × Threshold, at least 1s) after its demotion, then its
	// next fast run promotes it.
	for i := range 4 {
		if c := t.Done(report, 5*time.Millisecond, false); c != stmtstats.None {
			fmt.Printf("report fast run %d: %v\n", i+1, c)
		}
	}
	fmt.Println("report demoted after four fast runs:", t.Demoted(report))
	fmt.Printf("%+v\n", t.Stat())
	// Output:
	// lookup waits 600ms on a lock: none
	// lookup demoted: false
	// report run 1 overran: demoted
	// report run 2 overran: none
	// report run 3 overran: none
	// report demoted: true
	// report demoted after four fast runs: true
	// {Entries:4096 Tracked:2 Proven:1 Demoted:1 Demotions:1 Promotions:0 Evictions:0 EvictedDemoted:0}
}
