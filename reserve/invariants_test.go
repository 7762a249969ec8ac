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
		if l.cfg.MaxWaiters > 0 && n > l.cfg.MaxWaiters {
			return fmt.Errorf("lane %s: %d waiters, MaxWaiters %d", l.cfg.Name, n, l.cfg.MaxWaiters)
		}
		// Work-conserving: nobody waits who could take a free slot.
		if n > 0 && p.mayTakeLocked(i) {
			return fmt.Errorf("lane %s: a waiter could take a free slot but waits", l.cfg.Name)
		}
	}
	if held+p.free != p.size || len(p.freeSlots) != p.free {
		return fmt.Errorf("held %d + free %d (free list %d) != size %d", held, p.free, len(p.freeSlots), p.size)
	}
	if sharedInUse != p.sharedInUse || sharedInUse > p.shared {
		return fmt.Errorf("shared in use %d (counter %d), shared %d", sharedInUse, p.sharedInUse, p.shared)
	}
	// The headline guarantee: unbounded work never occupies the bounded lanes' reserve.
	if p.size-unboundedHeld < boundedReserved {
		return fmt.Errorf("unbounded lanes hold %d of %d slots, leaving less than the bounded reserve %d", unboundedHeld, p.size, boundedReserved)
	}
	return nil
}
