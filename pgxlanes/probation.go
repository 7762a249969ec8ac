package pgxlanes

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// probation bounds the Short slots that statements with no fast run on record (unproven: new
// texts, the first runs after a start) hold at once, so that the rest of Short's capacity stays
// for statements proven fast. It is a semaphore of tokens with two bounds: all unproven
// statements together hold at most n tokens, and one statement at most perStmt of them. A token
// is taken before the lane slot and given back when the lease ends (learned).
//
// The bound per statement is what keeps a storm of one new slow statement (the common case: an
// ORM's report, called by many clients at once) from taking Short's capacity for the whole
// threshold before it is learned, while new statements that are fast are not serialised: each
// needs one run to be proven, and the callers of one statement that wait for its first run leave
// the wait as soon as it ends fast (settle).
//
// The waiters are served in order, skipping those whose statement is at its bound (they keep
// their place): a waiter is granted as soon as both bounds allow it and no waiter before it could
// be granted instead.
type probation struct {
	n, perStmt int
	waiting    atomic.Int32 // len(waiters), read without mu by settle's fast path

	mu sync.Mutex
	// Guarded by mu:
	held    int                   // tokens held in all
	byStmt  map[stmtstats.Key]int // tokens held per statement; no zero entries
	waiters list.List             // of *probeWaiter, in arrival order
	byKey   map[stmtstats.Key]int // waiters per statement; no zero entries
	closed  bool                  // the pool is closed: no one waits any more
}

// probeWaiter is one caller waiting for a token. ready is closed when the waiter leaves the
// list: with a token (granted) or without one, to look again at its statement's class.
type probeWaiter struct {
	key     stmtstats.Key
	ready   chan struct{}
	granted bool // written under mu before ready is closed
}

// probationSize is the number of Short slots unproven statements may hold at once: Short's cap
// less its reserve, at least one. When Short can reach its cap (Tx and Long within their
// reserves), a reserve's worth of Short's slots stays for statements proven fast.
func probationSize(shortMax, shortReserved int) int { return max(1, shortMax-shortReserved) }

// probationPerStatement is the number of Short slots one unproven statement may hold at once:
// half of Short's reserve, at least one, and no more than probationSize.
func probationPerStatement(shortMax, shortReserved int) int {
	return min(max(1, shortReserved/2), probationSize(shortMax, shortReserved))
}

func newProbation(n, perStmt int) *probation {
	return &probation{n: n, perStmt: perStmt, byStmt: map[stmtstats.Key]int{}, byKey: map[stmtstats.Key]int{}}
}

// fits reports whether a token for k fits both bounds. Caller holds mu.
func (pr *probation) fits(k stmtstats.Key) bool { return pr.held < pr.n && pr.byStmt[k] < pr.perStmt }

// take gives a token for k. Caller holds mu and checked fits.
func (pr *probation) take(k stmtstats.Key) {
	pr.held++
	pr.byStmt[k]++
}

// put gives a token of k back. Caller holds mu.
func (pr *probation) put(k stmtstats.Key) {
	pr.held--
	if pr.byStmt[k]--; pr.byStmt[k] <= 0 {
		delete(pr.byStmt, k)
	}
}

// release gives the token of a lease of k back, and grants it to the waiters it lets in.
func (pr *probation) release(k stmtstats.Key) {
	pr.mu.Lock()
	pr.put(k)
	pr.grant()
	pr.mu.Unlock()
}

// grant serves the waiters in order: each that fits takes a token. Caller holds mu.
func (pr *probation) grant() {
	for e := pr.waiters.Front(); e != nil && pr.held < pr.n; {
		w := e.Value.(*probeWaiter)
		next := e.Next()
		if pr.fits(w.key) {
			pr.take(w.key)
			w.granted = true
			pr.remove(e)
		}
		e = next
	}
}

// enqueue adds a waiter for k at the end of the list. Caller holds mu.
func (pr *probation) enqueue(k stmtstats.Key) (*probeWaiter, *list.Element) {
	w := &probeWaiter{key: k, ready: make(chan struct{})}
	e := pr.waiters.PushBack(w)
	pr.byKey[k]++
	pr.waiting.Add(1)
	return w, e
}

// remove takes e off the list and closes its ready. Caller holds mu.
func (pr *probation) remove(e *list.Element) {
	w := pr.waiters.Remove(e).(*probeWaiter)
	if pr.byKey[w.key]--; pr.byKey[w.key] <= 0 {
		delete(pr.byKey, w.key)
	}
	pr.waiting.Add(-1)
	close(w.ready)
}

// withdraw takes waiter w, at e, off the list, or gives its token back to the next waiter if
// it was granted meanwhile. Caller holds mu.
func (pr *probation) withdraw(w *probeWaiter, e *list.Element) {
	select {
	case <-w.ready:
		if w.granted {
			pr.put(w.key)
			pr.grant()
		}
	default:
		pr.remove(e)
	}
}

// settle sends the waiters for k, without a token, to look again at its class: k was demoted,
// or proven by a run that ended fast. It costs one atomic load when nobody waits.
func (pr *probation) settle(k stmtstats.Key) {
	if pr.waiting.Load() == 0 {
		return
	}
	pr.mu.Lock()
	if pr.byKey[k] > 0 {
		for e := pr.waiters.Front(); e != nil; {
			next := e.Next()
			if e.Value.(*probeWaiter).key == k {
				pr.remove(e)
			}
			e = next
		}
	}
	pr.mu.Unlock()
}

// close sends every waiter on without a token, and refuses waits from now on: the pool is closed.
func (pr *probation) close() {
	pr.mu.Lock()
	pr.closed = true
	for e := pr.waiters.Front(); e != nil; e = pr.waiters.Front() {
		pr.remove(e)
	}
	pr.mu.Unlock()
}

// inUse returns the tokens held now.
func (pr *probation) inUse() int {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.held
}

// probe admits an unproven statement to Short: it takes a token; or, if the statement is demoted
// while it waits, or Short's acquire timeout comes while its own statement's runs still hold
// every token it may take, sends the call to Long's capacity (rt.lane = Long, rt.probation =
// false); or, if it is proven meanwhile, lets it go without one (rt.probation = false). ctx and Short's acquire timeout (from start) bound the
// wait; the queue is bounded by Short's MaxWaiters; Close ends it (ErrClosed). The token is held until the lease ends
// (learned gives it back). queued reports whether the call waited for a token: the rest of its
// acquire gets what is left of Short's acquire timeout, no more.
func (p *Pool) probe(ctx context.Context, rt *route, start mono) (queued bool, err error) {
	pr := p.prob
	cfg := &p.lanes[Short].cfg
	var timeout <-chan time.Time
	for {
		switch p.learn.Classify(rt.key) {
		case stmtstats.Slow:
			rt.lane, rt.probation = Long, false
			return queued, nil
		case stmtstats.Proven: // a run of it ended fast meanwhile
			rt.probation = false
			return queued, nil
		}
		pr.mu.Lock()
		if pr.fits(rt.key) {
			pr.take(rt.key)
			pr.mu.Unlock()
			return queued, nil
		}
		if pr.closed {
			pr.mu.Unlock()
			return queued, ErrClosed
		}
		if mw := on(cfg.MaxWaiters); mw > 0 && pr.waiters.Len() >= mw {
			pr.mu.Unlock()
			return queued, ErrLaneFull
		}
		w, e := pr.enqueue(rt.key)
		pr.mu.Unlock()
		queued = true
		// A run that proved or demoted the statement after the look above found no waiter of
		// it to send on (settle): look again now that this one is queued.
		if p.learn.Classify(rt.key) != stmtstats.Unproven {
			pr.mu.Lock()
			pr.withdraw(w, e)
			pr.mu.Unlock()
			continue
		}

		if timeout == nil {
			if t := on(cfg.AcquireTimeout); t > 0 {
				timer := time.NewTimer(t - start.since())
				defer timer.Stop()
				timeout = timer.C
			}
		}
		select {
		case <-w.ready:
		case <-ctx.Done():
			err = ctx.Err()
		case <-timeout:
			err = ErrAcquireTimeout
		}
		if err != nil {
			pr.mu.Lock()
			pr.withdraw(w, e)
			// Held back by its own statement's runs for the whole acquire timeout: they are
			// most likely slow, and about to be learned as such. Long's capacity, as a demoted
			// statement's caller, rather than an error.
			own := err == ErrAcquireTimeout && pr.byStmt[rt.key] >= pr.perStmt
			pr.mu.Unlock()
			if own {
				rt.lane, rt.probation = Long, false
				return queued, nil
			}
			return queued, err
		}
		if w.granted {
			return queued, nil
		}
		// Sent to look again (settle): the statement was demoted or proven meanwhile.
	}
}
