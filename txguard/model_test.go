package txguard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

// A step the model expects, or one the guard delivered.
type mstep struct {
	action Action
	after  time.Duration // elapsed, for a delivered step
	at     time.Time     // when it was (or is to be) delivered
}

type mdelivery struct {
	gen uint64
	mstep
}

// mowner is a GenOwner that logs every step with the instant it ran.
type mowner struct {
	mu  *sync.Mutex
	log *[]mdelivery
}

func (o mowner) Act(Action, time.Duration) { panic("the guard calls ActGen on a GenOwner") }

func (o mowner) ActGen(gen uint64, a Action, elapsed time.Duration) {
	o.mu.Lock()
	*o.log = append(*o.log, mdelivery{gen, mstep{a, elapsed, time.Now()}})
	o.mu.Unlock()
}

// mhold is one hold of a lease in the reference model.
type mhold struct {
	start time.Time
	end   time.Time // when it was unwatched; zero while watched
	steps []mstep   // its whole ladder, mark included
}

// refSteps is the reference ladder: written out, not computed the guard's way.
func refSteps(start time.Time, budget time.Duration, a Action, mark time.Duration) []mstep {
	var s []mstep
	if budget > 0 {
		half := budget / 2 // the guard counts in halves of the budget
		switch a {
		case Cancel:
			s = []mstep{{Flag, half, time.Time{}}, {Cancel, 2 * half, time.Time{}}, {Terminate, 4 * half, time.Time{}}}
		case Terminate:
			s = []mstep{{Flag, half, time.Time{}}, {Terminate, 2 * half, time.Time{}}}
		default:
			s = []mstep{{Flag, 2 * half, time.Time{}}}
		}
	}
	if mark > 0 {
		i := 0
		for i < len(s) && s[i].after <= mark {
			i++
		}
		s = slices.Insert(s, i, mstep{Mark, mark, time.Time{}})
	}
	for i := range s {
		s[i].at = start.Add(s[i].after)
	}
	return s
}

// TestScheduleModel drives a guard with random Watch, Unwatch and time advances in a synctest
// bubble, against a reference model: every step of every hold is delivered exactly once, at
// exactly its due time (Start + its offset), with the hold's Gen, never after the hold was
// unwatched, in ladder order; the guard watches exactly the holds with steps to come. Starts are
// skewed at random, so leases of one lane are often watched out of the order of their Start.
// "few" keys is a pool's case (a few budgets, ladders and marks: every lease in a list); "many"
// gives odd budgets and marks, past the guard's list limit: lists are recycled and the overflow
// heap used.
func TestScheduleModel(t *testing.T) {
	type lane struct {
		budget time.Duration
		action Action
	}
	few := []lane{{0, Flag}, {400 * time.Millisecond, Flag}, {time.Second, Cancel}, {2 * time.Second, Terminate}, {600 * time.Millisecond, Cancel}}
	fewMarks := []time.Duration{0, 0, 300 * time.Millisecond, 500 * time.Millisecond, time.Second}
	overflows := 0 // scenarios that used the overflow heap
	defer func() {
		if !t.Failed() && overflows < 6 {
			t.Fatalf("only %d of 12 scenarios with many keys used the overflow heap", overflows)
		}
	}()
	for _, mode := range []string{"few", "many"} {
		for seed := range uint64(12) {
			t.Run(fmt.Sprintf("%s/seed=%d", mode, seed), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(seed, 22))
					var mu sync.Mutex
					var log []mdelivery
					owner := mowner{&mu, &log}
					g := New()
					defer g.Close() // also when the test fails: the bubble's goroutines must end
					leases := make([]Lease, 100)
					current := make([]uint64, len(leases)) // the gen of each lease's open hold, 0 for none
					holds := map[uint64]*mhold{}
					var gen uint64
					overflowed := false
					unwatch := func(i int) {
						g.Unwatch(&leases[i])
						if h := holds[current[i]]; h != nil && h.end.IsZero() {
							h.end = time.Now()
						}
						current[i] = 0
					}
					// With many keys, more holds at once: more than the guard has lists.
					watches, unwatches, long := 4, 6, 4
					if mode == "many" {
						watches, unwatches, long = 6, 7, 10
					}
					for range 1500 {
						switch r := rng.IntN(10); {
						case r < watches: // a new hold of a lease: its owner unwatches it first, as owners do
							i := rng.IntN(len(leases))
							unwatch(i)
							var ln lane
							var mark time.Duration
							if mode == "few" {
								ln, mark = few[rng.IntN(len(few))], fewMarks[rng.IntN(len(fewMarks))]
							} else {
								ln = lane{time.Duration(200+rng.IntN(5800)) * time.Millisecond, Action(1 + rng.IntN(3))}
								if rng.IntN(2) == 0 {
									mark = time.Duration(100+rng.IntN(1900)) * time.Millisecond
								}
							}
							// Skewed back by up to 50 ms, less than any first step: a Watch
							// after another may carry the earlier Start.
							start := time.Now().Add(-time.Duration(rng.IntN(51)) * time.Millisecond)
							gen++
							leases[i] = Lease{Owner: owner, Start: start, Budget: ln.budget, Action: ln.action, Mark: mark, Gen: gen}
							g.Watch(&leases[i])
							holds[gen] = &mhold{start: start, steps: refSteps(start, ln.budget, ln.action, mark)}
							g.mu.Lock()
							overflowed = overflowed || len(g.overflow) > 0
							g.mu.Unlock()
							current[i] = gen
						case r < unwatches:
							unwatch(rng.IntN(len(leases))) // sometimes a lease not watched: safe
						default:
							d := time.Duration(rng.IntN(60)) * time.Millisecond
							if rng.IntN(long) == 0 {
								d = time.Duration(rng.IntN(2500)) * time.Millisecond
							}
							time.Sleep(d)
							synctest.Wait() // every step due by now is delivered
							now, want := time.Now(), 0
							for _, h := range holds {
								if h.end.IsZero() && len(h.steps) > 0 && h.steps[len(h.steps)-1].at.After(now) {
									want++
								}
							}
							if got := g.Watched(); got != want {
								t.Fatalf("at %v: the guard watches %d leases, the model %d", now.Sub(holds[1].start), got, want)
							}
						}
					}
					time.Sleep(time.Minute)
					synctest.Wait()
					if g.Watched() != 0 {
						t.Fatalf("%d leases watched after every ladder ended", g.Watched())
					}
					g.Close()

					got := map[uint64][]mstep{}
					for _, d := range log {
						if holds[d.gen] == nil {
							t.Fatalf("step %v for gen %d, never watched", d.action, d.gen)
						}
						got[d.gen] = append(got[d.gen], d.mstep)
					}
					for gen, h := range holds {
						var want []mstep
						for _, s := range h.steps {
							if h.end.IsZero() || !s.at.After(h.end) {
								want = append(want, s)
							}
						}
						g := got[gen]
						// Cancel and Terminate run on goroutines of their own: one that comes
						// due with the mark may log after it.
						byTime := func(a, b mstep) int {
							if c := a.at.Compare(b.at); c != 0 {
								return c
							}
							return int(a.action) - int(b.action)
						}
						slices.SortStableFunc(g, byTime)
						slices.SortStableFunc(want, byTime)
						if !slices.Equal(g, want) {
							t.Fatalf("gen %d (start %v, unwatched %v): delivered\n%v\nwant\n%v", gen, h.start, h.end, g, want)
						}
					}
					if len(holds) < 200 || len(log) < 200 {
						t.Fatalf("a thin scenario: %d holds, %d steps", len(holds), len(log))
					}
					if overflowed {
						if mode == "few" {
							t.Fatal("few keys: the overflow heap was used")
						}
						overflows++
					}
				})
			})
		}
	}
}

// TestConcurrentWatchUnwatch: goroutines watch and unwatch their own leases, with budgets of a
// few milliseconds, while the guard moves them from step to step: the race detector's test.
func TestConcurrentWatchUnwatch(t *testing.T) {
	defer goleak.VerifyNone(t)
	g := New()
	var acts sync.WaitGroup
	var mu sync.Mutex
	n := 0
	owner := ownerFunc(func(Action, time.Duration) { mu.Lock(); n++; mu.Unlock() })
	for w := range 4 {
		acts.Add(1)
		go func() {
			defer acts.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			ls := make([]Lease, 8)
			for range 3000 {
				l := &ls[rng.IntN(len(ls))]
				g.Unwatch(l)
				*l = Lease{Owner: owner, Start: time.Now().Add(-time.Duration(rng.IntN(100)) * time.Microsecond),
					Budget: time.Duration(1+rng.IntN(3)) * time.Millisecond, Action: Action(1 + rng.IntN(3))}
				if rng.IntN(3) == 0 {
					l.Mark = time.Duration(rng.IntN(2000)) * time.Microsecond
				}
				g.Watch(l)
				if rng.IntN(50) == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			for i := range ls {
				g.Unwatch(&ls[i])
			}
		}()
	}
	acts.Wait()
	if g.Watched() != 0 {
		t.Fatalf("%d leases watched after every one was unwatched", g.Watched())
	}
	g.Close()
	mu.Lock()
	defer mu.Unlock()
	if n == 0 {
		t.Fatal("the guard delivered no step")
	}
}
