package reserve

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// oneLane is a pool of size slots and one lane, changed by mod.
func oneLane(t testing.TB, size int, mod func(*LaneConfig)) *Pool {
	t.Helper()
	lc := LaneConfig{Name: "l", Bounded: true}
	if mod != nil {
		mod(&lc)
	}
	p, err := New(Config{Size: size, Lanes: []LaneConfig{lc}})
	require.NoError(t, err)
	return p
}

// queue starts a caller that waits on lane 0 and sends its name and Slot on got when granted.
// It returns once the caller has queued.
func queue(t *testing.T, p *Pool, c Caller, name string, got chan<- granted) {
	t.Helper()
	go func() {
		s, err := p.AcquireAs(context.Background(), 0, c)
		if assert.NoError(t, err, name) {
			got <- granted{name, s}
		}
	}()
	synctest.Wait()
}

type granted struct {
	name string
	s    Slot
}

// TestPriorityOrder: higher priority first, FIFO among equals; with PriorityAge 0, FIFO whatever
// the priority.
func TestPriorityOrder(t *testing.T) {
	for _, tc := range []struct {
		age  time.Duration
		want []string
	}{
		{time.Hour, []string{"high1", "high2", "normal1", "normal2", "low"}},
		{0, []string{"normal1", "high1", "low", "high2", "normal2"}},
	} {
		t.Run(fmt.Sprintf("PriorityAge=%v", tc.age), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := oneLane(t, 1, func(lc *LaneConfig) { lc.PriorityAge = tc.age })
				held := mustTake(t, p, 0, 1)[0]
				got := make(chan granted, 5)
				queue(t, p, Caller{Priority: 0}, "normal1", got)
				queue(t, p, Caller{Priority: 10}, "high1", got)
				queue(t, p, Caller{Priority: -10}, "low", got)
				queue(t, p, Caller{Priority: 10}, "high2", got)
				queue(t, p, Caller{Priority: 0}, "normal2", got)
				requireInvariants(t, p)
				var order []string
				for range 5 {
					p.Release(held)
					g := <-got
					assert.False(t, g.s.Aged(), g.name)
					order = append(order, g.name)
					held = g.s
					requireInvariants(t, p)
				}
				p.Release(held)
				assert.Equal(t, tc.want, order)
				assert.Zero(t, p.LaneStat(0).AgedGrants)
			})
		})
	}
}

// TestAgeing: a waiter that has waited PriorityAge is served before every waiter that arrived
// after it, whatever their priority, and after those that arrived before it.
func TestAgeing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := oneLane(t, 1, func(lc *LaneConfig) { lc.PriorityAge = 100 * time.Millisecond })
		held := mustTake(t, p, 0, 1)[0]
		got := make(chan granted, 4)
		queue(t, p, Caller{Priority: 10}, "high-before", got)
		time.Sleep(time.Millisecond)
		queue(t, p, Caller{Priority: -10}, "low", got)
		time.Sleep(50 * time.Millisecond)
		queue(t, p, Caller{Priority: 10}, "high-after", got)
		queue(t, p, Caller{Priority: 20}, "critical-after", got)

		// At 51ms nobody is aged: the critical caller goes first.
		p.Release(held)
		g := <-got
		require.Equal(t, "critical-after", g.name)
		held = g.s

		// At 151ms high-before and low are aged: arrival order among them, then the rest.
		time.Sleep(100 * time.Millisecond)
		var order []string
		var aged []bool
		for range 3 {
			p.Release(held)
			g := <-got
			order, aged, held = append(order, g.name), append(aged, g.s.Aged()), g.s
			requireInvariants(t, p)
		}
		p.Release(held)
		assert.Equal(t, []string{"high-before", "low", "high-after"}, order)
		// high-before was the first by priority too; only low went ahead of a higher priority.
		assert.Equal(t, []bool{false, true, false}, aged)
		assert.Equal(t, int64(1), p.LaneStat(0).AgedGrants)
	})
}

// TestAgeingBoundsALowWait: high-priority callers keep a lane of 2 slots saturated, each
// holding h. A low-priority caller that joins with k waiters ahead of it is served within
// PriorityAge + ⌈(k+1)/2⌉·h (docs/design.md proves it). Without ageing (PriorityAge far above
// the acquire timeout), the same caller is starved until its timeout: the bound is ageing's.
func TestAgeingBoundsALowWait(t *testing.T) {
	const (
		slots = 2
		hold  = 10 * time.Millisecond
		age   = 100 * time.Millisecond
	)
	run := func(t *testing.T, priorityAge time.Duration) (wait time.Duration, ahead int, err error) {
		p := oneLane(t, slots, func(lc *LaneConfig) {
			lc.PriorityAge = priorityAge
			lc.AcquireTimeout = time.Second
		})
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 3 * slots { // always more high callers than slots: there is always one waiting
			wg.Go(func() {
				for ctx.Err() == nil {
					s, err := p.AcquireAs(ctx, 0, Caller{Priority: 10})
					if err != nil {
						continue
					}
					time.Sleep(hold)
					p.Release(s)
				}
			})
		}
		time.Sleep(5 * hold) // steady state
		synctest.Wait()
		ahead = p.LaneStat(0).Waiting
		start := time.Now()
		s, err := p.AcquireAs(context.Background(), 0, Caller{Priority: -10})
		wait = time.Since(start)
		if err == nil {
			assert.True(t, s.Aged())
			p.Release(s)
		}
		stop()
		wg.Wait()
		requireInvariants(t, p)
		return wait, ahead, err
	}
	synctest.Test(t, func(t *testing.T) {
		wait, ahead, err := run(t, age)
		require.NoError(t, err)
		bound := age + time.Duration((ahead+slots)/slots)*hold
		t.Logf("low-priority wait %v with %d waiters ahead; bound %v", wait, ahead, bound)
		assert.GreaterOrEqual(t, wait, age, "high callers were always waiting: only ageing serves the low one")
		assert.LessOrEqual(t, wait, bound)

		_, _, err = run(t, time.Hour)
		require.ErrorIs(t, err, ErrAcquireTimeout, "without ageing the low caller starves")
	})
}

// TestTagShare: one tag fills the lane; a caller of another tag gets the next released slot,
// ahead of the first tag's earlier waiters. When every waiter's tag is at its share, the order
// decides (the share never leaves a slot free). In dry run nothing changes but the count.
func TestTagShare(t *testing.T) {
	for _, dry := range []bool{false, true} {
		t.Run(fmt.Sprintf("DryRun=%v", dry), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := oneLane(t, 4, func(lc *LaneConfig) {
					lc.Bounded, lc.MaxTagShare, lc.TagShareDryRun = false, 2, dry
				})
				var a []Slot
				for range 4 { // nobody else waits: the share does not apply
					s, ok := p.TryAcquireAs(0, "a")
					require.True(t, ok)
					a = append(a, s)
				}
				got := make(chan granted, 3)
				queue(t, p, Caller{Tag: "a"}, "a1", got)
				queue(t, p, Caller{Tag: "a"}, "a2", got)
				queue(t, p, Caller{Tag: "b"}, "b1", got)
				requireInvariants(t, p)

				p.Release(a[0]) // a holds 3 ≥ 2: b1 goes first
				g := <-got
				assert.Equal(t, int64(1), p.LaneStat(0).TagShareRefusals)
				if dry {
					assert.Equal(t, "a1", g.name, "dry run: the order is kept")
					assert.True(t, g.s.HeldBack(), "dry run: a1 would have been held back")
				} else {
					assert.Equal(t, "b1", g.name, "another tag's waiter goes first")
					assert.False(t, g.s.HeldBack())
				}
				other := g.s
				requireInvariants(t, p)

				// Now only a's waiters wait: at its share or not, a is served.
				p.Release(a[1])
				g = <-got
				// Enforced: a1, passed over once, and no pass-over now: nobody else may take it.
				// Dry run: a2, which would have been passed over for b1.
				assert.Equal(t, map[bool]string{false: "a1", true: "a2"}[dry], g.name)
				assert.True(t, g.s.HeldBack())
				assert.Equal(t, map[bool]int64{false: 1, true: 2}[dry], p.LaneStat(0).TagShareRefusals)
				p.Release(g.s)
				p.Release(other)
				if dry {
					g = <-got // b1, at last
					assert.Equal(t, "b1", g.name)
				} else {
					g = <-got
					assert.Equal(t, "a2", g.name)
				}
				p.Release(g.s)
				p.Release(a[2])
				p.Release(a[3])
				requireInvariants(t, p)
				assert.Empty(t, p.lanes[0].tags, "counts of tags that hold nothing are dropped")
			})
		})
	}
}

// TestTagShareAllAtShare: with every waiting tag at its share, the slot goes by the order.
func TestTagShareAllAtShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := oneLane(t, 2, func(lc *LaneConfig) { lc.Bounded, lc.MaxTagShare = false, 1 })
		sa, _ := p.TryAcquireAs(0, "a")
		sb, _ := p.TryAcquireAs(0, "b")
		got := make(chan granted, 2)
		queue(t, p, Caller{Tag: "b"}, "b1", got)
		queue(t, p, Caller{Tag: "a"}, "a1", got)
		p.Release(sa) // a holds 0 now: a1 is below its share, b1 (b holds 1) is not
		g := <-got
		assert.Equal(t, "a1", g.name)
		p.Release(g.s) // a holds 0, b 1: b1 is at its share but alone
		g = <-got
		assert.Equal(t, "b1", g.name)
		assert.True(t, g.s.HeldBack())
		p.Release(g.s)
		p.Release(sb)
		requireInvariants(t, p)
	})
}

// modelWaiter is the model's view of a waiter in TestOrderModel.
type modelWaiter struct {
	w     *waiter
	ready chan Slot
	seq   uint64
	since time.Time
	prio  int
	tag   string
}

// TestHeadroom: low-priority callers fill a lane but its headroom; a caller of priority 0 or more
// then gets the last slot at once, ahead of the low waiters. A low waiter that has aged takes the
// headroom at the next grant.
func TestHeadroom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const age = 100 * time.Millisecond
		p := oneLane(t, 4, func(lc *LaneConfig) { lc.PriorityAge, lc.PriorityHeadroom = age, 1 })
		ctx := context.Background()
		low := Caller{Priority: -10}
		var lows []Slot
		for range 3 {
			s, err := p.AcquireAs(ctx, 0, low)
			require.NoError(t, err)
			lows = append(lows, s)
		}
		tr, ok := p.TryAcquireAs(0, "")
		require.True(t, ok, "TryAcquire at priority 0 takes the headroom")
		p.Release(tr)
		p.Release(lows[2]) // back to 2 low, 2 free

		got := make(chan granted, 4)
		queue(t, p, low, "low1", got) // takes the third slot: room 2 > 1
		g := <-got
		require.Equal(t, "low1", g.name)
		queue(t, p, low, "low2", got) // room 1: held off
		queue(t, p, low, "low3", got)
		require.Empty(t, got)
		st := p.LaneStat(0)
		require.Equal(t, 3, st.InUse)
		require.Equal(t, 2, st.Waiting)

		start := time.Now()
		high, err := p.AcquireAs(ctx, 0, Caller{Priority: 10})
		require.NoError(t, err)
		assert.Zero(t, time.Since(start), "the high-priority caller waited")
		assert.False(t, high.Waited(), "the high-priority caller's slot says it waited")
		p.Release(high)
		synctest.Wait()
		require.Empty(t, got, "a low waiter took the headroom before it aged")

		// low2 and low3 age, and nothing else happens in the lane: its ager grants the headroom
		// to low2 when it does (were it not woken, it would wait beside the free slot until its
		// deadline, and this bubble would deadlock).
		time.Sleep(age)
		synctest.Wait()
		g2 := <-got
		require.Equal(t, "low2", g2.name, "the aged low waiter takes the headroom")
		assert.True(t, g2.s.Aged())
		require.Equal(t, 4, p.LaneStat(0).InUse)
		queue(t, p, low, "low4", got)

		for _, s := range []Slot{lows[0], lows[1], g.s, g2.s} {
			p.Release(s)
		}
		for range 2 {
			p.Release((<-got).s)
		}
		requireInvariants(t, p)
	})
}

// TestOrderModel drives one lane with random acquires, releases, cancels and the passing of
// time, and checks every grant against a model of the service order written from its
// definition: aged waiters in arrival order, then by priority and arrival; the first of them
// whose tag is below the share, or the first of all if none is.
func TestOrderModel(t *testing.T) {
	steps := 3000
	if testing.Short() {
		steps = 300
	}
	for _, cfg := range []struct {
		name     string
		age      time.Duration
		share    int
		dry      bool
		headroom int
	}{
		{"fifo", 0, 0, false, 0},
		{"priority", 10 * time.Millisecond, 0, false, 0},
		{"share", 0, 2, false, 0},
		{"priority+share", 10 * time.Millisecond, 2, false, 0},
		{"priority+share dry run", 10 * time.Millisecond, 2, true, 0},
		{"priority+headroom", 10 * time.Millisecond, 0, false, 2},
		{"priority+share+headroom", 10 * time.Millisecond, 2, false, 1},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const size = 5
				p := oneLane(t, size, func(lc *LaneConfig) {
					lc.Bounded, lc.PriorityAge, lc.MaxTagShare, lc.TagShareDryRun = false, cfg.age, cfg.share, cfg.dry
					lc.PriorityHeadroom = cfg.headroom
				})
				rng := rand.New(rand.NewPCG(1, uint64(len(cfg.name))))
				tags := []string{"", "a", "b"}
				held := map[Slot]string{}
				var waiting []modelWaiter
				var seq uint64
				heldOff := 0
				heldBy := func(tag string) int {
					n := 0
					for _, tg := range held {
						if tg == tag {
							n++
						}
					}
					return n
				}
				// lowOK: a caller of negative priority may take a slot: the lane keeps more than the
				// headroom free after it (one lane of size slots, so what it may take is what is free).
				lowOK := func() bool { return size-len(held) > cfg.headroom }
				// want returns the index in waiting of the waiter the model serves next, or -1 if no
				// waiter may take a slot: one of negative priority, not aged, may not take the
				// headroom.
				want := func() int {
					now := time.Now()
					aged := func(m modelWaiter) bool { return cfg.age == 0 || now.Sub(m.since) >= cfg.age }
					order := slices.DeleteFunc(slices.Clone(waiting), func(m modelWaiter) bool {
						return m.prio < 0 && !lowOK() && !aged(m)
					})
					if len(order) == 0 {
						return -1
					}
					slices.SortStableFunc(order, func(x, y modelWaiter) int {
						switch ax, ay := aged(x), aged(y); {
						case ax && ay, cfg.age == 0:
							return int(x.seq) - int(y.seq)
						case ax:
							return -1
						case ay:
							return 1
						case x.prio != y.prio:
							return y.prio - x.prio
						}
						return int(x.seq) - int(y.seq)
					})
					pick := order[0]
					if cfg.share > 0 && !cfg.dry {
						for _, m := range order {
							if heldBy(m.tag) < cfg.share {
								pick = m
								break
							}
						}
					}
					return slices.IndexFunc(waiting, func(m modelWaiter) bool { return m.seq == pick.seq })
				}
				// serve checks the grants the pool made after an event against the model's: while
				// a slot is free, the waiter the model serves next has it (skip: the new caller,
				// whose slot admitLocked returned and the test already counted). More than one
				// waiter is served when waiters of negative priority aged while held off.
				serve := func(skip uint64) {
					for len(held) < size {
						i := want()
						if i < 0 {
							break
						}
						m := waiting[i]
						waiting = slices.Delete(waiting, i, i+1)
						if m.seq == skip {
							continue
						}
						select {
						case g := <-m.ready:
							held[g] = m.tag
						default:
							require.Fail(t, "the slot went to another waiter than the model's", "model: seq %d prio %d tag %q", m.seq, m.prio, m.tag)
						}
					}
					for _, o := range waiting {
						require.Empty(t, o.ready, "a waiter the model does not serve was granted")
					}
				}
				for range steps {
					switch op := rng.IntN(10); {
					case op < 4: // a caller arrives
						c := Caller{Priority: []int{-10, 0, 10, 20}[rng.IntN(4)], Tag: tags[rng.IntN(3)]}
						if c.Priority < 0 && len(held) < size && !lowOK() {
							heldOff++
						}
						// The model: with nobody waiting, a slot at once if one is free that the
						// caller may take. Otherwise the caller queues, and if a slot is free (the
						// waiters were held off the headroom) it goes to whoever the order serves
						// first now: the caller, or a waiter that has aged since.
						p.mu.Lock()
						s, w, err := p.admitLocked(0, c)
						p.mu.Unlock()
						require.NoError(t, err)
						if len(waiting) == 0 {
							now := len(held) < size && (c.Priority >= 0 || lowOK())
							require.Equal(t, now, w == nil, "granted at once (model: %v), prio %d, %d held", now, c.Priority, len(held))
							if w == nil {
								held[s] = c.Tag
							} else {
								seq++
								waiting = append(waiting, modelWaiter{w, w.ready, seq, w.since, c.Priority, c.Tag})
							}
							continue
						}
						seq++
						me := modelWaiter{w, nil, seq, time.Now(), c.Priority, c.Tag}
						if w != nil {
							me.ready, me.since = w.ready, w.since
						}
						waiting = append(waiting, me)
						if len(held) < size && want() >= 0 && waiting[want()].seq == me.seq {
							require.Nil(t, w, "the model serves the new caller at once")
							held[s] = c.Tag
							waiting = waiting[:len(waiting)-1]
							continue
						}
						require.NotNil(t, w, "granted at once; the model serves another first")
						serve(0)
					case op < 7 && len(held) > 0: // a holder releases
						var s Slot
						for s = range held {
							break
						}
						delete(held, s) // the model serves after the release
						p.Release(s)
						serve(0)
					case op < 8 && len(waiting) > 0: // a waiter gives up
						i := rng.IntN(len(waiting))
						m := waiting[i]
						_, _ = p.abandon(m.w, m.ready, 0, m.since, context.Canceled)
						waiting = slices.Delete(waiting, i, i+1)
					default:
						// Time passes, a millisecond at a time (every instant in the bubble is a
						// whole millisecond, so a waiter ages at one of them): the lane's ager grants
						// the headroom to a held-off waiter the moment it ages, and the model serves
						// at that moment too.
						for range rng.IntN(6) {
							time.Sleep(time.Millisecond)
							synctest.Wait()
							serve(0)
						}
					}
					requireInvariants(t, p)
				}
				st := p.LaneStat(0)
				t.Logf("%d held, %d waiting; aged grants %d, tag-share refusals %d", len(held), len(waiting), st.AgedGrants, st.TagShareRefusals)
				if cfg.age > 0 {
					assert.Positive(t, st.AgedGrants)
				}
				if cfg.share > 0 {
					assert.Positive(t, st.TagShareRefusals)
				}
				if cfg.headroom > 0 {
					assert.Positive(t, heldOff, "the headroom never held a caller off")
				}
			})
		})
	}
}

// TestPriorityCancelLeavesNothing: waiters of every priority and tag that give up leave no node,
// class or tag count behind, and no goroutine.
func TestPriorityCancelLeavesNothing(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		p := oneLane(t, 1, func(lc *LaneConfig) {
			lc.Bounded, lc.PriorityAge, lc.MaxTagShare, lc.AcquireTimeout = false, time.Millisecond, 1, 10*time.Millisecond
		})
		held := mustTake(t, p, 0, 1)[0]
		ctx, cancel := context.WithCancel(context.Background())
		errs := make(chan error, 8)
		for i := range 8 {
			go func() {
				c := ctx
				if i%2 == 0 {
					c = context.Background() // times out
				}
				_, err := p.AcquireAs(c, 0, Caller{Priority: i % 3, Tag: fmt.Sprint(i % 2)})
				errs <- err
			}()
		}
		synctest.Wait()
		require.Len(t, p.lanes[0].classes, 3)
		cancel()
		for range 8 {
			require.Error(t, <-errs)
		}
		assert.Empty(t, p.lanes[0].classes)
		assert.Zero(t, p.LaneStat(0).Waiting)
		p.Release(held)
		assert.Empty(t, p.lanes[0].tags)
		requireInvariants(t, p)
	})
}

// TestPriorityKeepsBounds: a priority changes the order, never the bounds: a full queue refuses
// a critical caller, its acquire timeout still ends its wait, and a lane at its cap stays there.
func TestPriorityKeepsBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := oneLane(t, 2, func(lc *LaneConfig) {
			lc.PriorityAge, lc.MaxWaiters, lc.MaxConns, lc.AcquireTimeout = time.Second, 1, 1, 50*time.Millisecond
		})
		held := mustTake(t, p, 0, 1)[0]
		_, ok := p.TryAcquire(0)
		require.False(t, ok, "at its cap with a slot free")
		errc := make(chan error, 1)
		go func() { _, err := p.AcquireAs(context.Background(), 0, Caller{Priority: -10}); errc <- err }()
		synctest.Wait()
		_, err := p.AcquireAs(context.Background(), 0, Caller{Priority: 1000})
		require.ErrorIs(t, err, ErrLaneFull, "a full queue refuses any priority")
		require.ErrorIs(t, <-errc, ErrAcquireTimeout, "the low caller's own timeout")
		p.Release(held)
		requireInvariants(t, p)
	})
}
