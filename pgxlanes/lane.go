package pgxlanes

import (
	"context"
	"fmt"
	"time"
)

// Lane is a class of work with its own reserve of connections, cap, queue and timeouts.
type Lane uint8

const (
	// Short is for plain queries: Query, QueryRow, Exec, SendBatch and Ping go here unless the
	// context says otherwise. Its hold time is bounded by its statement timeout, so it may borrow
	// idle connections from the other lanes.
	Short Lane = iota
	// Tx is for transactions and held connections: Begin, BeginTx, Acquire, AcquireFunc and CopyFrom
	// go here unless the context says otherwise. It never takes Short's reserve.
	Tx
	// Long is for work annotated as long with WithLane(ctx, Long): reports, exports, migrations.
	Long

	numLanes = 3
)

var laneNames = [numLanes]string{"short", "tx", "long"}

// String returns "short", "tx" or "long".
func (l Lane) String() string {
	if int(l) < numLanes {
		return laneNames[l]
	}
	return fmt.Sprintf("lane(%d)", uint8(l))
}

// ParseLane returns the lane called name ("short", "tx" or "long").
func ParseLane(name string) (Lane, error) {
	for i, n := range laneNames {
		if n == name {
			return Lane(i), nil
		}
	}
	return 0, fmt.Errorf("pgxlanes: unknown lane %q (lanes are short, tx, long)", name)
}

// Lanes lists the lanes in order.
func Lanes() []Lane { return []Lane{Short, Tx, Long} }

// Annotations are what the context says about a call. Read them back with AnnotationsFrom.
type Annotations struct {
	// Lane is the lane chosen with WithLane; LaneSet is false when none was.
	Lane    Lane
	LaneSet bool
	// Budget is the hold-time budget set with WithBudget: 0 when none was, Off for no budget.
	Budget time.Duration
	// Tag is the label set with WithTag; "" when none was.
	Tag string
	// Priority is the priority set with WithPriority; PriorityNormal (0) when none was.
	Priority Priority
}

type annotationsKey struct{}

// AnnotationsFrom returns the annotations ctx carries. Middleware uses it to read them back.
func AnnotationsFrom(ctx context.Context) Annotations {
	if a := annotations(ctx); a != nil {
		return *a
	}
	return Annotations{}
}

// annotations returns the annotations ctx carries, nil for none, without copying them: every
// WithLane, WithTag, WithPriority and WithBudget stores a new Annotations, never changed after.
func annotations(ctx context.Context) *Annotations {
	a, _ := ctx.Value(annotationsKey{}).(*Annotations)
	return a
}

func withAnnotations(ctx context.Context, f func(*Annotations)) context.Context {
	a := AnnotationsFrom(ctx)
	f(&a)
	return context.WithValue(ctx, annotationsKey{}, &a)
}

// WithLane returns a context whose calls go to lane l, whatever the method and whatever the pool
// learned about the statement. An invalid lane is refused when the context is used: calls fail
// with an error naming it, and AcquireAllIdle returns no connections.
func WithLane(ctx context.Context, l Lane) context.Context {
	return withAnnotations(ctx, func(a *Annotations) { a.Lane, a.LaneSet = l, true })
}

// WithBudget returns a context whose transaction or held connection has budget d instead of its
// lane's budget: tighter for work that must be quick, looser for work known to be slow. Off
// means no budget at all: the lease is never flagged, cancelled or terminated, which is what a
// LISTEN loop on a held connection needs. 0 (or any other negative d) removes an earlier
// WithBudget.
func WithBudget(ctx context.Context, d time.Duration) context.Context {
	if d < 0 && d != Off {
		d = 0
	}
	return withAnnotations(ctx, func(a *Annotations) { a.Budget = d })
}

// WithTag returns a context whose calls carry tag in logs, errors and metrics. Keep tags few and
// fixed (a route or job name, never an ID): metrics export them only through an allow-list.
func WithTag(ctx context.Context, tag string) context.Context {
	return withAnnotations(ctx, func(a *Annotations) { a.Tag = tag })
}
