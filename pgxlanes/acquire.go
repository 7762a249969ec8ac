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
func (p *Pool) route(ctx context.Context, def Lane, sql string) (route, error) {
	a := AnnotationsFrom(ctx)
	r := route{lane: def, set: def, tag: a.Tag, prio: a.Priority, budget: a.Budget}
	if a.LaneSet {
		if int(a.Lane) >= numLanes {
			return r, fmt.Errorf("pgxlanes: unknown lane %v set with WithLane (lanes are short, tx, long)", a.Lane)
		}
		r.lane, r.set = a.Lane, a.Lane
		return r, nil
	}
	if def == Short && p.learn != nil && sql != "" {
		r.key, r.learn = p.learn.Key(sql), true
		switch p.learn.Classify(r.key) {
		case stmtstats.Slow:
			r.lane = Long
		case stmtstats.Unproven:
			// A caller whose deadline comes before the threshold cannot hold a slot past it: its
			// statement is cancelled first. It needs no probation.
			d, ok := ctx.Deadline()
			r.probation = p.prob != nil && !(ok && time.Until(d) < p.config.Short.SlowThreshold)
		}
	}
	return r, nil
}

// acquire is the one place where a call gets a connection: classify, reserve a lane slot, take
// a pgxpool connection, prepare the lease. Its one deferred report feeds the lane's counters, the
// observers and an AcquireTracer, whatever the outcome.
func (p *Pool) acquire(ctx context.Context, def Lane, kind callKind, sql string) (l *lease, err error) {
	start := time.Now()
	rt, err := p.route(ctx, def, sql)
	if p.tracer != nil {
		ctx = p.tracer.TraceAcquireStart(ctx, p.tracedPool(rt), pgxpool.TraceAcquireStartData{})
	}
	waited := false
	defer func() { p.reportAcquire(ctx, rt, start, waited, l, err) }()
	if err != nil {
		return nil, err
	}
	if rt.probation {
		if err = p.probe(ctx, &rt, start); err != nil {
			rt.probation = false
			return nil, p.laneError(rt, start, err)
		}
		defer func() {
			if err != nil && rt.probation {
				p.prob.release()
			}
		}()
	}
	lr := &p.lanes[rt.lane]
	srv := lr.srv
	slot, err := srv.res.AcquireAs(ctx, lr.idx, rt.caller())
	if err != nil {
		return nil, p.laneError(rt, start, err)
	}
	waited = slot.Waited()
	if slot.HeldBack() {
		p.heldBack(rt, time.Since(start))
	}
	fslot := int32(-1)
	if p.fleet != nil && rt.lane == Long {
		var deadline time.Time
		if t := on(p.lanes[Long].cfg.AcquireTimeout); t > 0 {
			deadline = start.Add(t)
		}
		if fslot, err = p.fleet.acquire(ctx, deadline); err != nil {
			srv.res.Release(slot)
			return nil, p.laneError(rt, start, err)
		}
	}
	pctx, cancel := p.poolCtx(ctx, rt, start)
	pc, err := srv.pool.Acquire(pctx)
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
	return p.newLease(pc, slot, rt, kind, sql, fslot), nil
}

// adopt makes a lease for an idle connection of AcquireAllIdle, if lane rt may take a slot
// without waiting.
func (p *Pool) adopt(ctx context.Context, rt route, pc *pgxpool.Conn) (*lease, bool) {
	lr := &p.lanes[rt.lane]
	slot, ok := lr.srv.res.TryAcquireAs(lr.idx, rt.tag)
	if !ok {
		return nil, false
	}
	l := p.newLease(pc, slot, rt, kindHeld, "", -1)
	p.reportAcquire(ctx, rt, l.acquired, false, l, nil)
	return l, true
}

// poolCtx bounds pgxpool's step. pgxpool waits only to open a connection or to ping an idle one
// (the slots equal its MaxConns, so it never queues behind another caller). Opening a connection
// is not charged to the lane's acquire timeout, which bounds the wait behind other callers for a
// slot: over a slow link TLS and SCRAM take several round trips, and a Short call must not fail
// because its connection was still being opened (docs/design.md, "Opening connections"). When no
// connection is idle, the step is bounded by ConnConfig.ConnectTimeout (by default the longest
// acquire timeout) or the lane's acquire timeout, whichever is longer; when one is, pgxpool may
// ping it, and the lane's acquire timeout bounds that, so that a frozen server does not hold the
// caller. Both count from the start of the acquire; ctx bounds both. In the rare race where the
// idle connection is taken meanwhile and pgxpool dials, the dial gets the lane's bound. A
// deadline context costs allocations and a timer, so it is made only when pgxpool may wait: no
// connection looks idle, or the last lease ended long enough ago that pgxpool may ping (it pings
// connections idle for over a second).
func (p *Pool) poolCtx(ctx context.Context, rt route, start time.Time) (context.Context, context.CancelFunc) {
	lr := &p.lanes[rt.lane]
	t := on(lr.cfg.AcquireTimeout)
	if t == 0 {
		return ctx, nil
	}
	srv := lr.srv
	idle := srv.open.Load() > srv.leased.Load()
	if idle && start.UnixNano()-srv.lastUse.Load() < int64(500*time.Millisecond) {
		return ctx, nil
	}
	deadline := start.Add(t) // the ping of an idle connection: a frozen server must not hold the caller
	if !idle {
		deadline = start.Add(max(t, srv.connectTimeout)) // a dial
	}
	if d, ok := ctx.Deadline(); ok && !d.After(deadline) {
		return ctx, nil
	}
	return context.WithDeadline(ctx, deadline)
}

// laneError converts an error of the reserve or fleet step.
func (p *Pool) laneError(rt route, start time.Time, err error) *AcquireError {
	e := &AcquireError{Lane: rt.lane, Tag: rt.tag, Waited: time.Since(start), Err: err}
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
func (p *Pool) dialError(ctx context.Context, rt route, start time.Time, err error) *AcquireError {
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
func (p *Pool) reportAcquire(ctx context.Context, rt route, start time.Time, waited bool, l *lease, err error) {
	var wait time.Duration
	var conn *pgx.Conn
	if l != nil {
		wait, conn = l.acquired.Sub(start), l.conn
	} else {
		wait = time.Since(start)
	}
	if int(rt.lane) < numLanes {
		p.lanes[rt.lane].counts.acquired(wait, waited, err)
	}
	if p.obs.any() {
		p.obs.acquire(AcquireEvent{Lane: rt.lane, Tag: rt.tag, Priority: rt.prio, Wait: wait, Err: err})
	}
	if p.tracer != nil {
		p.tracer.TraceAcquireEnd(ctx, p.tracedPool(rt), pgxpool.TraceAcquireEndData{Conn: conn, Err: err})
	}
}

// tracedPool is the pgxpool an AcquireTracer is told about: that of the lane's server.
func (p *Pool) tracedPool(rt route) *pgxpool.Pool {
	if int(rt.lane) < numLanes {
		return p.lanes[rt.lane].srv.pool
	}
	return p.servers[0].pool
}
