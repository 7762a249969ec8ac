package pgxlanes

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// The probation semaphore's two bounds and its order: waiters are granted in order as both
// bounds allow, a waiter whose statement is at its bound keeps its place and does not hold back
// later waiters of other statements, and settle sends a statement's waiters on without a token.
func TestProbationBoundsAndOrder(t *testing.T) {
	const a, b, c, d stmtstats.Key = 1, 2, 3, 4
	pr := newProbation(3, 1)
	take := func(k stmtstats.Key) bool {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		if !pr.fits(k) {
			return false
		}
		pr.take(k)
		return true
	}
	wait := func(k stmtstats.Key) *probeWaiter {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		w, _ := pr.enqueue(k)
		return w
	}
	state := func(w *probeWaiter) string {
		select {
		case <-w.ready:
			if w.granted {
				return "granted"
			}
			return "sent on"
		default:
			return "waiting"
		}
	}

	require.True(t, take(a))
	require.False(t, take(a), "one statement holds at most perStmt")
	require.True(t, take(b))
	require.True(t, take(c))
	require.False(t, take(d), "all statements together hold at most n")
	assert.Equal(t, 3, pr.inUse())

	wa, wd, wa2 := wait(a), wait(d), wait(a)
	pr.release(b) // frees one token: a is at its bound, so d, behind it, is granted
	assert.Equal(t, "waiting", state(wa), "a's waiter keeps its place")
	assert.Equal(t, "granted", state(wd))
	assert.Equal(t, "waiting", state(wa2))
	pr.release(a) // a's first waiter is granted, its second still waits behind its own bound
	assert.Equal(t, "granted", state(wa))
	assert.Equal(t, "waiting", state(wa2))
	pr.settle(a) // a was proven (or demoted): its waiters go on without a token
	assert.Equal(t, "sent on", state(wa2))
	assert.Equal(t, int32(0), pr.waiting.Load())
	assert.Equal(t, 3, pr.inUse(), "c, d and a's granted waiter")
	pr.release(c)
	pr.release(d)
	pr.release(a)
	assert.Equal(t, 0, pr.inUse())
	assert.Empty(t, pr.byStmt)
	assert.Empty(t, pr.byKey)
}

func TestProbationSizes(t *testing.T) {
	for _, tc := range []struct{ max, reserved, n, perStmt int }{
		{8, 2, 6, 1},      // the default pool of 8
		{100, 25, 75, 12}, // a pool of 100
		{12, 4, 8, 2},
		{2, 2, 1, 1},  // no room beyond the reserve: still one
		{5, 1, 4, 1},  // a reserve of 1
		{10, 9, 1, 1}, // perStmt never above n
	} {
		assert.Equal(t, tc.n, probationSize(tc.max, tc.reserved), "%+v", tc)
		assert.Equal(t, tc.perStmt, probationPerStatement(tc.max, tc.reserved), "%+v", tc)
	}
}
