package reserve

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWaitersAcrossBubbles: waits inside a testing/synctest bubble and waits outside it must not
// share a channel or a timer, whether they use different pools or the same one. A process-wide
// cache of waiters (with their timers and channels) did: a waiter whose timer was made in a
// bubble and reused outside it makes the runtime stop the whole process ("fatal error: reset of
// synctest timer from outside bubble"), which no recover can catch. So the scenario runs in a
// child process, and the parent checks that the child passed.
func TestWaitersAcrossBubbles(t *testing.T) {
	if os.Getenv("RESERVE_BUBBLE_CHILD") != "" {
		// One P: a cache per P, such as a sync.Pool, hands back what was just put in it.
		runtime.GOMAXPROCS(1)
		shared := newBubblePool(t) // used on both sides
		for range 5 {
			synctest.Test(t, func(t *testing.T) {
				waitAndTimeOut(t, newBubblePool(t))
				waitAndGetSlot(t, newBubblePool(t))
				waitAndTimeOut(t, shared)
				waitAndGetSlot(t, shared)
			})
			waitAndTimeOut(t, newBubblePool(t)) // outside any bubble
			waitAndGetSlot(t, newBubblePool(t))
			waitAndTimeOut(t, shared)
			waitAndGetSlot(t, shared)
		}
		return
	}
	// A waiter made outside a bubble and reused inside one hangs instead: the timeout bounds that.
	cmd := exec.Command(os.Args[0], "-test.run=^TestWaitersAcrossBubbles$", "-test.count=1", "-test.v", "-test.timeout=1m")
	cmd.Env = append(os.Environ(), "RESERVE_BUBBLE_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child process:\n%s", out)
	assert.NotContains(t, string(out), "fatal error")
	assert.Contains(t, string(out), "--- PASS: TestWaitersAcrossBubbles")
}

// newBubblePool: one slot; lane 0 times out after 1ms, lane 1 waits up to an hour.
func newBubblePool(t *testing.T) *Pool {
	p, err := New(Config{Size: 1, Lanes: []LaneConfig{
		{Name: "a", Bounded: true, AcquireTimeout: time.Millisecond},
		{Name: "b", Bounded: true, AcquireTimeout: time.Hour},
	}})
	require.NoError(t, err)
	return p
}

// waitAndTimeOut makes a caller queue on a full lane until its AcquireTimeout runs out.
func waitAndTimeOut(t *testing.T, p *Pool) {
	held, ok := p.TryAcquire(0)
	require.True(t, ok)
	_, err := p.Acquire(context.Background(), 0)
	require.ErrorIs(t, err, ErrAcquireTimeout)
	p.Release(held)
}

// waitAndGetSlot makes a caller queue on a full lane until a slot is released to it.
func waitAndGetSlot(t *testing.T, p *Pool) {
	held, ok := p.TryAcquire(1)
	require.True(t, ok)
	go func() {
		for p.LaneStat(1).Waiting == 0 {
			runtime.Gosched()
		}
		p.Release(held)
	}()
	s, err := p.Acquire(context.Background(), 1)
	require.NoError(t, err)
	p.Release(s)
}
