package reserve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

const (
	short = 0
	tx    = 1
	long  = 2
)

// testConfig: 8 slots. short reserves 2 and may borrow; tx reserves 4 with cap 5 (it could
// reach 6); long reserves 0 with cap 2. 2 slots are shared.
func testConfig() Config {
	return Config{Size: 8, Lanes: []LaneConfig{
		{Name: "short", Reserved: 2, Bounded: true},
		{Name: "tx", Reserved: 4, MaxConns: 5},
		{Name: "long", Reserved: 0, MaxConns: 2},
	}}
}

func newTestPool(t testing.TB, mod func(*Config)) *Pool {
	t.Helper()
	cfg := testConfig()
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	require.NoError(t, err)
	return p
}

func mustTake(t testing.TB, p *Pool, lane, n int) []Slot {
	t.Helper()
	var s []Slot
	for range n {
		sl, ok := p.TryAcquire(lane)
		require.True(t, ok, "setup: lane %d could not take slot %d of %d", lane, len(s)+1, n)
		s = append(s, sl)
	}
	return s
}

func requireInvariants(t testing.TB, p *Pool) {
	t.Helper()
	require.NoError(t, p.checkInvariants())
}

// TestAdmissionTable: every refusal names the rule that decides it, and the test checks that
// rule is the only one in the way: "cap" means the lane is at its cap; "reserve" means it is
// below its cap and slots are free, so the reserve rule alone refuses; "full" means no slot is
// free and the lane is below its cap.
func TestAdmissionTable(t *testing.T) {
	tests := []struct {
		name            string
		short, tx, long int // slots held, taken in the order short, tx, long
		lane            int
		refused         string // "" (admitted), "cap", "reserve" or "full"
	}{
		{"empty pool: short", 0, 0, 0, short, ""},
		{"empty pool: tx", 0, 0, 0, tx, ""},
		{"empty pool: long", 0, 0, 0, long, ""},
		{"tx within its reserve", 0, 3, 0, tx, ""},
		{"tx into shared", 0, 4, 0, tx, ""},
		{"tx at its cap", 0, 5, 0, tx, "cap"},
		{"tx may not take the short reserve", 0, 4, 2, tx, "reserve"},
		{"long may not take the short reserve", 0, 5, 1, long, "reserve"},
		{"long takes shared", 0, 4, 1, long, ""},
		{"long at its cap", 0, 0, 2, long, "cap"},
		{"shared used up by long: tx still has its reserve", 0, 3, 2, tx, ""},
		{"short reserve always free for short", 0, 5, 1, short, ""},
		{"short borrows idle tx reserve", 2, 0, 0, short, ""},
		{"short borrows up to every free slot", 7, 0, 0, short, ""},
		{"pool full: short waits", 6, 2, 0, short, "full"},
		{"short borrowing does not use up the unbounded lanes' shared slots", 4, 0, 0, long, ""},
		{"short borrowed shared: tx keeps its reserve", 4, 3, 0, tx, ""},
		{"short borrowed tx reserve: tx takes the last free slot", 7, 0, 0, tx, ""},
		{"short borrowed every slot: tx waits", 8, 0, 0, tx, "full"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, nil)
			mustTake(t, p, short, tc.short)
			mustTake(t, p, tx, tc.tx)
			mustTake(t, p, long, tc.long)
			requireInvariants(t, p)

			st, ls := p.Stat(), p.LaneStat(tc.lane)
			switch tc.refused {
			case "cap":
				require.Equal(t, ls.MaxConns, ls.InUse, "row says the cap decides")
				require.Positive(t, st.Free)
			case "reserve":
				require.Less(t, ls.InUse, ls.MaxConns, "row says the reserve rule decides")
				require.Positive(t, st.Free)
			case "full":
				require.Less(t, ls.InUse, ls.MaxConns, "row says the free slots decide")
				require.Zero(t, st.Free)
			}
			_, got := p.TryAcquire(tc.lane)
			require.Equal(t, tc.refused == "", got, "TryAcquire(lane %d); stat %+v", tc.lane, st)
			requireInvariants(t, p)
		})
	}
}

func TestBorrowingLimit(t *testing.T) {
	// With a cap, short borrows only up to it even if slots are free.
	p := newTestPool(t, func(c *Config) { c.Lanes[short].MaxConns = 3 })
	mustTake(t, p, short, 3)
	_, ok := p.TryAcquire(short)
	assert.False(t, ok, "short took a slot beyond its cap")

	// Unbounded lanes can never exceed Size - Reserved(short), whatever the order.
	p = newTestPool(t, func(c *Config) { c.Lanes[tx].MaxConns = 0 })
	n := 0
	for _, lane := range []int{long, tx, long, tx, tx, tx, tx, tx, tx, long} {
		if _, ok := p.TryAcquire(lane); ok {
			n++
		}
	}
	assert.Equal(t, 6, n, "unbounded lanes' slots (Size 8 - short reserve 2)")
	requireInvariants(t, p)
}

func TestReachable(t *testing.T) {
	c := Config{Size: 10, Lanes: []LaneConfig{
		{Name: "b", Reserved: 2, Bounded: true},                 // every slot
		{Name: "bcap", Reserved: 1, MaxConns: 4, Bounded: true}, // its cap
		{Name: "u", Reserved: 3},                                // 3 + 4 shared
		{Name: "ucap", MaxConns: 2},                             // its cap, below 0 + 4 shared
	}}
	require.NoError(t, Validate(c))
	assert.Equal(t, []int{10, 4, 7, 2}, []int{c.Reachable(0), c.Reachable(1), c.Reachable(2), c.Reachable(3)})

	p, err := New(c)
	require.NoError(t, err)
	for i := range c.Lanes {
		assert.Equal(t, c.Reachable(i), p.LaneStat(i).MaxConns, "lane %d: LaneStat.MaxConns is the effective cap", i)
	}
}

func TestValidate(t *testing.T) {
	lanes := func(l ...LaneConfig) []LaneConfig { return l }
	tests := []struct {
		name        string
		cfg         Config
		lane, field string
		msg         string
	}{
		{"zero size", Config{Size: 0, Lanes: lanes(LaneConfig{Name: "a", Bounded: true})},
			"", "Size", "reserve: Size 0 must be at least 1"},
		{"size past int32", Config{Size: math.MaxInt32 + 1, Lanes: lanes(LaneConfig{Name: "a", Bounded: true})},
			"", "Size", "reserve: Size 2147483648 exceeds 2147483647"},
		{"no lanes", Config{Size: 2},
			"", "Name", "reserve: Name of lane 0 missing: a pool needs at least one lane"},
		{"empty name", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", Bounded: true}, LaneConfig{Bounded: true})},
			"", "Name", "reserve: Name of lane 1 is empty"},
		{"duplicate name", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", Bounded: true}, LaneConfig{Name: "a", Bounded: true})},
			"a", "Name", `reserve: lane "a": Name is used by lanes 0 and 1`},
		{"negative reserve", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", Reserved: -1})},
			"a", "Reserved", `reserve: lane "a": Reserved -1 is negative`},
		{"negative cap", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", MaxConns: -1})},
			"a", "MaxConns", `reserve: lane "a": MaxConns -1 is negative`},
		{"negative waiters", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", MaxWaiters: -1})},
			"a", "MaxWaiters", `reserve: lane "a": MaxWaiters -1 is negative`},
		{"negative timeout", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", AcquireTimeout: -time.Second})},
			"a", "AcquireTimeout", `reserve: lane "a": AcquireTimeout -1s is negative`},
		{"negative priority age", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", PriorityAge: -time.Second})},
			"a", "PriorityAge", `reserve: lane "a": PriorityAge -1s is negative`},
		{"negative tag share", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", MaxTagShare: -1})},
			"a", "MaxTagShare", `reserve: lane "a": MaxTagShare -1 is negative`},
		{"negative headroom", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", PriorityAge: time.Second, PriorityHeadroom: -1})},
			"a", "PriorityHeadroom", `reserve: lane "a": PriorityHeadroom -1 is negative`},
		{"headroom without priorities", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", PriorityHeadroom: 1})},
			"a", "PriorityHeadroom", `reserve: lane "a": PriorityHeadroom needs PriorityAge: without it the lane is FIFO and ignores priorities`},
		{"headroom of the whole lane", Config{Size: 4, Lanes: lanes(LaneConfig{Name: "a", MaxConns: 2, PriorityAge: time.Second, PriorityHeadroom: 2, Bounded: true})},
			"a", "PriorityHeadroom", `reserve: lane "a": PriorityHeadroom 2 leaves callers of negative priority none of the lane's 2 slots`},
		{"cap above size", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", MaxConns: 3, Bounded: true})},
			"a", "MaxConns", `reserve: lane "a": MaxConns 3 exceeds Size 2`},
		{"reserve above cap", Config{Size: 4, Lanes: lanes(LaneConfig{Name: "a", Reserved: 3, MaxConns: 2})},
			"a", "Reserved", `reserve: lane "a": Reserved 3 exceeds MaxConns 2`},
		{"reserves above size", Config{Size: 4, Lanes: lanes(LaneConfig{Name: "a", Reserved: 3}, LaneConfig{Name: "b", Reserved: 2})},
			"b", "Reserved", `reserve: lane "b": Reserved 2 exceeds the 1 slots of Size 4 that the lanes before it leave unreserved`},
		{"huge reserve does not overflow the sum", Config{Size: 4, Lanes: lanes(LaneConfig{Name: "a", Reserved: 1}, LaneConfig{Name: "b", Reserved: math.MaxInt})},
			"b", "Reserved", `reserve: lane "b": Reserved 9223372036854775807 exceeds the 3 slots of Size 4 that the lanes before it leave unreserved`},
		{"unbounded cap beyond its reach", Config{Size: 9, Lanes: lanes(LaneConfig{Name: "short", Reserved: 3, Bounded: true}, LaneConfig{Name: "tx", Reserved: 3, MaxConns: 8})},
			"tx", "MaxConns", `reserve: lane "tx": MaxConns 8 exceeds the 6 slots the lane can reach (its reserve 3 + 3 shared)`},
		{"unbounded lane that could never acquire", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", Reserved: 2, Bounded: true}, LaneConfig{Name: "b"})},
			"b", "Reserved", `reserve: lane "b": Reserved 0 leaves the unbounded lane no slot: the reserves take all 2 slots`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.cfg)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, tc.lane, ce.Lane)
			assert.Equal(t, tc.field, ce.Field)
			assert.EqualError(t, err, tc.msg)

			p, err := New(tc.cfg)
			assert.Nil(t, p)
			assert.EqualError(t, err, tc.msg, "New reports what Validate does")
		})
	}
	// The limits themselves are accepted.
	require.NoError(t, Validate(Config{Size: 9, Lanes: lanes(LaneConfig{Name: "short", Reserved: 3, Bounded: true}, LaneConfig{Name: "tx", Reserved: 3, MaxConns: 6})}))
	require.NoError(t, Validate(Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", Reserved: 2, MaxConns: 2, Bounded: true}, LaneConfig{Name: "b", Bounded: true})}))
}

func TestFIFOWithinLaneAndReserveFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newTestPool(t, nil)
		held := mustTake(t, p, short, 8) // short borrowed everything
		order := make(chan string, 3)
		start := func(lane int, name string) {
			go func() {
				s, err := p.Acquire(context.Background(), lane)
				if assert.NoError(t, err) {
					assert.True(t, s.Waited())
					order <- name
				}
			}()
			synctest.Wait() // it has queued
		}
		start(short, "short1")
		start(short, "short2")
		start(tx, "tx1") // arrives last, but tx is below its reserve: served first
		require.Equal(t, 2, p.LaneStat(short).Waiting)

		p.Release(held[0])
		require.Equal(t, "tx1", <-order, "a lane below its reserve goes first")
		for _, want := range []string{"short1", "short2"} {
			p.Release(held[1])
			held = held[1:]
			require.Equal(t, want, <-order, "FIFO within a lane")
		}
		requireInvariants(t, p)
	})
}

func TestAcquireTimeoutAndLaneFull(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		p := newTestPool(t, func(c *Config) {
			c.Lanes[long].AcquireTimeout = 50 * time.Millisecond
			c.Lanes[long].MaxWaiters = 1
		})
		mustTake(t, p, long, 2)
		errc := make(chan error, 1)
		go func() { _, err := p.Acquire(context.Background(), long); errc <- err }()
		synctest.Wait()

		_, err := p.Acquire(context.Background(), long)
		require.ErrorIs(t, err, ErrLaneFull)
		require.EqualError(t, err, "reserve: long lane: wait queue full, caller refused (in use 2/2, waiting 1)")

		err = <-errc
		require.ErrorIs(t, err, ErrAcquireTimeout)
		var ae *AcquireError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, AcquireError{Lane: "long", Waited: 50 * time.Millisecond, InUse: 2, MaxConns: 2, Err: ErrAcquireTimeout}, *ae)
		assert.EqualError(t, err, "reserve: long lane: acquire timed out after 50ms (in use 2/2, waiting 0)")
		st := p.LaneStat(long)
		assert.Zero(t, st.Waiting)
		assert.Equal(t, 2, st.InUse)
		requireInvariants(t, p)
	})
}

func TestContextEndsWait(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		p := newTestPool(t, nil)
		mustTake(t, p, short, 8)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		_, err := p.Acquire(ctx, tx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		var ae *AcquireError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, 20*time.Millisecond, ae.Waited)
		assert.EqualError(t, err, "reserve: tx lane: acquire gave up after 20ms: context deadline exceeded (in use 0/5, waiting 0)")
		assert.Zero(t, p.LaneStat(tx).Waiting)
		requireInvariants(t, p)

		// An already-done ctx never gets a slot, even when one is free.
		p2 := newTestPool(t, nil)
		_, err = p2.Acquire(ctx, short)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 8, p2.Stat().Free)
	})
}

func TestCloseWakesWaiters(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		p := newTestPool(t, nil)
		held := mustTake(t, p, short, 8)
		errc := make(chan error, 3)
		for _, lane := range []int{short, tx, long} {
			go func() { _, err := p.Acquire(context.Background(), lane); errc <- err }()
		}
		synctest.Wait()
		p.Close()
		for range 3 {
			require.ErrorIs(t, <-errc, ErrClosed)
		}
		_, err := p.Acquire(context.Background(), short)
		require.ErrorIs(t, err, ErrClosed)
		_, ok := p.TryAcquire(short)
		require.False(t, ok)
		for _, s := range held {
			p.Release(s)
		}
		assert.Equal(t, 8, p.Stat().Free)
	})
}

func TestDoubleReleasePanics(t *testing.T) {
	p := newTestPool(t, nil)
	s := mustTake(t, p, short, 1)[0]
	p.Release(s)
	// The slot is taken again by someone else: a late second release must still be caught.
	again := mustTake(t, p, tx, 1)[0]
	require.Equal(t, s.idx, again.idx, "the test needs the same slot reused")
	require.PanicsWithValue(t, `reserve: slot 0 of lane "short" released twice`, func() { p.Release(s) })
	requireInvariants(t, p)
	p.Release(again)
	require.PanicsWithValue(t, "reserve: Release of a Slot that Acquire did not return", func() { p.Release(Slot{}) })
}

func TestSlotWaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newTestPool(t, nil)
		s, err := p.Acquire(context.Background(), short)
		require.NoError(t, err)
		assert.False(t, s.Waited(), "a slot taken at once")
		held := mustTake(t, p, short, 7)
		go func() {
			time.Sleep(time.Second)
			p.Release(held[0])
		}()
		s2, err := p.Acquire(context.Background(), short)
		require.NoError(t, err)
		assert.True(t, s2.Waited(), "a slot granted to a waiter")
	})
}

// TestGrantCancelRace: a waiter is granted a slot at the same instant its wait ends (ctx
// cancelled, or its AcquireTimeout runs out). Whichever wins, no slot leaks and no slot is
// held twice.
func TestGrantCancelRace(t *testing.T) {
	defer goleak.VerifyNone(t)
	const timeout = time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		var granted, gaveUp int
		for i := range 600 {
			p := newTestPool(t, func(c *Config) { c.Lanes[short].AcquireTimeout = timeout })
			held := mustTake(t, p, short, 8)
			ctx, cancel := context.WithCancel(context.Background())
			res := make(chan Slot, 1)
			go func() {
				s, err := p.Acquire(ctx, short)
				if err != nil {
					s = Slot{}
				}
				res <- s
			}()
			synctest.Wait()
			switch i % 3 {
			case 0:
				go cancel()
			case 1:
				cancel()
			case 2:
				time.Sleep(timeout) // the timer fires at this instant too
			}
			p.Release(held[0])
			if s := <-res; s != (Slot{}) {
				granted++
				p.Release(s)
			} else {
				gaveUp++
			}
			for _, h := range held[1:] {
				p.Release(h)
			}
			require.Equal(t, 8, p.Stat().Free, "leaked a slot")
			requireInvariants(t, p)
			cancel()
		}
		t.Logf("granted %d, gave up %d", granted, gaveUp)
	})
}

// TestGrantedWhileGivingUp: the grant happens first, then the waiter's ctx ends before it saw
// the grant. The slot goes back and passes on to the next waiter.
func TestGrantedWhileGivingUp(t *testing.T) {
	p := newTestPool(t, nil)
	held := mustTake(t, p, short, 8)
	p.mu.Lock()
	w1 := p.enqueueLocked(short, Caller{})
	ready1, since1 := w1.ready, w1.since
	ready2 := p.enqueueLocked(short, Caller{}).ready
	p.mu.Unlock()
	p.Release(held[0]) // granted to w1
	_, err := p.abandon(w1, ready1, short, since1, context.Canceled)
	require.ErrorIs(t, err, context.Canceled)
	select {
	case s := <-ready2:
		require.Equal(t, held[0].idx, s.idx)
	default:
		require.Fail(t, "the slot w1 gave back did not pass on to w2")
	}
	require.Zero(t, p.Stat().Free)
	requireInvariants(t, p)
}

// TestLaneStat: the live figures, including the oldest waiter's age.
func TestLaneStat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newTestPool(t, nil)
		mustTake(t, p, short, 5)
		mustTake(t, p, tx, 3)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { _, _ = p.Acquire(ctx, tx) }()
		synctest.Wait()
		time.Sleep(3 * time.Second)
		go func() { _, _ = p.Acquire(ctx, tx) }()
		synctest.Wait()
		time.Sleep(time.Second)
		assert.Equal(t, LaneStat{Name: "tx", Reserved: 4, MaxConns: 5, InUse: 3, Waiting: 2, OldestWait: 4 * time.Second}, p.LaneStat(tx))
		assert.Equal(t, Stat{Size: 8, Free: 0, Shared: 2, Lanes: []LaneStat{
			{Name: "short", Bounded: true, Reserved: 2, MaxConns: 8, InUse: 5, Borrowed: 3},
			{Name: "tx", Reserved: 4, MaxConns: 5, InUse: 3, Waiting: 2, OldestWait: 4 * time.Second},
			{Name: "long", MaxConns: 2},
		}}, p.Stat())
		cancel()
		synctest.Wait()
		assert.Zero(t, p.LaneStat(tx).Waiting)
	})
}

func TestUncontendedAcquireAllocatesNothing(t *testing.T) {
	p := newTestPool(t, nil)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		s, err := p.Acquire(ctx, short)
		if err != nil {
			panic(err)
		}
		p.Release(s)
	})
	assert.Zero(t, allocs)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { _ = p.LaneStat(tx) }), "LaneStat")

	// A lane ordered by priority, with a tag share: its uncontended path is the same.
	p = newTestPool(t, func(c *Config) { c.Lanes[tx].PriorityAge, c.Lanes[tx].MaxTagShare = time.Second, 2 })
	allocs = testing.AllocsPerRun(1000, func() {
		s, err := p.AcquireAs(ctx, tx, Caller{Priority: 10, Tag: "checkout"})
		if err != nil {
			panic(err)
		}
		p.Release(s)
	})
	assert.Zero(t, allocs, "priority and tag share")
}

// TestHugeSizeAllocatesLittle: memory follows the slots held, not Size.
func TestHugeSizeAllocatesLittle(t *testing.T) {
	cfg := Config{Size: math.MaxInt32, Lanes: []LaneConfig{
		{Name: "short", Reserved: 10, Bounded: true},
		{Name: "tx", Reserved: math.MaxInt32 / 2},
		{Name: "long", MaxConns: 1000},
	}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	p, err := New(cfg)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4096), "bytes allocated by New")
	t.Logf("New(Size %d) allocated %d bytes in %d allocations", cfg.Size, after.TotalAlloc-before.TotalAlloc, after.Mallocs-before.Mallocs)

	const peak = 3000
	var held []Slot
	for i := range peak {
		s, err := p.Acquire(context.Background(), i%3)
		require.NoError(t, err)
		held = append(held, s)
	}
	for _, s := range held {
		p.Release(s)
	}
	for range 10 * peak { // the table does not grow past the peak held
		s, ok := p.TryAcquire(tx)
		require.True(t, ok)
		p.Release(s)
	}
	assert.Len(t, p.slots, peak)
	assert.Equal(t, math.MaxInt32, p.Stat().Free)
	requireInvariants(t, p)
}

// TestStress runs random acquires, releases, cancels and timeouts across lanes, by callers of
// random priorities and tags, and checks the invariants after every step. Short and tx order
// by priority with ageing and keep a headroom of one slot, tx has a tag share, long is FIFO. PGXLANES_STRESS sets its length (a Go duration, default 3s; 300ms
// with -short).
func TestStress(t *testing.T) {
	defer goleak.VerifyNone(t)
	d := 3 * time.Second
	if testing.Short() {
		d = 300 * time.Millisecond
	}
	if v := os.Getenv("PGXLANES_STRESS"); v != "" {
		var err error
		d, err = time.ParseDuration(v)
		require.NoError(t, err, "PGXLANES_STRESS")
	}
	cfg := testConfig()
	cfg.Lanes[short].MaxWaiters = 20
	cfg.Lanes[long].AcquireTimeout = 2 * time.Millisecond
	cfg.Lanes[short].PriorityAge = time.Millisecond
	cfg.Lanes[tx].PriorityAge = 2 * time.Millisecond
	cfg.Lanes[tx].MaxTagShare = 2
	cfg.Lanes[short].PriorityHeadroom = 1
	cfg.Lanes[tx].PriorityHeadroom = 1
	p, err := New(cfg)
	require.NoError(t, err)
	var holding [3]atomic.Int64
	var acquires, capViolations, indexClashes atomic.Int64
	// byIndex[i] is 1 while a holder has the slot of Index i: no two held slots share one.
	byIndex := make([]atomic.Int32, cfg.Size)
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for time.Now().Before(stop) {
				lane := rng.IntN(3)
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if rng.IntN(3) == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(500))*time.Microsecond)
				}
				c := Caller{Priority: []int{-10, 0, 10, 20}[rng.IntN(4)], Tag: []string{"", "a", "b"}[rng.IntN(3)]}
				s, err := p.AcquireAs(ctx, lane, c)
				cancel()
				if err == nil {
					acquires.Add(1)
					if i := s.Index(); i < 0 || i >= cfg.Size || !byIndex[i].CompareAndSwap(0, 1) {
						indexClashes.Add(1)
						t.Errorf("slot index %d: out of [0, %d) or held twice", i, cfg.Size)
						return
					}
					if n := holding[lane].Add(1); n > int64(cfg.Reachable(lane)) {
						capViolations.Add(1)
					}
					if e := p.checkInvariants(); e != nil {
						t.Error(e)
						return
					}
					if rng.IntN(4) == 0 {
						time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
					}
					holding[lane].Add(-1)
					byIndex[s.Index()].Store(0)
					p.Release(s)
				} else if !errors.Is(err, ErrLaneFull) && !errors.Is(err, ErrAcquireTimeout) && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("unexpected error %v", err)
					return
				}
				if e := p.checkInvariants(); e != nil {
					t.Error(e)
					return
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, capViolations.Load(), "cap violations seen by holders")
	require.Zero(t, indexClashes.Load(), "slot indexes shared by two holders")
	require.Positive(t, acquires.Load(), "stress made no acquires")
	st := p.Stat()
	require.Equal(t, st.Size, st.Free, "at quiescence")
	for _, l := range st.Lanes {
		require.Zero(t, l.InUse, l.Name)
		require.Zero(t, l.Waiting, l.Name)
	}
	requireInvariants(t, p)
	t.Logf("%v: %d acquires; short: %d aged grants; tx: %d aged grants, %d tag-share refusals", d, acquires.Load(),
		st.Lanes[short].AgedGrants, st.Lanes[tx].AgedGrants, st.Lanes[tx].TagShareRefusals)
}

// TestBadLaneIndex: an index that names no lane gets an error that names it (AcquireAs), no
// slot (TryAcquireAs) or the zero LaneStat, never a panic; and the pool goes on working (a panic
// under the pool's lock would leave every later call blocked).
func TestBadLaneIndex(t *testing.T) {
	p, err := New(Config{Size: 2, Lanes: []LaneConfig{{Name: "a", Bounded: true}}})
	require.NoError(t, err)
	for _, i := range []int{-1, 1, 1 << 40} {
		_, err := p.AcquireAs(context.Background(), i, Caller{Priority: -1, Tag: "x"})
		require.ErrorIs(t, err, ErrNoLane)
		assert.Contains(t, err.Error(), fmt.Sprintf("lane index i = %d, and the pool has 1 lanes", i))
		_, ok := p.TryAcquireAs(i, "x")
		assert.False(t, ok)
		assert.Equal(t, LaneStat{}, p.LaneStat(i))
	}
	s, ok := p.TryAcquire(0)
	require.True(t, ok, "the pool still grants slots")
	p.Release(s)
	assert.Equal(t, 0, p.LaneStat(0).InUse)
}
