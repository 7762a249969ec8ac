package pgxlanes

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
	"github.com/pgxlanes/pgxlanes/internal/wire"
	"github.com/pgxlanes/pgxlanes/reserve"
)

// route is where a call goes: the lane whose capacity it takes, the lane whose timeouts and
// budget apply (the same, except for a statement learned as slow: Long's capacity, Short's
// timeouts), and what the context says.
type route struct {
	lane   Lane
	set    Lane
	tag    string
	prio   Priority
	budget time.Duration // 0: the lane's; Off: none
	key    stmtstats.Key // the statement, when learn is set
	learn  bool          // the statement is one the pool learns about
	// probation: the statement has no fast run on record; it holds a probation token (see
	// probation.go) from acquire until its lease ends.
	probation bool
}

// route is the one classification: the context's annotation wins; otherwise the method's
// default lane, except that a statement sent to Short that the pool learned as slow takes Long's
// capacity. An invalid lane is refused, whatever the method.
// It fills *r, the caller's: a route is a few words, and the acquire path copies it no more than
// it must.
func (p *Pool) route(ctx context.Context, def Lane, sql string, r *route) error {
	*r = route{lane: def, set: def}
	if a := annotations(ctx); a != nil {
		r.tag, r.prio, r.budget = a.Tag, a.Priority, a.Budget
		if a.LaneSet {
			if int(a.Lane) >= numLanes {
				return fmt.Errorf("pgxlanes: unknown lane %v set with WithLane (lanes are short, tx, long)", a.Lane)
			}
			r.lane, r.set = a.Lane, a.Lane
			return nil
		}
	}
	if def == Short && p.learn != nil && sql != "" {
		r.key, r.learn = p.learn.Key(sql), true
		switch p.learn.Arrive(r.key) { // counts the call for the relative rule (stmtstats.Table.Arrive)
		case stmtstats.Slow:
			r.lane = Long
		case stmtstats.Unproven:
			// A caller whose deadline comes before the threshold cannot hold a slot past it: its
			// statement is cancelled first. It needs no probation.
			// Probation starts once a statement is proven: before that, Short's reserve has no
			// proven work to keep it for, and in a cold start every first run is held up by the
			// dial of its connection, not by its own length.
			d, ok := ctx.Deadline()
			r.probation = p.prob != nil && p.anyProven.Load() && !(ok && time.Until(d) < p.config.Short.SlowThreshold)
		}
	}
	return nil
}

// acquire is the one place where a call gets a connection: classify, reserve a lane slot, take
// a pgxpool connection, prepare the lease. Its one deferred report feeds the lane's counters, the
// observers and an AcquireTracer, whatever the outcome.
func (p *Pool) acquire(ctx context.Context, def Lane, kind callKind, sql string) (l *lease, err error) {
	start := monoNow()
	var rt route
	err = p.route(ctx, def, sql, &rt)
	if p.tracer != nil {
		ctx = p.tracer.TraceAcquireStart(ctx, p.tracedPool(rt), pgxpool.TraceAcquireStartData{})
	}
	waited := false
	defer func() { p.reportAcquire(ctx, rt, start, waited, l, err) }()
	if err != nil {
		return nil, err
	}
	actx := ctx // the slot's wait
	if rt.probation {
		var queued bool
		if queued, err = p.probe(ctx, &rt, start); err != nil {
			rt.probation = false
			return nil, p.laneError(rt, start, err)
		}
		defer func() {
			if err != nil && rt.probation {
				p.prob.release(rt.key)
			}
		}()
		// Short's acquire timeout bounds the whole wait for Short's capacity, the token's
		// included: the slot's wait gets what is left of it.
		if t := on(p.lanes[Short].cfg.AcquireTimeout); queued && rt.lane == Short && t > 0 {
			var cancel context.CancelFunc
			actx, cancel = context.WithDeadline(ctx, start.time().Add(t))
			defer cancel()
		}
	}
	lr := &p.lanes[rt.lane]
	srv := lr.srv
	slot, err := srv.res.AcquireAs(actx, lr.idx, rt.caller())
	if err != nil {
		if actx != ctx && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = ErrAcquireTimeout // the deadline above, not the caller's
		}
		return nil, p.laneError(rt, start, err)
	}
	waited = slot.Waited()
	if slot.HeldBack() {
		p.heldBack(rt, start.since())
	}
	fslot := int32(-1)
	if p.fleet != nil && rt.lane == Long {
		var deadline time.Time
		if t := on(p.lanes[Long].cfg.AcquireTimeout); t > 0 {
			deadline = start.time().Add(t)
		}
		if fslot, err = p.fleet.acquire(ctx, deadline); err != nil {
			srv.res.Release(slot)
			return nil, p.laneError(rt, start, err)
		}
	}
	// A parked connection if any (park.go); else pgxpool's.
	var pc *pgxpool.Conn
	var epoch uint32
	var cancel func()
	idle := true
	parks := srv.parks.Load()
	if parks {
		at := start
		if waited || fslot >= 0 || rt.probation {
			at = monoNow() // the caller may have waited: a connection may have expired meanwhile
		}
		pc, epoch = srv.park.take(func(w *wire.Conn) bool { return srv.expired(w, at) })
	}
	if pc == nil {
		var pctx context.Context
		pctx, cancel, idle = p.poolCtx(ctx, rt, start)
		if parks {
			pc, err = srv.acquireCounted(pctx)
		} else {
			pc, err = srv.pool.Acquire(pctx)
		}
	}
	if cancel != nil {
		cancel()
	}
	if err != nil {
		if fslot >= 0 {
			p.fleet.release(fslot)
		}
		srv.res.Release(slot)
		return nil, p.dialError(ctx, rt, start, err)
	}
	// One clock read per acquire in the common case: when nothing could have made the caller wait
	// (no queue for the slot, no fleet slot, no probation, and an idle connection that pgxpool
	// hands over without a ping or a dial), the lease starts when the acquire did. Otherwise the
	// lease starts now, and the wait is what came before.
	acquired := start
	if waited || fslot >= 0 || rt.probation || !idle {
		acquired = monoNow()
	}
	l = p.newLease(pc, slot, &rt, kind, sql, fslot, acquired)
	if l.w != nil && l.w.Epoch < epoch {
		epoch = l.w.Epoch // dialed before a Reset that its acquire did not see: never parked
	}
	l.epoch = epoch
	return l, nil
}

// adopt makes a lease for an idle connection of AcquireAllIdle, if lane rt may take a slot
// without waiting, and on Long with a fleet cap, a fleet slot is free (one try: a round trip on
// the fleet's session, no wait for a slot).
func (p *Pool) adopt(ctx context.Context, rt route, pc *pgxpool.Conn, epoch uint32) (*lease, bool) {
	lr := &p.lanes[rt.lane]
	slot, ok := lr.srv.res.TryAcquireAs(lr.idx, rt.tag)
	if !ok {
		return nil, false
	}
	fslot := int32(-1)
	if p.fleet != nil && rt.lane == Long {
		var err error
		if fslot, err = p.fleet.try(ctx); err != nil || fslot < 0 {
			lr.srv.res.Release(slot)
			return nil, false
		}
	}
	l := p.newLease(pc, slot, &rt, kindHeld, "", fslot, monoNow())
	l.epoch = epoch
	if l.w != nil {
		l.w.ParkedFor = 0 // pgxpool's AcquireAllIdle calls no ShouldPing to read it (pingctx.go)
		l.epoch = min(epoch, l.w.Epoch)
	}
	// Counted as the lane's acquire, but not traced: pgxpool's AcquireAllIdle calls no tracer,
	// and a TraceAcquireEnd without its start would end the caller's own span (otelpgx).
	p.countAcquire(rt, l.acquired, false, l, nil)
	return l, true
}

// poolCtx is the context of pgxpool's step, and whether an idle connection looks ready for it.
// The slots equal pgxpool's MaxConns, so pgxpool never queues this caller behind another: it only
// opens a connection or pings an idle one. A connection idle and used within the last half second
// is handed over at once (pgxpool pings only those idle over a second): ctx as is, no allocation.
// Otherwise a pingCtx bounds a ping by the lane's acquire timeout, and leaves a dial to
// ConnectTimeout (pingctx.go).
func (p *Pool) poolCtx(ctx context.Context, rt route, start mono) (_ context.Context, release func(), idle bool) {
	lr := &p.lanes[rt.lane]
	srv := lr.srv
	last := srv.lastUse.Load()
	idle = srv.open.Load() > srv.leased.Load() && last != 0 && int64(start)-last < int64(500*time.Millisecond)
	t := on(lr.cfg.AcquireTimeout)
	if t == 0 || idle {
		return ctx, nil, idle
	}
	c := newPingCtx(ctx, t)
	return c, c.release, false
}

// laneError converts an error of the reserve or fleet step.
func (p *Pool) laneError(rt route, start mono, err error) *AcquireError {
	e := &AcquireError{Lane: rt.lane, Tag: rt.tag, Waited: start.since(), Err: err}
	var re *reserve.AcquireError
	if errors.As(err, &re) {
		e.InUse, e.MaxConns, e.Waiting = re.InUse, re.MaxConns, re.Waiting
		switch {
		case errors.Is(re.Err, reserve.ErrAcquireTimeout):
			e.Err = ErrAcquireTimeout
		case errors.Is(re.Err, reserve.ErrLaneFull):
			e.Err = ErrLaneFull
		case errors.Is(re.Err, reserve.ErrClosed):
			e.Err = ErrClosed
		default:
			e.Err = re.Err // the caller's ctx error
		}
		return e
	}
	lr := &p.lanes[rt.lane]
	st := lr.srv.res.LaneStat(lr.idx)
	e.InUse, e.MaxConns, e.Waiting = st.InUse, st.MaxConns, st.Waiting
	return e
}

// dialError converts an error of pgxpool's step.
func (p *Pool) dialError(ctx context.Context, rt route, start mono, err error) *AcquireError {
	switch {
	case ctx.Err() != nil:
		err = ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		err = ErrAcquireTimeout // our deadline, not the caller's
	case errors.Is(err, puddle.ErrClosedPool):
		err = ErrClosed
	}
	return p.laneError(rt, start, err)
}

// reportAcquire is the acquire's one report: the lane's counters, the observers and the tracer.
func (p *Pool) reportAcquire(ctx context.Context, rt route, start mono, waited bool, l *lease, err error) {
	p.countAcquire(rt, start, waited, l, err)
	if p.tracer != nil {
		var conn *pgx.Conn
		if l != nil {
			conn = l.conn
		}
		p.tracer.TraceAcquireEnd(ctx, p.tracedPool(rt), pgxpool.TraceAcquireEndData{Conn: conn, Err: err})
	}
}

// countAcquire is reportAcquire's part for the lane's counts and the observers.
func (p *Pool) countAcquire(rt route, start mono, waited bool, l *lease, err error) {
	var wait time.Duration
	if l != nil {
		wait = time.Duration(l.acquired - start)
	} else {
		wait = start.since()
	}
	if int(rt.lane) < numLanes {
		p.lanes[rt.lane].counts.acquired(wait, waited, err)
	}
	if p.obs.any() {
		p.obs.acquire(AcquireEvent{Lane: rt.lane, Tag: rt.tag, Priority: rt.prio, Wait: wait, Err: err})
	}
}

// tracedPool is the pgxpool an AcquireTracer is told about: that of the lane's server.
func (p *Pool) tracedPool(rt route) *pgxpool.Pool {
	if int(rt.lane) < numLanes {
		return p.lanes[rt.lane].srv.pool
	}
	return p.servers[0].pool
}
