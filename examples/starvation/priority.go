package main

// The priority phase: background work of low priority saturates Short and Tx while a small
// stream of critical requests runs. Each contender that runs it (contenderSpec.prio) gets a fresh
// pool: the idle baseline runs the critical requests alone, pgxpool and pgxlanes-fifo (priorities
// off: lane_short_priority_age=0, lane_tx_priority_age=0) serve them in arrival order behind the
// background's queue, pgxlanes serves them first, and ages the background so that none of it
// waits longer than its lane's priority_age plus a hold.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Statements of the priority phase. The background's statement runs pg_sleep(hold): in Short a
// plain statement, in Tx inside a transaction. Its text is fixed per hold, so pgxlanes learns it
// as fast (a hold far below Short's slow threshold).
const prioWorkSQL = "select pg_sleep($1::float8)"

// dropPriority, set only by a test (TestVerdictCatchesNoPriorities), sends the priority phase's
// calls without their WithPriority annotation: the regression the priority checks exist to
// catch, critical requests queueing behind the background in arrival order.
var dropPriority bool

// laneAges are pgxlanes' priority settings and aged grants (pools.ages).
type laneAges struct {
	Short, Tx               time.Duration // PriorityAge; 0: off
	ShortTimeout, TxTimeout time.Duration // AcquireTimeout; 0: off
	AgedShort, AgedTx       int64
}

// bgCount is what became of one lane's background calls. Guarded by the recorder's mu.
type bgCount struct {
	done     int
	failed   [numKinds]int
	failWait time.Duration // the longest a failed call waited before it failed
}

// bgEnded records a background call of lane i (0 Short, 1 Tx) that ended; wait is its time
// before it failed (only kept for a failure: a served call's wait comes from the observer).
func (r *recorder) bgEnded(i int, kind errKind, wait time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := &r.bg[i]
	if kind == kindOK {
		b.done++
		return
	}
	b.failed[kind]++
	b.failWait = max(b.failWait, wait)
	r.example("background", kind, err)
}

// priorityResult is one contender's priority phase.
type priorityResult struct {
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"critical_rate_per_s"`
	HoldMS  float64 `json:"hold_ms"`
	// Critical are the critical requests (half lookups in Short, half transactions in Tx), open
	// loop: latency from the scheduled time to the end of the call, a failed one ranked above
	// every served one (a quantile on it is null).
	Critical struct {
		Issued      int       `json:"issued"`
		OK          int       `json:"ok"`
		Failed      failed    `json:"failed"`
		Latency     quantiles `json:"latency_ms"`
		AcquireWait waitStats `json:"acquire_wait_ms"`
	} `json:"critical"`
	// BgShort and BgTx are the background, nil without it (the idle baseline).
	BgShort *bgResult `json:"background_short,omitempty"`
	BgTx    *bgResult `json:"background_tx,omitempty"`
	// Probe is the machine probe over the phase (probe.go).
	Probe waitStats `json:"machine_probe_ms"`
}

// bgResult is the background work of one lane.
type bgResult struct {
	Clients int    `json:"clients"`
	Done    int    `json:"done"`
	Failed  failed `json:"failed"`
	// WorstWaitMS is the longest wait for a connection, served or failed.
	WorstWaitMS float64   `json:"worst_wait_ms"`
	AcquireWait waitStats `json:"acquire_wait_ms"`
	// AgeMS is the lane's priority_age (null for pgxpool, 0 with priorities off), TimeoutMS its
	// acquire timeout, AgedGrants the grants by ageing (pgxlanes' Stat).
	AgeMS      *float64 `json:"priority_age_ms"`
	TimeoutMS  float64  `json:"acquire_timeout_ms"`
	AgedGrants int64    `json:"aged_grants"`
}

// prioCtx marks ctx with phase ph and, unless dropPriority, priority p.
func prioCtx(ctx context.Context, ph phase, p pgxlanes.Priority) context.Context {
	ctx = phaseContext(ctx, ph)
	if dropPriority {
		return ctx
	}
	return pgxlanes.WithPriority(ctx, p)
}

// runPriority runs the priority phase on a fresh pool of spec's.
func (d *demo) runPriority(ctx context.Context, spec contenderSpec) (*priorityResult, map[string]string, error) {
	cfg := d.cfg
	rec := newRecorder()
	ps, err := spec.build(ctx, d.dsn, cfg, rec)
	if err != nil {
		return nil, nil, err
	}
	defer ps.close()
	if err := waitConns(ctx, ps, int32(cfg.conns)); err != nil {
		return nil, nil, err
	}
	if err := warm(ctx, ps, cfg.longWorkers+1); err != nil {
		return nil, nil, err
	}
	d.logf("== %s: priority phase", spec.name)

	start := time.Now()
	rec.start = start
	// Every call is bounded by its lane's acquire timeout (or the lookup timeout) plus a hold:
	// the run winds down within that of its end.
	windDown := cfg.timeout + 10*time.Second + cfg.prioHold
	runCtx, cancel := context.WithDeadline(ctx, start.Add(cfg.prio+windDown))
	defer cancel()
	probeDone := probe(runCtx, d.admin, rec)
	progressDone := d.progress(runCtx, spec.name, rec, prioLine(rec))
	defer func() { cancel(); <-probeDone; <-progressDone }()

	var bg sync.WaitGroup
	bgCtx, stopBg := context.WithCancel(runCtx)
	defer stopBg()
	if spec.load {
		for i := range cfg.prioShortClients + cfg.prioTxClients {
			bg.Add(1)
			go func() {
				defer bg.Done()
				d.background(bgCtx, ps, i, i >= cfg.prioShortClients, rec)
			}()
		}
		// Let the background fill the pool and its queues before the critical requests start.
		if !sleepCtx(ctx, 2*cfg.prioHold) {
			return nil, nil, ctx.Err()
		}
	}
	from := time.Now()
	crit := d.critical(runCtx, ps, from, rec)
	crit.Wait()
	stopBg()
	bg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if err := runCtx.Err(); err != nil {
		return nil, nil, fmt.Errorf("the priority phase did not wind down within %v of its end: %w", windDown, err)
	}
	var ages *laneAges
	if ps.ages != nil {
		a := ps.ages()
		ages = &a
	}
	cancel()
	<-probeDone
	<-progressDone
	return rec.priorityResult(cfg, spec.load, ages, from), rec.examples, nil
}

// background runs one background client back to back until ctx ends: in Short a statement that
// holds its connection about prioHold, in Tx a transaction that does. Low priority. A failed call is
// recorded and retried after 10 ms.
func (d *demo) background(ctx context.Context, ps *pools, idx int, tx bool, rec *recorder) {
	// Holds vary by ±50 % and the clients start spread over a hold, so that they do not release
	// their connections in lockstep; the sequence is the same for every contender.
	rng := rand.New(rand.NewPCG(d.cfg.seed, 0xb6+uint64(idx)))
	if !sleepCtx(ctx, time.Duration(rng.Float64()*float64(d.cfg.prioHold))) {
		return
	}
	lane, ph := 0, phaseBgShort
	if tx {
		lane, ph = 1, phaseBgTx
	}
	cctx := prioCtx(ctx, ph, pgxlanes.PriorityLow)
	for ctx.Err() == nil {
		hold := d.cfg.prioHold.Seconds() * (0.5 + rng.Float64())
		t0 := time.Now()
		var err error
		acquired := false
		if tx {
			var t pgx.Tx
			t, err = ps.long.Begin(cctx)
			if err == nil {
				acquired = true
				_, err = t.Exec(cctx, prioWorkSQL, hold)
				if err == nil {
					err = t.Commit(cctx)
				} else {
					_ = t.Rollback(context.WithoutCancel(cctx))
				}
			}
		} else {
			var v any
			err = ps.short.QueryRow(cctx, prioWorkSQL, hold).Scan(&v)
		}
		if ctx.Err() != nil {
			return // stopped: not counted
		}
		kind := classify(err)
		if acquired && kind == kindAcquireTimeout {
			kind = kindOther
		}
		rec.bgEnded(lane, kind, time.Since(t0), err)
		if err != nil {
			sleepCtx(ctx, 10*time.Millisecond)
		}
	}
}

// critical issues the critical requests open-loop from from, cfg.prioRate a second for cfg.prio,
// alternating a primary-key lookup in Short and a transaction in Tx that reads a row; latency
// counts from the scheduled time. It returns a WaitGroup that is done when they all are.
func (d *demo) critical(ctx context.Context, ps *pools, from time.Time, rec *recorder) *sync.WaitGroup {
	cfg := d.cfg
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(cfg.seed, 0xc1))
	hot := cfg.longWorkers
	interval := time.Duration(float64(time.Second) / cfg.prioRate)
	base := prioCtx(ctx, phaseCritical, pgxlanes.PriorityCritical)
	for k := range int(cfg.prio / interval) {
		at := from.Add(time.Duration(k) * interval)
		if !sleepUntil(ctx, at) {
			break
		}
		id := hot + 1 + rng.IntN(cfg.rows-hot)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithDeadline(base, at.Add(cfg.timeout))
			defer cancel()
			var val string
			var err error
			if k%2 == 0 {
				err = ps.short.QueryRow(cctx, lookupSQL, id).Scan(&val)
			} else {
				var t pgx.Tx
				if t, err = ps.long.Begin(cctx); err == nil {
					if err = t.QueryRow(cctx, lookupSQL, id).Scan(&val); err == nil {
						err = t.Commit(cctx)
					} else {
						_ = t.Rollback(context.WithoutCancel(cctx))
					}
				}
			}
			rec.short(phaseCritical, at, time.Since(at), classify(err), err)
		}()
	}
	return &wg
}

// priorityResult summarizes the priority phase, which started (its critical requests) at from.
func (r *recorder) priorityResult(cfg *config, load bool, ages *laneAges, from time.Time) *priorityResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	pr := &priorityResult{Seconds: cfg.prio.Seconds(), Rate: cfg.prioRate, HoldMS: ms(cfg.prioHold)}
	var ok []time.Duration
	for _, s := range r.shorts {
		if s.ph != phaseCritical {
			continue
		}
		pr.Critical.Issued++
		pr.Critical.Failed.add(s.kind)
		if s.kind == kindOK {
			ok = append(ok, s.lat)
		}
	}
	pr.Critical.OK = len(ok)
	slices.Sort(ok)
	pr.Critical.Latency = latencyQuantiles(ok, pr.Critical.Issued)
	pr.Critical.AcquireWait = waitQuantiles(r.acquires[phaseCritical])
	var probes []time.Duration
	for _, p := range r.probes {
		if p.at >= from.Sub(r.start) {
			probes = append(probes, p.lat)
		}
	}
	pr.Probe = waitQuantiles(probes)
	if !load {
		return pr
	}
	for i, ph := range []phase{phaseBgShort, phaseBgTx} {
		b := r.bg[i]
		br := &bgResult{Clients: []int{cfg.prioShortClients, cfg.prioTxClients}[i], Done: b.done,
			AcquireWait: waitQuantiles(r.acquires[ph])}
		for k := kindAcquireTimeout; k < numKinds; k++ {
			for range b.failed[k] {
				br.Failed.add(k)
			}
		}
		br.WorstWaitMS = max(br.AcquireWait.MaxMS, ms(b.failWait))
		if ages != nil {
			age := []time.Duration{ages.Short, ages.Tx}[i]
			a := ms(age)
			br.AgeMS = &a
			br.TimeoutMS = ms([]time.Duration{ages.ShortTimeout, ages.TxTimeout}[i])
			br.AgedGrants = []int64{ages.AgedShort, ages.AgedTx}[i]
		}
		if i == 0 {
			pr.BgShort = br
		} else {
			pr.BgTx = br
		}
	}
	return pr
}

// prioLine is the priority phase's progress line: the critical requests so far, the p99 of those
// finished in the last second, and the background calls done.
func prioLine(rec *recorder) func(p progressLine, recent string) string {
	return func(p progressLine, recent string) string {
		rec.mu.Lock()
		bgShort, bgTx := rec.bg[0].done, rec.bg[1].done
		rec.mu.Unlock()
		return fmt.Sprintf("priority   critical: %4d done %3d failed, p99 of last 1s %s | background done: %d in Short, %d in Tx",
			p.done, p.failed, recent, bgShort, bgTx)
	}
}
