package txguard

import (
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

type event struct {
	action  Action
	elapsed time.Duration
}

type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) Act(a Action, elapsed time.Duration) {
	r.mu.Lock()
	r.events = append(r.events, event{a, elapsed})
	r.mu.Unlock()
}

func (r *recorder) got() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.events...)
}

func TestLadders(t *testing.T) {
	tests := []struct {
		action Action
		want   []event
	}{
		{Flag, []event{{Flag, 10 * time.Second}}},
		{Cancel, []event{{Flag, 5 * time.Second}, {Cancel, 10 * time.Second}, {Terminate, 20 * time.Second}}},
		{Terminate, []event{{Flag, 5 * time.Second}, {Terminate, 10 * time.Second}}},
	}
	for _, tc := range tests {
		t.Run(tc.action.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := New()
				defer g.Close()
				r := &recorder{}
				l := &Lease{Owner: r, Start: time.Now(), Budget: 10 * time.Second, Action: tc.action}
				g.Watch(l)
				time.Sleep(time.Minute)
				synctest.Wait()
				got := r.got()
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("events %v, want %v", got, tc.want)
				}
				if g.Watched() != 0 {
					t.Fatalf("%d leases still watched after the ladder", g.Watched())
				}
				if LastStep(l.Budget, l.Action) != tc.want[len(tc.want)-1].elapsed {
					t.Fatalf("LastStep %v", LastStep(l.Budget, l.Action))
				}
				if FirstStep(l.Budget, l.Action) != tc.want[0].elapsed {
					t.Fatalf("FirstStep %v", FirstStep(l.Budget, l.Action))
				}
			})
		})
	}
}

func TestUnwatchStopsTheLadder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New()
		defer g.Close()
		r := &recorder{}
		l := &Lease{Owner: r, Start: time.Now(), Budget: 10 * time.Second, Action: Cancel}
		g.Watch(l)
		time.Sleep(7 * time.Second) // past the flag, before the cancel
		synctest.Wait()
		g.Unwatch(l)
		g.Unwatch(l) // safe twice
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := r.got(); len(got) != 1 || got[0].action != Flag {
			t.Fatalf("events %v, want only the flag", got)
		}
		// A released lease can be watched again (a pooled lease struct reused).
		l.Start = time.Now()
		g.Watch(l)
		g.Unwatch(l)
	})
}

func TestManyLeasesInDeadlineOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New()
		defer g.Close()
		var mu sync.Mutex
		var order []int
		leases := make([]*Lease, 100)
		start := time.Now()
		for i := range leases {
			// Budgets in a scrambled order; each lease flags at its own budget.
			b := time.Duration((i*37)%100+1) * time.Second
			leases[i] = &Lease{Owner: ownerFunc(func(a Action, _ time.Duration) {
				mu.Lock()
				order = append(order, int(b/time.Second))
				mu.Unlock()
			}), Start: start, Budget: b, Action: Flag}
			g.Watch(leases[i])
		}
		// Unwatch every tenth.
		for i := 0; i < len(leases); i += 10 {
			g.Unwatch(leases[i])
		}
		time.Sleep(200 * time.Second)
		synctest.Wait()
		if len(order) != 90 {
			t.Fatalf("%d flags, want 90", len(order))
		}
		for i := 1; i < len(order); i++ {
			if order[i] < order[i-1] {
				t.Fatalf("flags out of deadline order: %v", order)
			}
		}
	})
}

type ownerFunc func(Action, time.Duration)

func (f ownerFunc) Act(a Action, d time.Duration) { f(a, d) }

func TestWatchTwicePanics(t *testing.T) {
	g := New()
	defer g.Close()
	l := &Lease{Owner: &recorder{}, Start: time.Now(), Budget: time.Hour, Action: Flag}
	g.Watch(l)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	g.Watch(l)
}

func TestCloseLeaksNothing(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := New()
	slow := make(chan struct{})
	l := &Lease{Owner: ownerFunc(func(a Action, _ time.Duration) {
		if a == Terminate {
			<-slow
		}
	}), Start: time.Now().Add(-time.Hour), Budget: time.Millisecond, Action: Terminate}
	g.Watch(l)
	for g.Watched() != 0 {
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { g.Close(); close(done) }()
	select {
	case <-done:
		t.Fatal("Close returned with an action under way")
	case <-time.After(20 * time.Millisecond):
	}
	close(slow)
	<-done
	// Watch after Close is ignored.
	g.Watch(&Lease{Owner: &recorder{}, Start: time.Now(), Budget: time.Millisecond, Action: Flag})
	if g.Watched() != 0 {
		t.Fatal("watched after Close")
	}
}

func TestHugeBudgetSaturates(t *testing.T) {
	for _, a := range []Action{Flag, Cancel, Terminate} {
		l := &Lease{Budget: 1<<63 - 1, Action: a, Start: time.Now()}
		if got := LastStep(l.Budget, l.Action); got <= 0 {
			t.Fatalf("%v: LastStep of the largest budget overflowed to %v", a, got)
		}
		g := New()
		if at := g.dueAt(l, LastStep(l.Budget, l.Action)); at < int64(l.Start.Sub(g.epoch)) {
			t.Fatalf("%v: due time %v before the start", a, at)
		}
		g.Close()
	}
}

// TestMark: a lease's own Mark is due at Start + Mark, in order among the ladder's steps, and a
// lease with a Mark and no budget is watched for the Mark alone.
func TestMark(t *testing.T) {
	tests := []struct {
		name   string
		budget time.Duration
		action Action
		mark   time.Duration
		want   []event
	}{
		{"mark alone", 0, Cancel, time.Second, []event{{Mark, time.Second}}},
		{"before the ladder", 10 * time.Second, Cancel, time.Second,
			[]event{{Mark, time.Second}, {Flag, 5 * time.Second}, {Cancel, 10 * time.Second}, {Terminate, 20 * time.Second}}},
		{"inside the ladder", 10 * time.Second, Terminate, 7 * time.Second,
			[]event{{Flag, 5 * time.Second}, {Mark, 7 * time.Second}, {Terminate, 10 * time.Second}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := New()
				defer g.Close()
				r := &recorder{}
				g.Watch(&Lease{Owner: r, Start: time.Now(), Budget: tc.budget, Action: tc.action, Mark: tc.mark})
				time.Sleep(time.Minute)
				synctest.Wait()
				if got := r.got(); fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("events %v, want %v", got, tc.want)
				}
			})
		})
	}
}

// genRecorder is a GenOwner: it records the Gen of each action.
type genRecorder struct {
	mu   sync.Mutex
	gens []uint64
}

func (r *genRecorder) Act(Action, time.Duration) { panic("the guard calls ActGen on a GenOwner") }

func (r *genRecorder) ActGen(gen uint64, _ Action, _ time.Duration) {
	r.mu.Lock()
	r.gens = append(r.gens, gen)
	r.mu.Unlock()
}

// A GenOwner gets back the Gen its Lease had when the step came due, not the one it has when the
// action runs: an action decided for one hold of a reused Lease names that hold.
func TestGenOwnerGetsTheHoldsGen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New()
		defer g.Close()
		r := &genRecorder{}
		l := &Lease{Owner: r, Start: time.Now(), Budget: 10 * time.Second, Action: Flag, Gen: 7}
		g.Watch(l)
		time.Sleep(11 * time.Second)
		synctest.Wait()
		g.Unwatch(l)
		l.Gen, l.Start = 8, time.Now() // reused for the next hold
		g.Watch(l)
		time.Sleep(11 * time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		if fmt.Sprint(r.gens) != "[7 8]" {
			t.Fatalf("gens %v, want [7 8]", r.gens)
		}
	})
}

// TestShortLeasesDoNotRearm: a stream of leases that end well within their budgets sets the
// guard's timer about once per first step, not once per lease: a lease due after the one the
// timer waits for leaves it alone, and the timer that fires with nothing due is set again by the
// next Watch only.
func TestShortLeasesDoNotRearm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := New()
		defer g.Close()
		r := &recorder{}
		for range 2000 {
			l := &Lease{Owner: r, Start: time.Now(), Budget: time.Second, Action: Cancel, Mark: 200 * time.Millisecond}
			g.Watch(l)
			time.Sleep(time.Millisecond)
			g.Unwatch(l)
		}
		// 2 s of leases, the first step 200 ms after each start: about 10 wakes, each followed by
		// one Watch that sets the timer again.
		if arms := g.Arms(); arms > 25 {
			t.Fatalf("the timer was set %d times for 2000 short leases", arms)
		}
		if len(r.got()) != 0 {
			t.Fatalf("steps %v for leases that ended on time", r.got())
		}
	})
}

// TestWatchWithoutStepsTakesNoLock: a lease with no budget and no mark is not watched, and
// Watch does not take the guard's lock for it (here held by the test).
func TestWatchWithoutStepsTakesNoLock(t *testing.T) {
	g := New()
	defer g.Close()
	g.mu.Lock()
	done := make(chan struct{})
	go func() {
		g.Watch(&Lease{Owner: &recorder{}, Start: time.Now(), Action: Cancel})
		close(done)
	}()
	blocked := false
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		blocked = true
	}
	g.mu.Unlock()
	<-done
	if blocked {
		t.Fatal("Watch of a lease with no budget and no mark waits for the guard's lock")
	}
	if g.Watched() != 0 {
		t.Fatal("a lease with no steps is watched")
	}
}
