package reserve

import "context"

// Lane is a handle on one lane of a Pool, for callers who would rather name a lane once than
// carry its index: p.Lane("short") once, then short.Acquire(ctx) on every call. It is a small
// value: copy it freely. Its zero value is not a lane.
type Lane struct {
	p *Pool
	i int
}

// Lane returns the lane called name, and false if the pool has none of that name.
func (p *Pool) Lane(name string) (Lane, bool) {
	for i := range p.lanes {
		if p.lanes[i].cfg.Name == name {
			return Lane{p: p, i: i}, true
		}
	}
	return Lane{}, false
}

// Lanes returns a handle on every lane, in the order of Config.Lanes.
func (p *Pool) Lanes() []Lane {
	ls := make([]Lane, len(p.lanes))
	for i := range ls {
		ls[i] = Lane{p: p, i: i}
	}
	return ls
}

// Name returns the lane's name.
func (l Lane) Name() string { return l.p.lanes[l.i].cfg.Name }

// Index returns the lane's index in Config.Lanes, for the Pool's index-based methods.
func (l Lane) Index() int { return l.i }

// Acquire waits for a slot of the lane; see Pool.Acquire. ctx bounds the wait, and so does the
// lane's AcquireTimeout when it is set; the slot is held until Slot.Release.
func (l Lane) Acquire(ctx context.Context) (Slot, error) { return l.p.AcquireAs(ctx, l.i, Caller{}) }

// AcquireAs waits for a slot of the lane on behalf of c; see Pool.AcquireAs.
func (l Lane) AcquireAs(ctx context.Context, c Caller) (Slot, error) {
	return l.p.AcquireAs(ctx, l.i, c)
}

// TryAcquire takes a slot of the lane if it can without waiting; see Pool.TryAcquire.
func (l Lane) TryAcquire() (Slot, bool) { return l.p.TryAcquireAs(l.i, "") }

// Stat returns a snapshot of the lane; see Pool.LaneStat.
func (l Lane) Stat() LaneStat { return l.p.LaneStat(l.i) }

// Release gives the slot back to the pool that granted it, as Pool.Release does: releasing a
// slot twice, or the zero Slot, panics.
func (s Slot) Release() {
	if s.p == nil {
		panic("reserve: Release of a Slot that Acquire did not return")
	}
	s.p.Release(s)
}
