package reserve

import "time"

// Acquire timeouts, one timer per lane: every waiter of a lane has the same AcquireTimeout, so
// their deadlines come in their order of arrival, which is the order of the lane's queue
// (waitHead first) whatever their priorities. One timer, armed for the first waiter's deadline,
// expires every waiter whose deadline has passed when it fires, then is armed again for the new
// first waiter. A waiter thus costs no timer and waits on two channels (its ready channel and its
// ctx), not three.
//
// The timer lives exactly while the lane has waiters: made when the first one queues, stopped
// and dropped when the last one leaves, so that, as before, nothing a wait makes inside a
// testing/synctest bubble is touched outside it (one lane's waiters are not in and out of a
// bubble at once). Invariant, under Pool.mu: while a lane with an AcquireTimeout has waiters,
// expiry is set and fires at or before its first waiter's deadline (the first waiter only ever
// gets later, as waiters leave from the front or the middle; a timer that fires early re-arms).

// expired is what a waiter receives on its ready channel when its AcquireTimeout ran out: not a
// slot (gen 0).
var expired = Slot{}

// armLocked starts lane i's timer for its first waiter, who just queued into an empty queue.
// Caller must hold p.mu.
func (p *Pool) armLocked(i int) {
	l := &p.lanes[i]
	l.episode++
	episode := l.episode
	l.expiry = time.AfterFunc(l.cfg.AcquireTimeout, func() { p.expire(i, episode) })
}

// disarmLocked stops lane i's timer: its queue is empty. Caller must hold p.mu.
func (p *Pool) disarmLocked(i int) {
	l := &p.lanes[i]
	l.expiry.Stop()
	l.expiry = nil
}

// expire runs when lane i's timer of the given episode fires: it fails every waiter whose
// deadline has passed, and arms the timer again for the first waiter left. A timer of an
// episode that has ended (the queue emptied, maybe to fill again) does nothing.
func (p *Pool) expire(i int, episode uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.lanes[i]
	if l.expiry == nil || l.episode != episode {
		return
	}
	timeout := l.cfg.AcquireTimeout
	now := time.Now()
	for w := l.waitHead; w != nil; w = l.waitHead {
		if left := timeout - now.Sub(w.since); left > 0 {
			l.expiry.Reset(left)
			return
		}
		p.unlinkLocked(w) // may disarm: the queue emptied
		w.ready <- expired
		p.freeLocked(w)
	}
}

// Ageing, one timer per lane too: a lane's waiters are held off its PriorityHeadroom while they
// are all of negative priority and none has waited PriorityAge (heldOffLocked). The first of them
// (waitHead, the oldest) may take the headroom once it has, and a release or an arrival would
// grant it then; in a quiet lane nothing would, and it would wait beside a free slot until its
// deadline. So when grantLocked finds a lane held off, it arms the lane's ager for the moment
// its first waiter ages, and the ager runs grantLocked again then (which arms it anew if the lane
// is still held off: its first waiter left meanwhile). Like expiry, it lives only while the lane
// has waiters: unlinkLocked stops it with the last one.

// ageLaterLocked arms lane i's ager for when its first waiter ages; now is the time
// heldOffLocked read. Caller must hold p.mu; the lane is held off and its ager not set.
func (p *Pool) ageLaterLocked(i int, now time.Time) {
	l := &p.lanes[i]
	l.agerEpoch++
	epoch := l.agerEpoch
	l.ager = time.AfterFunc(l.cfg.PriorityAge-now.Sub(l.waitHead.since), func() { p.aged(i, epoch) })
}

// aged runs when lane i's ager of the given epoch fires: it grants what may now be granted. An
// ager that was stopped or replaced does nothing.
func (p *Pool) aged(i int, epoch uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.lanes[i]
	if l.ager == nil || l.agerEpoch != epoch {
		return
	}
	l.ager = nil
	p.grantLocked()
}
