package txguard

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkWatchUnwatch: one lease watched and unwatched while Live others are watched. No
// allocation.
//
// Budgets=shared is a pool's case: the live leases belong to three lanes (three budgets and
// ladders), and the measured lease, one of them, is due after its lane's older leases
// (Due=latest), or has a budget of its own due before every other lease (Due=earliest: the timer
// is re-armed each time). Budgets=distinct gives every live lease a budget of its own: most go
// to the overflow heap, the measured one too.
func BenchmarkWatchUnwatch(b *testing.B) {
	for _, live := range []int{10, 1000, 10000} {
		for _, budgets := range []string{"shared", "distinct"} {
			for _, due := range []struct {
				name   string
				budget time.Duration
			}{{"latest", 90 * time.Minute}, {"earliest", 30 * time.Minute}} {
				b.Run(fmt.Sprintf("Live=%d/Budgets=%s/Due=%s", live, budgets, due.name), func(b *testing.B) {
					g := New()
					defer g.Close()
					r := &recorder{}
					now := time.Now()
					lanes := []struct {
						budget time.Duration
						action Action
					}{{time.Hour, Flag}, {90 * time.Minute, Cancel}, {2 * time.Hour, Terminate}}
					for i := range live {
						l := &Lease{Owner: r, Start: now.Add(time.Duration(i-live) * time.Microsecond)}
						if budgets == "shared" {
							lane := lanes[i%len(lanes)]
							l.Budget, l.Action = lane.budget, lane.action
						} else {
							l.Budget, l.Action = time.Hour+time.Duration(i)*time.Millisecond, Cancel
						}
						g.Watch(l)
					}
					l := &Lease{Owner: r, Start: now, Budget: due.budget, Action: Cancel}
					b.ReportAllocs()
					for b.Loop() {
						g.Watch(l)
						g.Unwatch(l)
					}
				})
			}
		}
	}
}

// BenchmarkWatchUnwatchParallel: every goroutine watches and unwatches its own lease, all of
// one lane, while 1000 others are watched: the guard's lock contended.
func BenchmarkWatchUnwatchParallel(b *testing.B) {
	g := New()
	defer g.Close()
	r := &recorder{}
	now := time.Now()
	for i := range 1000 {
		g.Watch(&Lease{Owner: r, Start: now.Add(time.Duration(i-1000) * time.Microsecond), Budget: time.Hour, Action: Cancel})
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		l := &Lease{Owner: r, Budget: time.Hour, Action: Cancel}
		for pb.Next() {
			l.Start = time.Now()
			g.Watch(l)
			g.Unwatch(l)
		}
	})
}
