package main

import "fmt"

// The priority phase's checks (priority.go), in the spirit of the others: each bound comes from
// the same run's figures, and the unit of noise is the background's hold.
//
//   - critical requests are served ahead of the background: pgxlanes' critical p99 is at most
//     half the critical p99 of pgxlanes-fifo (the same pool with priorities off) from the same
//     run, or within half a hold of the idle pool's. Without priorities, a critical request waits
//     for the background queued before it, several holds (pgxlanes-fifo's and pgxpool's figures
//     in every run); with them it waits for the next connection its lane frees, less than a hold;
//   - no background call starves: in each lane the longest wait for a connection, served or
//     failed, is within the lane's priority_age plus one hold, and none was refused (ErrLaneFull)
//     or failed otherwise. A call that failed by its own acquire timeout counts with its wait,
//     so it passes only if that timeout is within the bound.
//
// A failed check is inconclusive when the idle pool itself failed critical requests, or when the
// machine probe's p99 over pgxlanes' priority phase was over a hold (the machine stalled).
func (r *report) priorityChecks() []target {
	idle, fifo, lanes := r.contender("idle"), r.contender("pgxlanes-fifo"), r.contender("pgxlanes")
	pr := func(c *contenderResult) *priorityResult {
		if c == nil {
			return nil
		}
		return c.Priority
	}
	pIdle, pFifo, pLanes := pr(idle), pr(fifo), pr(lanes)
	var ts []target

	{
		t := target{What: "priority: pgxlanes critical p99", MS: true, NotRun: pIdle == nil || pFifo == nil || pLanes == nil}
		if !t.NotRun {
			t.Got = pLanes.Critical.Latency.P99
			hold := pLanes.HoldMS
			fifoP99, idleP99 := pFifo.Critical.Latency.P99, pIdle.Critical.Latency.P99
			fifoBound, idleBound := "failed", "failed"
			if fifoP99 != nil {
				fifoBound = fmtDurMS(*fifoP99 / 2)
			}
			if idleP99 != nil {
				idleBound = fmtDurMS(*idleP99 + hold/2)
			}
			t.Want = fmt.Sprintf("≤ fifo p99/2 = %s or idle p99 + hold/2 = %s", fifoBound, idleBound)
			// pgxlanes-fifo's p99 fell on a failed request: pgxlanes', served, is below it.
			t.Met = t.Got != nil && (fifoP99 == nil || *t.Got <= *fifoP99/2 || (idleP99 != nil && *t.Got <= *idleP99+hold/2))
			if n := pIdle.Critical.Failed.total(); n > 0 {
				t.Inconclusive = fmt.Sprintf("the idle pool itself failed %d of %d critical requests", n, pIdle.Critical.Issued)
			}
		}
		ts = append(ts, t)
	}
	for _, l := range []struct {
		name string
		bg   func(*priorityResult) *bgResult
	}{
		{"short", func(p *priorityResult) *bgResult { return p.BgShort }},
		{"tx", func(p *priorityResult) *bgResult { return p.BgTx }},
	} {
		t := target{What: "priority: background worst wait, " + l.name, MS: true, NotRun: pLanes == nil || l.bg(pLanes) == nil}
		if !t.NotRun {
			b := l.bg(pLanes)
			t.Got = &b.WorstWaitMS
			refused := b.Failed.LaneFull + b.Failed.Deadline + b.Failed.Other
			switch {
			case b.AgeMS == nil || *b.AgeMS == 0:
				t.Want = "≤ priority_age + hold (priorities off: no bound)"
			default:
				bound := *b.AgeMS + pLanes.HoldMS
				t.Want = fmt.Sprintf("≤ priority_age + hold = %s, none refused (%d)", fmtDurMS(bound), refused)
				t.Met = b.WorstWaitMS <= bound && refused == 0
			}
		}
		ts = append(ts, t)
	}
	if pLanes != nil && pLanes.Probe.N > 0 && pLanes.Probe.P99MS > pLanes.HoldMS {
		for i := range ts {
			if t := &ts[i]; !t.Met && !t.NotRun && t.Inconclusive == "" {
				t.Inconclusive = fmt.Sprintf("the machine stalled: probe p99 %s in pgxlanes' priority phase, over a hold (%s)",
					fmtDurMS(pLanes.Probe.P99MS), fmtDurMS(pLanes.HoldMS))
			}
		}
	}
	return ts
}
