package reserve

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
)

// sem is the tiny interface through which the benchmarks compare reserve with its baselines.
// The Slot is meaningful only for reserve.
type sem interface {
	acquire(ctx context.Context) (Slot, error)
	release(Slot)
}

type reserveSem struct{ p *Pool }

// acquire calls AcquireAs, the path pgxlanes takes (Acquire is a wrapper of it).
func (r reserveSem) acquire(ctx context.Context) (Slot, error) {
	return r.p.AcquireAs(ctx, 0, Caller{})
}
func (r reserveSem) release(s Slot) { r.p.Release(s) }

type xsyncSem struct{ s *semaphore.Weighted }

func (x xsyncSem) acquire(ctx context.Context) (Slot, error) { return Slot{}, x.s.Acquire(ctx, 1) }
func (x xsyncSem) release(Slot)                              { x.s.Release(1) }

type chanSem chan struct{}

func (c chanSem) acquire(ctx context.Context) (Slot, error) {
	select {
	case c <- struct{}{}:
		return Slot{}, nil
	case <-ctx.Done():
		return Slot{}, ctx.Err()
	}
}
func (c chanSem) release(Slot) { <-c }

func impls(b *testing.B, n int) []struct {
	name string
	s    sem
} {
	return []struct {
		name string
		s    sem
	}{
		{"reserve", reserveSem{benchPool(b, n)}},
		{"xsync", xsyncSem{semaphore.NewWeighted(int64(n))}},
		{"chan", make(chanSem, n)},
	}
}

func benchPool(b *testing.B, n int) *Pool {
	p, err := New(Config{Size: n, Lanes: []LaneConfig{
		{Name: "short", Reserved: n / 4, Bounded: true},
		{Name: "tx", Reserved: n / 2},
		{Name: "long", MaxConns: n / 4},
	}})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkAcquireRelease: one goroutine, never waits.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	for _, impl := range impls(b, 16) {
		b.Run("Impl="+impl.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, err := impl.s.acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				impl.s.release(s)
			}
		})
	}
}

// BenchmarkContended: Clients goroutines share 16 slots; each holds a slot for a moment of work.
func BenchmarkContended(b *testing.B) {
	const n = 16
	ctx := context.Background()
	for _, clients := range []int{2 * n, 8 * n, 64 * n} {
		for _, impl := range impls(b, n) {
			b.Run(fmt.Sprintf("Clients=%d/Impl=%s", clients, impl.name), func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism((clients + 1) / 2) // GOMAXPROCS is 2 here; SetParallelism multiplies it
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						s, err := impl.s.acquire(ctx)
						if err != nil {
							panic(err)
						}
						work()
						impl.s.release(s)
					}
				})
			})
		}
	}
}

var sink int

func work() {
	for i := range 200 {
		sink += i
	}
}

// BenchmarkWaiters measures one waiter joining and leaving a lane queue that already holds
// Waiters waiters (the cancel path), and one release that grants to the head of such a queue.
// Both must not depend on the queue's length.
func BenchmarkWaiters(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprintf("Waiters=%d/Op=enqueue-cancel", n), func(b *testing.B) {
			p := benchPool(b, 4)
			for range 4 {
				p.TryAcquire(0)
			}
			p.mu.Lock()
			for range n {
				p.enqueueLocked(0, Caller{})
			}
			p.mu.Unlock()
			b.ReportAllocs()
			for b.Loop() {
				p.mu.Lock()
				w := p.enqueueLocked(0, Caller{})
				ready, since := w.ready, w.since
				p.mu.Unlock()
				_, _ = p.abandon(w, ready, 0, since, context.Canceled)
			}
		})
		b.Run(fmt.Sprintf("Waiters=%d/Op=release-grant-priority", n), func(b *testing.B) {
			// The lane orders by priority; half its waiters are low, half high, so every grant
			// passes over the oldest (low) waiter and reads the clock to see it is not aged.
			p := benchPool(b, 4)
			p.lanes[0].cfg.PriorityAge = time.Hour
			held, _ := p.TryAcquire(0)
			for range 3 {
				p.TryAcquire(0)
			}
			var highs []chan Slot
			p.mu.Lock()
			for i := range n {
				w := p.enqueueLocked(0, Caller{Priority: 10 * (i % 2)})
				if i%2 == 1 {
					highs = append(highs, w.ready)
				}
			}
			p.mu.Unlock()
			b.ReportAllocs()
			for b.Loop() {
				p.Release(held)
				held = <-highs[0] // granted to the first high waiter
				highs = highs[1:]
				p.mu.Lock()
				highs = append(highs, p.enqueueLocked(0, Caller{Priority: 10}).ready)
				p.mu.Unlock()
			}
		})
		b.Run(fmt.Sprintf("Waiters=%d/Op=release-grant", n), func(b *testing.B) {
			p := benchPool(b, 4)
			held, _ := p.TryAcquire(0)
			for range 3 {
				p.TryAcquire(0)
			}
			readies := make([]chan Slot, 0, n)
			p.mu.Lock()
			for range n {
				readies = append(readies, p.enqueueLocked(0, Caller{}).ready)
			}
			p.mu.Unlock()
			b.ReportAllocs()
			for b.Loop() {
				p.Release(held)
				held = <-readies[0] // granted
				readies = readies[1:]
				p.mu.Lock()
				readies = append(readies, p.enqueueLocked(0, Caller{}).ready) // keep the queue length at n
				p.mu.Unlock()
			}
		})
	}
}
