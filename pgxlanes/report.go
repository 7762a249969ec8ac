package pgxlanes

import "sync"

// reporter runs the guard's reports (log lines, observers, Config.OnViolation) in order on a
// goroutine of their own, so that a slow handler never delays the guard: its goroutine goes on to
// the next lease's flag, and a cancel or terminate is not held up behind a report. The goroutine
// runs only while reports are queued.
type reporter struct {
	mu      sync.Mutex
	queue   []func() // guarded by mu
	running bool     // a goroutine is draining queue; guarded by mu
	wg      sync.WaitGroup
}

// report queues f. It never blocks on f or on an earlier report.
func (r *reporter) report(f func()) {
	r.mu.Lock()
	r.queue = append(r.queue, f)
	if r.running {
		r.mu.Unlock()
		return
	}
	r.running = true
	r.wg.Add(1)
	r.mu.Unlock()
	go r.run()
}

func (r *reporter) run() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		f := r.queue[0]
		r.queue[0] = nil
		r.queue = r.queue[1:]
		r.mu.Unlock()
		f()
	}
}

// wait waits until every queued report has run.
func (r *reporter) wait() { r.wg.Wait() }
