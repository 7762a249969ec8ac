package txguard

import "time"

// The guard's schedule: the steps to come of all watched leases, earliest first.
//
// The leases of one lane share Budget and Action (and a pool's learning leases share one Mark),
// so their steps are due at the same few offsets from their Start. A lease enters the list of
// its next step when it is watched (the first step) or when its previous step fires (the
// others); so the leases of one list entered it, nearly always, in the order of their Start, and
// the order of their Start is the order in which they come due. The guard keeps one
// doubly-linked list per step, keyed by the offsets of that step and of the one before it, in
// order of due time: Watch appends at the tail, Unwatch unlinks, both in O(1); the next step due
// is the earliest of the few heads.
//
// The key holds the previous step's offset too because a lease enters a list when that step
// fires: leases that entered at the same lag behind their Start entered in order of Start. A
// lease that comes due before the tail of its list (two goroutines read their Start in one order
// and called Watch in the other) walks back from the tail to its place: correct always, O(1) in
// practice.
//
// A guard has maxLists lists, in an array of its own (no allocation). Each is given a key when
// first needed and keeps it when it empties (a lane's list empties and fills again with every
// lease); when all have a key and a new key comes (odd per-call budgets), an empty list is given
// the new key, and if none is empty the lease goes to an overflow heap, O(log n). The order of
// each list, by due time, is what makes the schedule correct; the keys only keep the walk-back
// short.

// maxLists bounds the lists of a guard: one pool's lanes, ladders and mark need about a dozen.
const maxLists = 32

// list is the leases whose next step has one key, earliest first. Guarded by Guard.mu.
type list struct {
	before, after time.Duration // the key: the offsets of the previous step (0 for the first) and of this one
	head, tail    *Lease
}

// key returns the key of l's next step.
func (l *Lease) key() (before, after time.Duration) {
	if l.cur > 0 {
		before = l.steps[l.cur-1].after
	}
	return before, l.steps[l.cur].after
}

// placeLocked puts l, whose l.at is set, in the list of its next step or in the overflow heap.
// Caller must hold g.mu.
func (g *Guard) placeLocked(l *Lease) {
	before, after := l.key()
	var q, empty *list
	lists := g.lists[:g.nlists]
	for i := range lists {
		c := &lists[i]
		if c.after == after && c.before == before {
			q = c
			break
		}
		if empty == nil && c.head == nil {
			empty = c
		}
	}
	if q == nil {
		switch {
		case g.nlists < maxLists:
			q = &g.lists[g.nlists] // once per key: the list is kept
			g.nlists++
		case empty != nil:
			q = empty
		default:
			g.overflow.push(l)
			return
		}
		q.before, q.after = before, after
	}
	l.list = q
	t := q.tail
	if t == nil || l.at >= t.at {
		// The common case: l is due last.
		l.prev, l.next = t, nil
		if t == nil {
			q.head = l
		} else {
			t.next = l
		}
		q.tail = l
		return
	}
	// l is due before the tail: walk back to the last lease due no later than l.
	for t.prev != nil && l.at < t.prev.at {
		t = t.prev
	}
	// l goes just before t.
	l.prev, l.next = t.prev, t
	if t.prev == nil {
		q.head = l
	} else {
		t.prev.next = l
	}
	t.prev = l
}

// removeLocked takes l out of its list or of the overflow heap. Caller must hold g.mu, and l
// must be placed.
func (g *Guard) removeLocked(l *Lease) {
	q := l.list
	if q == nil {
		g.overflow.remove(l.index)
		return
	}
	if l.prev == nil {
		q.head = l.next
	} else {
		l.prev.next = l.next
	}
	if l.next == nil {
		q.tail = l.prev
	} else {
		l.next.prev = l.prev
	}
	l.list, l.prev, l.next = nil, nil, nil
}

// earliestLocked returns the lease whose next step is due first, or nil if none is watched.
// Caller must hold g.mu.
func (g *Guard) earliestLocked() *Lease {
	var e *Lease
	if len(g.overflow) > 0 {
		e = g.overflow[0]
	}
	for i := range g.lists[:g.nlists] {
		if h := g.lists[i].head; h != nil && (e == nil || h.at < e.at) {
			e = h
		}
	}
	return e
}

// dropAllLocked forgets every watched lease. Caller must hold g.mu.
func (g *Guard) dropAllLocked() {
	for i := range g.lists[:g.nlists] {
		q := &g.lists[i]
		for l := q.head; l != nil; {
			next := l.next
			l.list, l.prev, l.next, l.guard = nil, nil, nil, nil
			l = next
		}
		q.head, q.tail = nil, nil
	}
	for _, l := range g.overflow {
		l.index, l.guard = -1, nil
	}
	g.overflow = nil
}

// leaseHeap is the overflow: leases whose key has no list, ordered by their next step's time.
// Typed, not through container/heap: no interface calls, no boxing.
type leaseHeap []*Lease

func (h *leaseHeap) push(l *Lease) {
	l.index = len(*h)
	*h = append(*h, l)
	h.up(l.index)
}

// remove takes out the lease at i.
func (h *leaseHeap) remove(i int) {
	s := *h
	n := len(s) - 1
	l := s[i]
	if i != n {
		s[i] = s[n]
		s[i].index = i
	}
	s[n] = nil
	*h = s[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
	l.index = -1
}

func (h leaseHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h[i].at >= h[p].at {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts the lease at i down and reports whether it moved.
func (h leaseHeap) down(i0 int) bool {
	i := i0
	for {
		c := 2*i + 1
		if c >= len(h) || c < 0 {
			break
		}
		if r := c + 1; r < len(h) && h[r].at < h[c].at {
			c = r
		}
		if h[c].at >= h[i].at {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > i0
}

func (h leaseHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
