package main

import (
	"context"
	"sync"
)

// gate says which long workers may start a transaction: those whose index is below the active
// count. Lowering the count withdraws the waiting acquires of the workers it turns off (their
// contexts are cancelled), so that a pool's queue empties at once; transactions already running
// are left to finish.
//
// Every change, closing included, happens in one critical section that also wakes every waiter,
// so a worker never waits for a change that has already happened. Closing once took two: set(0),
// then closed = true under the lock again. A worker woken by the first could take the lock in
// between, find itself inactive and the gate still open, and wait for a change that never came,
// while the run waited for it to return (TestDemo hung until its deadline).
type gate struct {
	mu sync.Mutex
	// Guarded by mu:
	active  int
	closed  bool
	changed chan struct{}        // closed at every change; replaced by a new one unless closing
	cancels []context.CancelFunc // the acquire context last handed to each worker
}

func newGate(workers int) *gate {
	return &gate{changed: make(chan struct{}), cancels: make([]context.CancelFunc, workers)}
}

// enter waits until worker idx may start a transaction and returns the context for its acquire,
// derived from parent and cancelled if the worker is turned off meanwhile. ok is false once the
// gate is closed or parent is done.
func (g *gate) enter(parent context.Context, idx int) (ctx context.Context, cancel context.CancelFunc, ok bool) {
	for {
		g.mu.Lock()
		if g.closed || parent.Err() != nil {
			g.mu.Unlock()
			return nil, nil, false
		}
		if idx < g.active {
			ctx, cancel := context.WithCancel(parent)
			g.cancels[idx] = cancel
			g.mu.Unlock()
			return ctx, cancel, true
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-parent.Done():
			return nil, nil, false
		}
	}
}

// set makes the first n workers active. It does nothing once the gate is closed.
func (g *gate) set(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.change(n, false)
}

// close turns every worker off for good: running transactions finish, waiting acquires are
// withdrawn and every later enter returns at once.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.change(0, true)
}

// change applies a new active count, withdraws the acquires of the workers it turns off and wakes
// every waiter. Caller must hold mu.
func (g *gate) change(n int, closing bool) {
	if g.closed {
		return
	}
	g.active, g.closed = n, closing
	for i := n; i < len(g.cancels); i++ {
		if g.cancels[i] != nil {
			g.cancels[i]()
		}
	}
	close(g.changed)
	if !closing {
		g.changed = make(chan struct{}) // once closed, the channel stays closed: nothing waits on it
	}
}
