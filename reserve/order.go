package reserve

import (
	"slices"
	"time"
)

// This file holds who, within one lane, gets the next slot: priorities with ageing, and the
// share one tag may hold while others wait.
//
// # Service order within a lane
//
// With LaneConfig.PriorityAge 0 the lane is strictly FIFO and priorities are ignored. Otherwise
// its waiters are served in this order:
//
//  1. aged waiters, those that have waited PriorityAge or more, in arrival order;
//  2. then the others by priority, higher first, and in arrival order among equals.
//
// Because arrival order is also the order of the time waited, the aged waiters are a prefix of
// the arrival list, and the first in the order is either the oldest waiter (if it is aged) or
// the first of the highest priority class. A grant looks at two nodes and, only when they
// differ, at the clock: no scan.
//
// # The tag share
//
// With LaneConfig.MaxTagShare n > 0, a waiter whose tag holds n slots or more of the lane is
// passed over for the first waiter, in the same order, of a tag that holds fewer: one tag cannot
// hold more than n while another tag waits. If every waiter's tag is at its share, the first in
// the order is served: the share never leaves a slot free that a waiter could take. In dry run
// (TagShareDryRun) the first in the order is always served, and the pass-over it would have
// made is only counted and marked on the waiter's Slot (HeldBack).

// Caller says who asks for a slot: its priority within the lane (higher is served first; 0 is
// the default) and its tag, for the lane's tag share ("" is a tag like any other).
type Caller struct {
	Priority int
	Tag      string
}

// class is the FIFO list of one lane's waiters of one priority, linked through waiter.cprev and
// waiter.cnext.
type class struct {
	prio       int
	head, tail *waiter
}

// addClassLocked appends w to the list of its priority, making the list if it is the first of
// that priority. lane.classes stays sorted by priority, highest first. Caller must hold p.mu.
func (l *lane) addClassLocked(w *waiter) {
	i := 0
	for i < len(l.classes) && l.classes[i].prio > w.prio {
		i++
	}
	if i == len(l.classes) || l.classes[i].prio != w.prio {
		l.classes = slices.Insert(l.classes, i, class{prio: w.prio})
	}
	c := &l.classes[i]
	w.cprev = c.tail
	if c.tail != nil {
		c.tail.cnext = w
	} else {
		c.head = w
	}
	c.tail = w
}

// removeClassLocked unlinks w from the list of its priority and drops the list if it empties.
// It looks the list up among the lane's priorities: few, for callers that use the named levels.
// Caller must hold p.mu.
func (l *lane) removeClassLocked(w *waiter) {
	i := 0
	for l.classes[i].prio != w.prio {
		i++
	}
	c := &l.classes[i]
	if w.cprev != nil {
		w.cprev.cnext = w.cnext
	} else {
		c.head = w.cnext
	}
	if w.cnext != nil {
		w.cnext.cprev = w.cprev
	} else {
		c.tail = w.cprev
	}
	w.cprev, w.cnext = nil, nil
	if c.head == nil {
		l.classes = slices.Delete(l.classes, i, i+1)
	}
}

// tagLocked counts slot s, just taken, for tag, in a lane with a tag share. Caller must hold
// p.mu.
func (p *Pool) tagLocked(s Slot, tag string) {
	l := &p.lanes[s.lane()]
	l.slotTags[s.idx] = tag
	l.tags[tag]++
}

// untagLocked uncounts slot idx, being released, in a lane with a tag share; a tag that holds
// nothing loses its entry. Caller must hold p.mu.
func (l *lane) untagLocked(idx int32) {
	tag := l.slotTags[idx]
	delete(l.slotTags, idx)
	if n := l.tags[tag] - 1; n > 0 {
		l.tags[tag] = n
	} else {
		delete(l.tags, tag)
	}
}

// ordered reports whether the lane orders its waiters by priority (PriorityAge > 0).
func (l *lane) ordered() bool { return l.cfg.PriorityAge > 0 }

// shares reports whether the lane limits what one tag holds (MaxTagShare > 0).
func (l *lane) shares() bool { return l.cfg.MaxTagShare > 0 }

// blockedLocked reports whether w's tag is at the lane's tag share. Caller must hold p.mu.
func (l *lane) blockedLocked(w *waiter) bool {
	return l.tags[w.tag] >= l.cfg.MaxTagShare
}

// agedLocked reports whether w has waited the lane's PriorityAge at now, reading the clock into
// *now the first time. Caller must hold p.mu.
func (l *lane) agedLocked(w *waiter, now *time.Time) bool {
	if now.IsZero() {
		*now = time.Now()
	}
	return now.Sub(w.since) >= l.cfg.PriorityAge
}

// firstLocked returns the lane's first waiter in the service order (see the top of this file),
// and whether ageing put it there ahead of a waiter of higher priority. Caller must hold p.mu;
// the lane has waiters.
func (l *lane) firstLocked(now *time.Time) (w *waiter, aged bool) {
	oldest := l.waitHead
	if !l.ordered() {
		return oldest, false
	}
	top := l.classes[0].head
	if top == oldest {
		return oldest, false
	}
	if l.agedLocked(oldest, now) {
		return oldest, true
	}
	return top, false
}

// firstMatchLocked returns the first waiter in the service order for which ok holds, or nil if
// there is none, and whether ageing chose it. It scans past the waiters that fail ok: those of
// tags at their share, or of negative priority held off the headroom. Caller must hold p.mu.
func (l *lane) firstMatchLocked(now *time.Time, ok func(*waiter) bool) (*waiter, bool) {
	if !l.ordered() {
		for w := l.waitHead; w != nil; w = w.next {
			if ok(w) {
				return w, false
			}
		}
		return nil, false
	}
	for w := l.waitHead; w != nil && l.agedLocked(w, now); w = w.next {
		if ok(w) {
			return w, w.prio < l.classes[0].prio
		}
	}
	for i := range l.classes {
		for w := l.classes[i].head; w != nil; w = w.cnext {
			if ok(w) {
				return w, false
			}
		}
	}
	return nil, false
}

// roomLocked returns how many more slots lane i may take now: the admission rule (mayTakeLocked)
// counted instead of tested. Caller must hold p.mu.
func (p *Pool) roomLocked(i int) int {
	l := &p.lanes[i]
	n := min(p.free, l.cap-l.held)
	if !l.cfg.Bounded {
		n = min(n, max(l.cfg.Reserved-l.held, 0)+p.shared-p.sharedInUse)
	}
	return max(n, 0)
}

// headroomLocked reports whether lane i is down to its PriorityHeadroom: what it may still take
// is for callers of priority 0 or more, and for aged waiters. Caller must hold p.mu.
func (p *Pool) headroomLocked(i int) bool {
	h := p.lanes[i].cfg.PriorityHeadroom
	return h > 0 && p.roomLocked(i) <= h
}

// heldOffLocked reports whether lane i's waiters may not take what the lane may take: they are
// all of negative priority, none of them aged, and the lane is down to its headroom. Caller must
// hold p.mu; the lane has waiters.
func (p *Pool) heldOffLocked(i int, now *time.Time) bool {
	l := &p.lanes[i]
	return l.cfg.PriorityHeadroom > 0 && l.classes[0].prio < 0 && !l.agedLocked(l.waitHead, now) && p.headroomLocked(i)
}

// pickLocked chooses the waiter of lane l that the next slot goes to, applying the headroom
// (lowOK false: only a waiter of priority 0 or more, or an aged one, may take it) and the tag
// share, and counts the lane's aged grants and share pass-overs. Caller must hold p.mu; the lane
// has a waiter that may take the slot.
func (l *lane) pickLocked(now *time.Time, lowOK bool) *waiter {
	mayTake := func(x *waiter) bool { return lowOK || x.prio >= 0 || l.agedLocked(x, now) }
	w, aged := l.firstLocked(now)
	if !mayTake(w) {
		w, aged = l.firstMatchLocked(now, mayTake)
	}
	if !lowOK && w.prio < 0 {
		aged = true // only its age lets it take the headroom
	}
	if l.shares() && l.blockedLocked(w) {
		if other, otherAged := l.firstMatchLocked(now, func(x *waiter) bool {
			return !l.blockedLocked(x) && mayTake(x)
		}); other != nil {
			l.shareRefusals++
			w.heldBack = true
			if !l.cfg.TagShareDryRun {
				w, aged = other, otherAged
			}
		}
	}
	if aged {
		l.agedGrants++
		w.aged = true
	}
	return w
}
