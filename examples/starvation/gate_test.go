package main

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// TestGateCloseReleasesEveryWorker closes the gate as a run ends: one worker active and coming
// straight back to the gate (as after a withdrawn acquire or a finished transaction), the others
// waiting for their turn. Every worker must return, none may be left waiting. When close took the
// lock twice, a worker that came in between waited for good (TestDemo's hang): on 2 cores, in
// one round of 25 to 55 on average and never later than round 170 in 40 runs, with -race or
// without; 600 rounds miss it with a probability below 1e-4. With GOMAXPROCS=1 it is rarely hit.
func TestGateCloseReleasesEveryWorker(t *testing.T) {
	const workers, active, rounds = 8, 1, 600
	for round := range rounds {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			g := newGate(workers)
			g.set(active)
			var left atomic.Int32
			left.Store(workers)
			busy := make(chan struct{}, active)
			for i := range workers {
				go func() {
					defer left.Add(-1)
					for n := 0; ; n++ {
						_, release, ok := g.enter(ctx, i)
						if !ok {
							return
						}
						release()
						if n == 0 {
							busy <- struct{}{}
						}
					}
				}()
			}
			for range active {
				<-busy
			}
			g.close()
			synctest.Wait() // every worker has returned or waits for good
			if n := left.Load(); n != 0 {
				cancel() // let them go, so that the bubble can end
				synctest.Wait()
				t.Fatalf("round %d: %d of %d workers still waiting at the gate after close", round, n, workers)
			}
		})
	}
}

// TestGate checks what the long workers rely on: who may enter, the withdrawal of the acquires of
// the workers turned off, and that closing or the run's end lets every waiter go.
func TestGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate(3)
		g.set(2)
		ctx0, cancel0, ok0 := g.enter(t.Context(), 0)
		ctx1, cancel1, ok1 := g.enter(t.Context(), 1)
		if !ok0 || !ok1 {
			t.Fatalf("workers 0 and 1 of 2 active: ok = %v, %v; want both true", ok0, ok1)
		}
		defer cancel0()
		defer cancel1()

		entered := make(chan bool, 1)
		go func() {
			_, cancel, ok := g.enter(t.Context(), 2)
			if ok {
				cancel()
			}
			entered <- ok
		}()
		synctest.Wait()
		select {
		case <-entered:
			t.Fatal("worker 2 entered with 2 active")
		default:
		}

		g.set(1) // turns worker 1 off: its acquire is withdrawn, worker 0's is not
		if ctx1.Err() == nil {
			t.Error("worker 1's acquire context survives set(1)")
		}
		if ctx0.Err() != nil {
			t.Error("worker 0's acquire context was cancelled by set(1)")
		}

		g.set(3)
		if ok := <-entered; !ok {
			t.Error("worker 2 did not enter after set(3)")
		}
		ended, end := context.WithCancel(t.Context())
		end()
		if _, _, ok := g.enter(ended, 0); ok {
			t.Error("an active worker entered after the run's end")
		}

		g.close()
		if ctx0.Err() == nil {
			t.Error("worker 0's acquire context survives close")
		}
		if _, _, ok := g.enter(t.Context(), 0); ok {
			t.Error("enter after close returned ok")
		}
		g.set(3) // does nothing once closed
		if _, _, ok := g.enter(t.Context(), 0); ok {
			t.Error("enter after close and set(3) returned ok")
		}

		// The run's end lets a waiting worker go too.
		g2 := newGate(1)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan bool, 1)
		go func() {
			_, _, ok := g2.enter(ctx, 0)
			done <- ok
		}()
		synctest.Wait()
		cancel()
		if ok := <-done; ok {
			t.Error("enter returned ok after its parent context ended")
		}
	})
}
