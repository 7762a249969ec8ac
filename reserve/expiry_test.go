package reserve

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExpiryPerWaiter: one timer per lane fails each waiter at its own deadline, its arrival
// plus the lane's AcquireTimeout, whatever its priority; a waiter granted before its deadline is
// not failed; the timer is dropped when the queue empties and made again when it fills.
func TestExpiryPerWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		p := oneLane(t, 1, func(lc *LaneConfig) { lc.AcquireTimeout, lc.PriorityAge = timeout, time.Hour })
		held, ok := p.TryAcquire(0)
		require.True(t, ok)
		start := time.Now()

		type outcome struct {
			name string
			at   time.Duration
			err  error
			s    Slot
		}
		out := make(chan outcome, 4)
		var wg sync.WaitGroup
		wait := func(name string, prio int) {
			wg.Go(func() {
				s, err := p.AcquireAs(context.Background(), 0, Caller{Priority: prio})
				out <- outcome{name, time.Since(start), err, s}
			})
			synctest.Wait()
		}
		wait("a", 0)
		time.Sleep(10 * time.Millisecond)
		wait("b", 20) // first in the order, but its deadline is its own
		time.Sleep(10 * time.Millisecond)
		wait("c", -10)
		p.mu.Lock()
		require.NotNil(t, p.lanes[0].expiry, "no timer while the lane has waiters")
		p.mu.Unlock()

		time.Sleep(50 * time.Millisecond) // t = 70ms
		p.Release(held)                   // b, the highest priority, gets the slot
		g := <-out
		require.Equal(t, "b", g.name)
		require.NoError(t, g.err)
		assert.Equal(t, 70*time.Millisecond, g.at)

		for _, want := range []struct {
			name string
			at   time.Duration
		}{{"a", timeout}, {"c", 20*time.Millisecond + timeout}} {
			o := <-out
			require.Equal(t, want.name, o.name)
			require.ErrorIs(t, o.err, ErrAcquireTimeout)
			assert.Equal(t, want.at, o.at, "%s failed at its own deadline", o.name)
		}
		wg.Wait()
		p.mu.Lock()
		assert.Nil(t, p.lanes[0].expiry, "the timer outlived the queue")
		p.mu.Unlock()
		assert.Zero(t, p.LaneStat(0).Waiting)

		// A new queue gets a new timer.
		arrived := time.Since(start)
		wait("d", 0)
		o := <-out
		require.ErrorIs(t, o.err, ErrAcquireTimeout)
		assert.Equal(t, arrived+timeout, o.at)
		wg.Wait()
		g.s.Release()
		requireInvariants(t, p)
	})
}
