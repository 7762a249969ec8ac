package reserve

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const (
	short = 0
	tx    = 1
	long  = 2
)

// newTestPool: 8 slots; short reserves 2 (bounded, may borrow), tx reserves 4 with cap 6, long
// reserves 0 with cap 2; 2 slots are shared.
func newTestPool(t testing.TB, mod func(*Config)) *Pool {
	t.Helper()
	cfg := Config{Size: 8, Lanes: []LaneConfig{
		{Name: "short", Reserved: 2, Bounded: true},
		{Name: "tx", Reserved: 4, MaxConns: 6},
		{Name: "long", Reserved: 0, MaxConns: 2},
	}}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustTake(t *testing.T, p *Pool, lane, n int) []Slot {
	t.Helper()
	var s []Slot
	for range n {
		sl, ok := p.TryAcquire(lane)
		if !ok {
			t.Fatalf("setup: lane %d could not take slot %d of %d", lane, len(s)+1, n)
		}
		s = append(s, sl)
	}
	return s
}

func TestAdmissionTable(t *testing.T) {
	tests := []struct {
		name            string
		short, tx, long int // slots held, taken in the order short, tx, long
		lane            int
		want            bool
	}{
		{"empty pool: short", 0, 0, 0, short, true},
		{"empty pool: tx", 0, 0, 0, tx, true},
		{"empty pool: long", 0, 0, 0, long, true},
		{"tx within its reserve", 0, 3, 0, tx, true},
		{"tx into shared", 0, 4, 0, tx, true},
		{"tx at its cap", 0, 6, 0, tx, false},
		{"tx may not take the short reserve", 0, 6, 0, tx, false},
		{"long may not take the short reserve after tx used shared", 0, 6, 0, long, false},
		{"long takes shared", 0, 4, 1, long, true},
		{"long at its cap", 0, 4, 2, long, false},
		{"shared used up by long: tx above reserve refused", 0, 4, 2, tx, false},
		{"shared used up by long: tx still has its reserve", 0, 3, 2, tx, true},
		{"short reserve always free for short", 0, 6, 0, short, true},
		{"short borrows idle tx reserve", 2, 0, 0, short, true},
		{"short borrows up to every free slot", 7, 0, 0, short, true},
		{"pool full: short waits", 8, 0, 0, short, false},
		{"short borrowing does not use up the unbounded lanes' shared slots", 4, 0, 0, long, true},
		{"short borrowed shared: tx keeps its reserve", 4, 0, 0, tx, true},
		{"short borrowed tx reserve: tx waits", 6, 1, 0, tx, true},
		{"short borrowed all but one: tx takes last", 7, 0, 0, tx, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPool(t, nil)
			mustTake(t, p, short, tc.short)
			mustTake(t, p, tx, tc.tx)
			mustTake(t, p, long, tc.long)
			if err := p.checkInvariants(); err != nil {
				t.Fatal(err)
			}
			_, got := p.TryAcquire(tc.lane)
			if got != tc.want {
				t.Fatalf("TryAcquire(lane %d) = %v, want %v (stat %+v)", tc.lane, got, tc.want, p.Stat())
			}
			if err := p.checkInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBorrowingLimit(t *testing.T) {
	// With a short cap, short borrows only up to its cap even if slots are free.
	p := newTestPool(t, func(c *Config) { c.Lanes[short].MaxConns = 3 })
	mustTake(t, p, short, 3)
	if _, ok := p.TryAcquire(short); ok {
		t.Fatal("short took a slot beyond its cap")
	}
	// Unbounded lanes can never exceed Size - Reserved(short), whatever the order.
	p = newTestPool(t, nil)
	n := 0
	for _, lane := range []int{long, tx, long, tx, tx, tx, tx, tx, tx, long} {
		if _, ok := p.TryAcquire(lane); ok {
			n++
		}
	}
	if n != 6 {
		t.Fatalf("unbounded lanes took %d slots, want 6 (Size 8 - short reserve 2)", n)
	}
}

func TestValidation(t *testing.T) {
	lanes := func(l ...LaneConfig) []LaneConfig { return l }
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"zero size", Config{Size: 0, Lanes: lanes(LaneConfig{Name: "a", Bounded: true})}, "Size must be at least 1"},
		{"no lanes", Config{Size: 2}, "at least one lane"},
		{"empty name", Config{Size: 2, Lanes: lanes(LaneConfig{Bounded: true})}, "lane 0: Name must not be empty"},
		{"duplicate", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", Bounded: true}, LaneConfig{Name: "a", Bounded: true})}, `lane "a": duplicate Name`},
		{"negative reserve", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", Reserved: -1})}, `lane "a": Reserved must not be negative`},
		{"negative cap", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", MaxConns: -1})}, `lane "a": MaxConns must not be negative`},
		{"negative waiters", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", MaxWaiters: -1})}, `lane "a": MaxWaiters must not be negative`},
		{"negative timeout", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", AcquireTimeout: -1})}, `lane "a": AcquireTimeout must not be negative`},
		{"cap above size", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", MaxConns: 3})}, `lane "a": MaxConns 3 exceeds Size 2`},
		{"reserve above cap", Config{Size: 4, Lanes: lanes(LaneConfig{Name: "a", Reserved: 3, MaxConns: 2})}, `lane "a": Reserved 3 exceeds MaxConns 2`},
		{"reserves above size", Config{Size: 4, Lanes: lanes(LaneConfig{Name: "a", Reserved: 3}, LaneConfig{Name: "b", Reserved: 2})}, "reserve 5 slots in all, more than Size 4"},
		{"unbounded lane that could never acquire", Config{Size: 2, Lanes: lanes(LaneConfig{Name: "a", Reserved: 2}, LaneConfig{Name: "b"})}, `lane "b": unbounded lane with Reserved 0 and no shared slots`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg)
			if err == nil || p != nil {
				t.Fatalf("New accepted %+v", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// waitQueued polls until lane i has n waiters (the acquire goroutines have enqueued).
func waitQueued(t *testing.T, p *Pool, lane, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.LaneStat(lane).Waiting != n {
		if time.Now().After(deadline) {
			t.Fatalf("lane %d: waiting %d, want %d", lane, p.LaneStat(lane).Waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFIFOWithinLaneAndReserveFirst(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := newTestPool(t, nil)
	held := mustTake(t, p, short, 8) // short borrowed everything
	ctx := context.Background()
	order := make(chan string, 8)
	var wg sync.WaitGroup
	start := func(lane int, name string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := p.Acquire(ctx, lane)
			if err != nil {
				t.Error(err)
				return
			}
			order <- name
			_ = s // kept: the test checks who got a slot, not releases
		}()
	}
	start(short, "short1")
	waitQueued(t, p, short, 1)
	start(short, "short2")
	waitQueued(t, p, short, 2)
	start(tx, "tx1") // arrives last but tx is below its reserve: served first
	waitQueued(t, p, tx, 1)

	p.Release(held[0])
	if got := <-order; got != "tx1" {
		t.Fatalf("first grant went to %s, want tx1 (below reserve)", got)
	}
	for i, want := range []string{"short1", "short2"} {
		p.Release(held[1+i])
		if got := <-order; got != want {
			t.Fatalf("grant %d went to %s, want %s (FIFO)", i+2, got, want)
		}
	}
	wg.Wait()
	if err := p.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

func TestAcquireTimeoutAndLaneFull(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := newTestPool(t, func(c *Config) {
		c.Lanes[long].AcquireTimeout = 50 * time.Millisecond
		c.Lanes[long].MaxWaiters = 1
	})
	mustTake(t, p, long, 2)
	errc := make(chan error, 1)
	go func() { _, err := p.Acquire(context.Background(), long); errc <- err }()
	waitQueued(t, p, long, 1)

	_, err := p.Acquire(context.Background(), long)
	if !errors.Is(err, ErrLaneFull) {
		t.Fatalf("second waiter: %v, want ErrLaneFull", err)
	}
	if want := "reserve: long lane: wait queue full, caller refused (in use 2/2, waiting 1)"; err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}
	err = <-errc
	if !errors.Is(err, ErrAcquireTimeout) {
		t.Fatalf("first waiter: %v, want ErrAcquireTimeout", err)
	}
	var ae *AcquireError
	if !errors.As(err, &ae) || ae.Lane != "long" || ae.Waited < 50*time.Millisecond || ae.InUse != 2 || ae.MaxConns != 2 {
		t.Fatalf("error fields: %+v", ae)
	}
	if !strings.HasPrefix(err.Error(), "reserve: long lane: acquire timed out after ") || !strings.HasSuffix(err.Error(), "(in use 2/2, waiting 0)") {
		t.Fatalf("message %q", err)
	}
	st := p.LaneStat(long)
	if st.Timeouts != 1 || st.Rejections != 1 || st.Waiting != 0 || st.InUse != 2 {
		t.Fatalf("stat %+v", st)
	}
	if err := p.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

func TestContextEndsWait(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := newTestPool(t, nil)
	mustTake(t, p, short, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := p.Acquire(ctx, tx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	// An already-done ctx never gets a slot, even when one is free.
	p2 := newTestPool(t, nil)
	if _, err := p2.Acquire(ctx, short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("done ctx: %v", err)
	}
	if st := p.LaneStat(tx); st.Cancels != 1 || st.Waiting != 0 {
		t.Fatalf("stat %+v", st)
	}
	if err := p.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

func TestCloseWakesWaiters(t *testing.T) {
	defer goleak.VerifyNone(t)
	p := newTestPool(t, nil)
	held := mustTake(t, p, short, 8)
	errc := make(chan error, 3)
	for _, lane := range []int{short, tx, long} {
		go func() { _, err := p.Acquire(context.Background(), lane); errc <- err }()
		waitQueued(t, p, lane, 1)
	}
	p.Close()
	for range 3 {
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Fatalf("waiter got %v, want ErrClosed", err)
		}
	}
	if _, err := p.Acquire(context.Background(), short); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire after close: %v", err)
	}
	for _, s := range held {
		p.Release(s)
	}
	if st := p.Stat(); st.Free != 8 {
		t.Fatalf("free %d after releasing all", st.Free)
	}
}

func TestDoubleReleasePanics(t *testing.T) {
	p := newTestPool(t, nil)
	s := mustTake(t, p, short, 1)[0]
	p.Release(s)
	// The slot is taken again by someone else: a late second release must still be caught.
	again := mustTake(t, p, tx, 1)[0]
	func() {
		defer func() {
			r := recover()
			if r == nil || !strings.Contains(r.(string), "released twice") {
				t.Fatalf("recover() = %v, want a double-release panic", r)
			}
		}()
		p.Release(s)
	}()
	if err := p.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	p.Release(again)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("zero Slot release did not panic")
			}
		}()
		p.Release(Slot{})
	}()
}

// TestGrantCancelRace: a waiter is granted a slot at the same instant its ctx ends. Whichever wins,
// no slot leaks and no slot is held twice.
func TestGrantCancelRace(t *testing.T) {
	defer goleak.VerifyNone(t)
	for range 500 {
		p := newTestPool(t, nil)
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
		waitQueued(t, p, short, 1)
		go cancel()
		p.Release(held[0])
		s := <-res
		if s.Valid() {
			p.Release(s)
		}
		for _, h := range held[1:] {
			p.Release(h)
		}
		if st := p.Stat(); st.Free != 8 {
			t.Fatalf("leaked: free %d of 8", st.Free)
		}
		if err := p.checkInvariants(); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
}

// TestStress runs random acquires, releases, cancels and timeouts across lanes and checks the
// invariants after every step. PGXLANES_STRESS sets its length (a Go duration, default 3s).
func TestStress(t *testing.T) {
	defer goleak.VerifyNone(t)
	d := 3 * time.Second
	if v := os.Getenv("PGXLANES_STRESS"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("PGXLANES_STRESS: %v", err)
		}
	}
	if testing.Short() {
		d = 300 * time.Millisecond
	}
	p := newTestPool(t, func(c *Config) {
		c.Lanes[short].MaxWaiters = 20
		c.Lanes[long].AcquireTimeout = 2 * time.Millisecond
	})
	var holding [3]atomic.Int64
	var violations atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			for time.Now().Before(stop) {
				lane := rng.IntN(3)
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if rng.IntN(3) == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(500))*time.Microsecond)
				}
				s, err := p.Acquire(ctx, lane)
				cancel()
				if err == nil {
					if n := holding[lane].Add(1); n > int64(p.LaneConfig(lane).MaxConns) {
						violations.Add(1)
					}
					if e := p.checkInvariants(); e != nil {
						t.Error(e)
						return
					}
					if rng.IntN(4) == 0 {
						time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
					}
					holding[lane].Add(-1)
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
		}()
	}
	wg.Wait()
	if violations.Load() != 0 {
		t.Fatalf("%d cap violations seen by holders", violations.Load())
	}
	st := p.Stat()
	if st.Free != st.Size {
		t.Fatalf("at quiescence free %d of %d", st.Free, st.Size)
	}
	var acquires int64
	for _, l := range st.Lanes {
		if l.InUse != 0 || l.Waiting != 0 {
			t.Fatalf("lane %s at quiescence: %+v", l.Name, l)
		}
		acquires += l.Acquires
	}
	if acquires == 0 {
		t.Fatal("stress made no acquires")
	}
	t.Logf("%v: %d acquires; %+v", d, acquires, st.Lanes)
	if err := p.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}
