package pgxlanes

import (
	"sync"
	"time"
)

// Observer receives an event for every acquire and release, so that a metrics package can keep
// histograms without the core depending on it. Methods run on the caller's goroutine, on the hot
// path: they must be fast, must not block and should not allocate. Events are structs so fields
// can be added later.
type Observer interface {
	ObserveAcquire(AcquireEvent)
	ObserveRelease(ReleaseEvent)
}

// AcquireEvent describes one acquire, successful or not.
type AcquireEvent struct {
	Lane Lane
	Tag  string
	// Wait is the time from the call to a ready connection (or to the failure).
	Wait time.Duration
	// Err is nil on success; otherwise the error returned to the caller.
	Err error
}

// ReleaseEvent describes the end of one lease: a query's rows closed, a transaction ended, a held
// connection released.
type ReleaseEvent struct {
	Lane Lane
	Tag  string
	// Hold is how long the connection was held.
	Hold time.Duration
}

// AddObserver makes o receive the pool's events from now on. The returned func stops them.
func (p *Pool) AddObserver(o Observer) (remove func()) {
	p.obsMu.Lock()
	defer p.obsMu.Unlock()
	var next []Observer
	if old := p.observers.Load(); old != nil {
		next = append(next, *old...)
	}
	next = append(next, o)
	p.observers.Store(&next)
	var once sync.Once
	return func() {
		once.Do(func() {
			p.obsMu.Lock()
			defer p.obsMu.Unlock()
			var rest []Observer
			removed := false
			for _, x := range *p.observers.Load() {
				if !removed && x == o {
					removed = true
					continue
				}
				rest = append(rest, x)
			}
			p.observers.Store(&rest)
		})
	}
}

func (p *Pool) observeAcquire(e AcquireEvent) {
	if obs := p.observers.Load(); obs != nil {
		for _, o := range *obs {
			o.ObserveAcquire(e)
		}
	}
}

func (p *Pool) observeRelease(e ReleaseEvent) {
	if obs := p.observers.Load(); obs != nil {
		for _, o := range *obs {
			o.ObserveRelease(e)
		}
	}
}
