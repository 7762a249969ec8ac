package reserve

import "time"

// LaneStat is a snapshot of one lane: its configuration and its live figures. The pool counts
// only the decisions that it alone sees (aged grants, tag-share pass-overs); its caller counts
// outcomes.
type LaneStat struct {
	Name       string
	Bounded    bool
	Reserved   int
	MaxConns   int // effective: Config.Reachable
	MaxWaiters int
	// InUse is the number of slots the lane holds; Borrowed is how many of them lie beyond its
	// reserve (shared slots or, for a bounded lane, other lanes' idle reserve).
	InUse    int
	Borrowed int
	// Waiting is the number of queued callers; OldestWait is how long the first of them has waited.
	Waiting    int
	OldestWait time.Duration
	// AgedGrants counts the slots granted by ageing ahead of a waiter of higher priority (or into
	// the PriorityHeadroom);
	// TagShareRefusals the grants that passed over a waiter whose tag held the lane's tag share
	// (in dry run: that would have). Both count from New.
	AgedGrants       int64
	TagShareRefusals int64
}

// Stat is a snapshot of the pool taken under its lock.
type Stat struct {
	Size   int
	Free   int
	Shared int // slots no lane reserves
	Lanes  []LaneStat
}

// Stat returns a consistent snapshot of all lanes.
func (p *Pool) Stat() Stat {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stat{Size: p.size, Free: p.free, Shared: p.shared, Lanes: make([]LaneStat, len(p.lanes))}
	for i := range p.lanes {
		s.Lanes[i] = p.laneStatLocked(i, now)
	}
	return s
}

// LaneStat returns a snapshot of lane i without allocating; the zero LaneStat for an i that names
// no lane.
func (p *Pool) LaneStat(i int) LaneStat {
	if uint(i) >= uint(len(p.lanes)) {
		return LaneStat{}
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.laneStatLocked(i, now)
}

// laneStatLocked describes lane i. Caller must hold p.mu.
func (p *Pool) laneStatLocked(i int, now time.Time) LaneStat {
	l := &p.lanes[i]
	ls := LaneStat{
		Name: l.cfg.Name, Bounded: l.cfg.Bounded, Reserved: l.cfg.Reserved, MaxConns: l.cap,
		MaxWaiters: l.cfg.MaxWaiters, InUse: l.held, Borrowed: max(0, l.held-l.cfg.Reserved),
		Waiting: l.waiting, AgedGrants: l.agedGrants, TagShareRefusals: l.shareRefusals,
	}
	if l.waitHead != nil {
		ls.OldestWait = now.Sub(l.waitHead.since)
	}
	return ls
}
