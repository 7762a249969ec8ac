package pgxlanes

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
	"github.com/pgxlanes/pgxlanes/reserve"
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

// A statement proven fast between a caller's look at its class and its turn in the queue does
// not leave that caller waiting for a token it no longer needs: the run that proved it found no
// waiter to send on, so the caller must look at the class again once it is queued.
func TestProbationProvenWhileQueueing(t *testing.T) {
	p, err := New(context.Background(), "postgres://u@127.0.0.1:55401/db?lane_short_acquire_timeout=2s")
	require.NoError(t, err)
	defer p.Close()
	p.prob = newProbation(1, 1)
	const sql, other = "select 1 from probation_race", "select 2 from probation_other"
	k := p.learn.Key(sql)
	// Another unproven statement holds the only token.
	p.prob.mu.Lock()
	p.prob.take(p.learn.Key(other))

	done := make(chan error, 1)
	rt := route{lane: Short, key: k, learn: true, probation: true}
	go func() { _, err := p.probe(context.Background(), &rt, monoNow()); done <- err }()
	// Wait until the caller has looked at the class (unproven) and waits for the mutex.
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		s := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(s, "\n\n") {
			if strings.Contains(g, ").probe(") && strings.Contains(g, "lockSlow") {
				return true
			}
		}
		return false
	}, 5*time.Second, time.Millisecond)
	// A run with no token (its caller's deadline was short) proves the statement fast.
	p.learned(&lease{hold: hold{rt: route{lane: Short, key: k, learn: true}, sql: sql}}, time.Millisecond)
	require.Equal(t, stmtstats.Proven, p.learn.Classify(k))
	p.prob.mu.Unlock()

	select {
	case err := <-done:
		require.NoError(t, err)
		assert.False(t, rt.probation, "a proven statement needs no token")
		assert.Equal(t, Short, rt.lane)
	case <-time.After(time.Second):
		t.Fatal("a proven statement still waits for a probation token")
	}
	assert.Equal(t, int32(0), p.prob.waiting.Load())
}

// Short's acquire timeout bounds a call's whole wait for Short's capacity, its wait for a
// probation token included: a caller that waited most of the timeout for a token does not then
// wait a whole timeout more for a slot.
func TestProbationWaitCountsAgainstAcquireTimeout(t *testing.T) {
	const timeout = 400 * time.Millisecond
	p, err := New(context.Background(), "postgres://u@127.0.0.1:55402/db?connect_timeout=1&lane_short_acquire_timeout=400ms")
	require.NoError(t, err)
	defer p.Close()
	p.anyProven.Store(true)
	p.prob = newProbation(1, 1)
	other := p.learn.Key("select 2 from probation_other")
	p.prob.mu.Lock()
	p.prob.take(other)
	p.prob.mu.Unlock()
	// Short is full.
	lr := &p.lanes[Short]
	var slots []reserve.Slot
	for {
		s, ok := lr.srv.res.TryAcquireAs(lr.idx, "")
		if !ok {
			break
		}
		slots = append(slots, s)
	}
	require.NotEmpty(t, slots)
	defer func() {
		for _, s := range slots {
			lr.srv.res.Release(s)
		}
	}()
	// The token comes free after most of the timeout.
	time.AfterFunc(timeout*3/4, func() { p.prob.release(other) })

	start := time.Now()
	_, err = p.Exec(context.Background(), "select 1 from probation_timeout")
	waited := time.Since(start)
	require.ErrorIs(t, err, ErrAcquireTimeout)
	assert.Less(t, waited, timeout*5/4, "Short's acquire timeout is %v", timeout)
}

// Close sends away a caller waiting for a probation token with ErrClosed, as it does a caller
// queued for a lane slot, instead of leaving it waiting for a token that may never come free.
func TestProbationWaiterLeavesAtClose(t *testing.T) {
	p, err := New(context.Background(), "postgres://u@127.0.0.1:55403/db?connect_timeout=1")
	require.NoError(t, err)
	defer p.Close()
	p.anyProven.Store(true)
	p.lanes[Short].cfg.AcquireTimeout = Off // the caller's ctx alone bounds its wait
	p.prob = newProbation(1, 1)
	other := p.learn.Key("select 2 from probation_other")
	p.prob.mu.Lock()
	p.prob.take(other)
	p.prob.mu.Unlock()
	defer p.prob.release(other) // lets a caller still waiting (the bug) go

	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(context.Background(), "select 1 from probation_close")
		done <- err
	}()
	require.Eventually(t, func() bool { return p.prob.waiting.Load() == 1 }, 5*time.Second, time.Millisecond)
	p.Close()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(time.Second):
		t.Fatal("a caller waiting for a probation token still waits after Close")
	}
	assert.Equal(t, int32(0), p.prob.waiting.Load())
}
