package pgxlanes

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// probation caps the Short slots that statements with no fast run on record (unproven: new
// texts, the first runs after a start) hold at once, so that the rest of Short's capacity stays
// for statements proven fast. It is a FIFO semaphore of n tokens: a token is taken before the
// lane slot and given back when the lease ends (learned). A caller waits for a token within
// Short's acquire timeout and queue bound; it leaves the wait when its statement is demoted
// meanwhile, to take Long's capacity instead.
type probation struct {
	tokens  chan struct{} // a send takes a token; Go serves blocked senders in order
	waiting atomic.Int32
	// demoted is closed, and replaced, at every demotion: it wakes the waiters to look again at
	// their statement's class. Written only from the learner's OnChange, which is serialised.
	demoted atomic.Pointer[chan struct{}]
}

// probationSize is the number of Short slots unproven statements may hold at once: Short's cap
// less its reserve, at least one. When Short can reach its cap (Tx and Long within their
// reserves), a reserve's worth of Short's slots stays for statements proven fast.
func probationSize(shortMax, shortReserved int) int { return max(1, shortMax-shortReserved) }

// probePoll is how often a waiter for a probation token looks again at its statement's class.
const probePoll = 2 * time.Millisecond

func newProbation(n int) *probation {
	pr := &probation{tokens: make(chan struct{}, n)}
	ch := make(chan struct{})
	pr.demoted.Store(&ch)
	return pr
}

// wake tells the waiters that a statement was demoted.
func (pr *probation) wake() {
	ch := make(chan struct{})
	old := pr.demoted.Swap(&ch)
	close(*old)
}

func (pr *probation) release() { <-pr.tokens }

// probe admits an unproven statement to Short: it takes a token, or, if the statement is demoted
// while it waits, sends the call to Long's capacity (rt.lane = Long, rt.probation = false). ctx
// and Short's acquire timeout (from start) bound the wait; the queue is bounded by Short's
// MaxWaiters. The token is held until the lease ends.
func (p *Pool) probe(ctx context.Context, rt *route, start time.Time) error {
	pr := p.prob
	select {
	case pr.tokens <- struct{}{}:
		return nil
	default:
	}
	cfg := &p.lanes[Short].cfg
	if mw := on(cfg.MaxWaiters); mw > 0 && int(pr.waiting.Load()) >= mw {
		return ErrLaneFull
	}
	pr.waiting.Add(1)
	defer pr.waiting.Add(-1)
	var timeout <-chan time.Time
	if t := on(cfg.AcquireTimeout); t > 0 {
		timer := time.NewTimer(time.Until(start.Add(t)))
		defer timer.Stop()
		timeout = timer.C
	}
	// A statement is proven by a run that ends fast, which sends no wake-up: the waiters look
	// again every probePoll, so that a burst of a new fast statement does not queue behind its
	// own first runs.
	poll := time.NewTimer(probePoll)
	defer poll.Stop()
	for {
		demoted := *pr.demoted.Load()
		switch p.learn.Classify(rt.key) {
		case stmtstats.Slow:
			rt.lane, rt.probation = Long, false
			return nil
		case stmtstats.Proven: // a run of it ended fast meanwhile
			rt.probation = false
			return nil
		}
		select {
		case pr.tokens <- struct{}{}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout:
			return ErrAcquireTimeout
		case <-demoted:
		case <-poll.C:
			poll.Reset(probePoll)
		}
	}
}
