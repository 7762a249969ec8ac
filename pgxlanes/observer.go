package pgxlanes

import (
	"slices"
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
	p.obsSeq++
	id := p.obsSeq
	p.storeObserversLocked(func(es []observerEntry) []observerEntry { return append(es, observerEntry{id, o}) })
	var once sync.Once
	return func() {
		once.Do(func() {
			p.obsMu.Lock()
			defer p.obsMu.Unlock()
			p.storeObserversLocked(func(es []observerEntry) []observerEntry {
				return slices.DeleteFunc(es, func(e observerEntry) bool { return e.id == id })
			})
		})
	}
}

// observerEntry is an observer with the id AddObserver gave it (observers need not be comparable).
type observerEntry struct {
	id uint64
	o  Observer
}

// storeObserversLocked publishes a changed copy of the observer list; the hot path reads it with
// one atomic load. Caller must hold p.obsMu.
func (p *Pool) storeObserversLocked(change func([]observerEntry) []observerEntry) {
	var cur []observerEntry
	if old := p.observers.Load(); old != nil {
		cur = slices.Clone(*old)
	}
	next := change(cur)
	p.observers.Store(&next)
}

// observed reports whether any observer is registered.
func (p *Pool) observed() bool {
	obs := p.observers.Load()
	return obs != nil && len(*obs) > 0
}

func (p *Pool) observeAcquire(e AcquireEvent) {
	if obs := p.observers.Load(); obs != nil {
		for _, x := range *obs {
			x.o.ObserveAcquire(e)
		}
	}
}

func (p *Pool) observeRelease(e ReleaseEvent) {
	if obs := p.observers.Load(); obs != nil {
		for _, x := range *obs {
			x.o.ObserveRelease(e)
		}
	}
}
