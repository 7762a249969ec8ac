package reserve

import "fmt"

// checkInvariants verifies the pool's bookkeeping and the guarantees stated in the package doc.
// It takes the lock, so it sees a consistent state.
func (p *Pool) checkInvariants() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	held, unboundedHeld, boundedReserved, sharedInUse := 0, 0, 0, 0
	perLane := make([]int, len(p.lanes))
	for _, st := range p.slots {
		if st.held {
			perLane[st.lane]++
		}
	}
	if len(p.slots) > p.size {
		return fmt.Errorf("slot table has %d entries, more than size %d", len(p.slots), p.size)
	}
	listed := make(map[int32]bool, len(p.freeSlots))
	for _, idx := range p.freeSlots {
		if p.slots[idx].held || listed[idx] {
			return fmt.Errorf("free list entry %d is held or listed twice", idx)
		}
		listed[idx] = true
	}
	for i := range p.lanes {
		l := &p.lanes[i]
		if l.held < 0 || l.held > l.cap {
			return fmt.Errorf("lane %s holds %d, cap %d", l.cfg.Name, l.held, l.cap)
		}
		if perLane[i] != l.held {
			return fmt.Errorf("lane %s: %d slots marked held, counter says %d", l.cfg.Name, perLane[i], l.held)
		}
		held += l.held
		if l.cfg.Bounded {
			boundedReserved += l.cfg.Reserved
		} else {
			unboundedHeld += l.held
			sharedInUse += max(0, l.held-l.cfg.Reserved)
		}
		n := 0
		var prevSeq uint64
		for w := l.waitHead; w != nil; w = w.next {
			if w.seq <= prevSeq {
				return fmt.Errorf("lane %s: queue not in arrival order", l.cfg.Name)
			}
			prevSeq = w.seq
			n++
		}
		if n != l.waiting {
			return fmt.Errorf("lane %s: %d queued, counter says %d", l.cfg.Name, n, l.waiting)
		}
		if err := l.checkOrder(); err != nil {
			return fmt.Errorf("lane %s: %w", l.cfg.Name, err)
		}
		if l.cfg.MaxWaiters > 0 && n > l.cfg.MaxWaiters {
			return fmt.Errorf("lane %s: %d waiters, MaxWaiters %d", l.cfg.Name, n, l.cfg.MaxWaiters)
		}
		// Work-conserving: nobody waits who could take a free slot. Waiters of negative priority
		// may wait for a slot of the headroom (an aged one takes it at the next grant, a release
		// or an arrival); nobody else.
		if n > 0 && p.mayTakeLocked(i) && !(p.headroomLocked(i) && l.classes[0].prio < 0) {
			return fmt.Errorf("lane %s: a waiter could take a free slot but waits", l.cfg.Name)
		}
	}
	if err := p.checkTags(); err != nil {
		return err
	}
	if held+p.free != p.size || len(p.slots)-len(p.freeSlots) != held {
		return fmt.Errorf("held %d + free %d != size %d, or table %d - free list %d != held", held, p.free, p.size, len(p.slots), len(p.freeSlots))
	}
	if sharedInUse != p.sharedInUse || sharedInUse > p.shared {
		return fmt.Errorf("shared in use %d (counter %d), shared %d", sharedInUse, p.sharedInUse, p.shared)
	}
	// The headline guarantee: unbounded work never occupies the bounded lanes' reserve.
	if p.size-unboundedHeld < boundedReserved {
		return fmt.Errorf("unbounded lanes hold %d of %d slots, leaving less than the bounded reserve %d", unboundedHeld, p.size, boundedReserved)
	}
	// Nor the reserve of another unbounded lane: the others hold at most their reserves plus Shared.
	for i := range p.lanes {
		l := &p.lanes[i]
		if l.cfg.Bounded {
			continue
		}
		othersHeld, othersReserved := 0, 0
		for j := range p.lanes {
			if o := &p.lanes[j]; j != i && !o.cfg.Bounded {
				othersHeld += o.held
				othersReserved += o.cfg.Reserved
			}
		}
		if othersHeld > othersReserved+p.shared {
			return fmt.Errorf("unbounded lanes other than %s hold %d, into its reserve", l.cfg.Name, othersHeld)
		}
	}
	return nil
}

// checkOrder verifies the priority classes: sorted by priority, highest first, none empty, each
// in arrival order, and together holding exactly the queued waiters. Caller must hold p.mu.
func (l *lane) checkOrder() error {
	if !l.ordered() {
		if len(l.classes) != 0 {
			return fmt.Errorf("FIFO lane has %d priority classes", len(l.classes))
		}
		return nil
	}
	inQueue := make(map[*waiter]bool, l.waiting)
	for w := l.waitHead; w != nil; w = w.next {
		inQueue[w] = true
	}
	n := 0
	for i, c := range l.classes {
		if i > 0 && l.classes[i-1].prio <= c.prio {
			return fmt.Errorf("priority classes not in descending order: %d then %d", l.classes[i-1].prio, c.prio)
		}
		if c.head == nil {
			return fmt.Errorf("priority class %d is empty", c.prio)
		}
		var prevSeq uint64
		var prev *waiter
		for w := c.head; w != nil; w = w.cnext {
			if w.prio != c.prio || !inQueue[w] || w.seq <= prevSeq || w.cprev != prev {
				return fmt.Errorf("priority class %d: waiter of priority %d, not queued, out of arrival order or mislinked", c.prio, w.prio)
			}
			prevSeq, prev = w.seq, w
			n++
		}
		if c.tail != prev {
			return fmt.Errorf("priority class %d: tail is not its last waiter", c.prio)
		}
	}
	if n != l.waiting {
		return fmt.Errorf("priority classes hold %d waiters, queue %d", n, l.waiting)
	}
	return nil
}

// checkTags verifies the per-tag counts of lanes with a tag share against the slot table.
// Caller must hold p.mu.
func (p *Pool) checkTags() error {
	want := make([]map[string]int, len(p.lanes))
	for idx, st := range p.slots {
		l := &p.lanes[st.lane]
		if !st.held || l.tags == nil {
			continue
		}
		tag, ok := l.slotTags[int32(idx)]
		if !ok {
			return fmt.Errorf("lane %s: held slot %d has no tag", l.cfg.Name, idx)
		}
		if want[st.lane] == nil {
			want[st.lane] = map[string]int{}
		}
		want[st.lane][tag]++
	}
	for i := range p.lanes {
		l := &p.lanes[i]
		if l.tags == nil {
			continue
		}
		n := 0
		for _, c := range want[i] {
			n += c
		}
		if n != len(l.slotTags) {
			return fmt.Errorf("lane %s: %d slots held, %d tagged", l.cfg.Name, n, len(l.slotTags))
		}
		if len(want[i]) != len(l.tags) {
			return fmt.Errorf("lane %s: %d tags hold slots, counts kept for %d", l.cfg.Name, len(want[i]), len(l.tags))
		}
		for tag, n := range want[i] {
			if l.tags[tag] != n {
				return fmt.Errorf("lane %s: tag %q holds %d, count says %d", l.cfg.Name, tag, n, l.tags[tag])
			}
		}
	}
	return nil
}
