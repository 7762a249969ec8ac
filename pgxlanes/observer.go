package pgxlanes

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Observer receives an event for every acquire and release, so that a metrics package can keep
// histograms without the core depending on it. Methods run on the caller's goroutine, on the hot
// path: they must be fast, must not block and should not allocate. Events are structs so fields
// can be added later. An Observer may also implement ViolationObserver and StatementObserver.
//
// Counts (acquires, timeouts, budget actions) are better read from Stat, which has them all from
// the pool's start; observers are for what a snapshot cannot give, such as latency histograms.
// The pool's log lines (Config.Logger) and Config.OnViolation are observers too, built in.
type Observer interface {
	ObserveAcquire(AcquireEvent)
	ObserveRelease(ReleaseEvent)
}

// AcquireEvent describes one acquire, successful or not.
type AcquireEvent struct {
	Lane Lane
	Tag  string
	// Priority is the call's (WithPriority).
	Priority Priority
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
	// PID is the server backend's process ID, Budget the lease's budget (0 for none).
	PID    uint32
	Budget time.Duration
	// Flagged is true when the guard flagged the lease as over its budget; CallSite is where it
	// was acquired, when Config.CaptureCallSites is on.
	Flagged  bool
	CallSite string
}

// StatementObserver is an optional interface of an Observer: it receives every change the pool
// learns about an unannotated statement sent to Short.
type StatementObserver interface {
	ObserveStatement(StatementEvent)
}

// StatementEvent says that a statement was learned as slow (Demoted: later calls take Long's
// capacity, under Short's timeouts) or as fast again.
type StatementEvent struct {
	// SQL is the statement's text with its literals folded to ? (the values an ORM inlined are
	// not shown), cut to 80 bytes; it holds no parameters. Texts that differ only in literals are
	// one statement.
	SQL     string
	Demoted bool
}

// AddObserver makes o receive the pool's events from now on. The returned func stops them.
func (p *Pool) AddObserver(o Observer) (remove func()) {
	return p.obs.add(o)
}

// observers dispatches the pool's events: to the built-in log lines and OnViolation, and to the
// observers added with AddObserver, read with one atomic load on the hot path.
type observers struct {
	logger      *slog.Logger
	onViolation func(Violation)

	mu   sync.Mutex // serializes changes to list
	seq  uint64     // guarded by mu
	list atomic.Pointer[[]observerEntry]
}

// observerEntry is an observer with the id add gave it (observers need not be comparable).
type observerEntry struct {
	id uint64
	o  Observer
}

func (o *observers) add(obs Observer) func() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	id := o.seq
	o.storeLocked(func(es []observerEntry) []observerEntry { return append(es, observerEntry{id, obs}) })
	var once sync.Once
	return func() {
		once.Do(func() {
			o.mu.Lock()
			defer o.mu.Unlock()
			o.storeLocked(func(es []observerEntry) []observerEntry {
				return slices.DeleteFunc(es, func(e observerEntry) bool { return e.id == id })
			})
		})
	}
}

// storeLocked publishes a changed copy of the list. Caller must hold o.mu.
func (o *observers) storeLocked(change func([]observerEntry) []observerEntry) {
	var cur []observerEntry
	if old := o.list.Load(); old != nil {
		cur = slices.Clone(*old)
	}
	next := change(cur)
	o.list.Store(&next)
}

// any reports whether an observer was added, so that the hot path reads the clock only for one.
func (o *observers) any() bool {
	l := o.list.Load()
	return l != nil && len(*l) > 0
}

func (o *observers) each(f func(Observer)) {
	if l := o.list.Load(); l != nil {
		for _, e := range *l {
			f(e.o)
		}
	}
}

func (o *observers) acquire(e AcquireEvent) { o.each(func(x Observer) { x.ObserveAcquire(e) }) }

func (o *observers) release(e ReleaseEvent) {
	if e.Flagged {
		attrs := []slog.Attr{slog.String("lane", e.Lane.String()), slog.String("tag", e.Tag), slog.Uint64("pid", uint64(e.PID)),
			slog.Duration("held", e.Hold), slog.Duration("budget", e.Budget)}
		if e.CallSite != "" {
			attrs = append(attrs, slog.String("call_site", e.CallSite))
		}
		o.logger.LogAttrs(context.Background(), slog.LevelInfo, "pgxlanes: flagged lease returned", attrs...)
	}
	o.each(func(x Observer) { x.ObserveRelease(e) })
}

// violation logs v and tells the observers and OnViolation.
func (o *observers) violation(v Violation) {
	// A warning did nothing to the lease: its line says so, and what the lane does at the budget.
	action := slog.String("action", v.Action.String())
	if v.Warning {
		action = slog.String("action", "warn")
	}
	attrs := []slog.Attr{
		slog.String("lane", v.Lane.String()), slog.String("tag", v.Tag), action,
		slog.Uint64("pid", uint64(v.PID)), slog.Duration("elapsed", v.Elapsed), slog.Duration("budget", v.Budget),
	}
	if v.Warning && v.OverBudget != 0 {
		attrs = append(attrs, slog.String("at_budget", v.OverBudget.String()))
	}
	if v.CallSite != "" {
		attrs = append(attrs, slog.String("call_site", v.CallSite))
	}
	switch {
	case v.Err != nil:
		attrs = append(attrs, slog.String("error", v.Err.Error()))
		o.logger.LogAttrs(context.Background(), slog.LevelError, "pgxlanes: terminate failed; the pool closed its socket to the session", attrs...)
	case v.Warning:
		o.logger.LogAttrs(context.Background(), slog.LevelWarn, "pgxlanes: lease past half its budget", attrs...)
	default:
		o.logger.LogAttrs(context.Background(), slog.LevelWarn, "pgxlanes: lease over budget", attrs...)
	}
	o.each(func(x Observer) {
		if vo, ok := x.(ViolationObserver); ok {
			vo.ObserveViolation(v)
		}
	})
	if o.onViolation != nil {
		o.onViolation(v)
	}
}

// statement tells the observers of a learned change (learn.go logs it, rate-limited).
func (o *observers) statement(e StatementEvent) {
	o.each(func(x Observer) {
		if so, ok := x.(StatementObserver); ok {
			so.ObserveStatement(e)
		}
	})
}
