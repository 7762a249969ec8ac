package reserve

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// TestRecycledWaiterNoStaleTimer: a recycled waiter keeps its timer, and recycle relies on
// Go 1.23's synchronous timer channels (Stop discards a fire nobody received). Under
// GODEBUG=asynctimerchan=1, which a program may set (env, //go:debug, or a go.mod godebug line),
// the timer channel is buffered again: a waiter granted a slot whose timer fired before it ran
// keeps the fire in its channel, and the next waiter to reuse it times out at once.
func TestRecycledWaiterNoStaleTimer(t *testing.T) {
	if os.Getenv("RESERVE_WAITER_CHILD") != "" {
		runtime.GOMAXPROCS(1)
		staleTimerScenario(t)
		return
	}
	staleTimerScenario(t) // default timer semantics: passes
	cmd := exec.Command(os.Args[0], "-test.run=^TestRecycledWaiterNoStaleTimer$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RESERVE_WAITER_CHILD=1", "GODEBUG=asynctimerchan=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("with GODEBUG=asynctimerchan=1: %v\n%s", err, out)
	}
}

func staleTimerScenario(t *testing.T) {
	ctx := context.Background()
	p, err := New(Config{Size: 1, Lanes: []LaneConfig{
		{Name: "race", Bounded: true, AcquireTimeout: time.Millisecond},
		{Name: "check", Bounded: true, AcquireTimeout: 2 * time.Second},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for attempt := range 10 {
		// A waiter is granted a slot; its 1 ms timer fires before it runs again.
		s, _ := p.TryAcquire(0)
		res := make(chan error, 1)
		go func() {
			s, err := p.Acquire(ctx, 0)
			if err == nil {
				p.Release(s)
			}
			res <- err
		}()
		for p.LaneStat(0).Waiting == 0 {
			runtime.Gosched()
		}
		p.Release(s)
		for spin := time.Now(); time.Since(spin) < 3*time.Millisecond; {
		}
		<-res
		// The next wait must last until the slot is released, 50 ms later.
		s, ok := p.TryAcquire(1)
		if !ok {
			t.Fatal("slot not free")
		}
		go func() {
			time.Sleep(50 * time.Millisecond)
			p.Release(s)
		}()
		start := time.Now()
		s2, err := p.Acquire(ctx, 1)
		if err != nil {
			t.Fatalf("attempt %d: wait ended after %v with %v (ErrAcquireTimeout: %v), want a slot after 50ms",
				attempt, time.Since(start).Round(time.Microsecond), err, errors.Is(err, ErrAcquireTimeout))
		}
		p.Release(s2)
	}
}
