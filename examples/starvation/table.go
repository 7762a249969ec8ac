package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

func (r *report) printTable(w io.Writer, cfg *config) {
	fmt.Fprintf(w, "\nstarvation demo: %d CPUs (%s), %s, PostgreSQL %s\n", r.Machine.CPUs, r.Machine.CPUModel, r.Machine.Go, r.Machine.Postgres)
	fmt.Fprintf(w, "every contender has %d connections; long transactions lock a row and hold it %v ± %.0f%%\n",
		cfg.conns, cfg.longHold, cfg.longJitter*100)
	for _, c := range r.Contenders {
		fmt.Fprintf(w, "  %-16s %s\n", c.Name, c.About)
	}

	// phaseTable prints one phase's lookups; its last columns are the long transactions that
	// committed in it or, in the learn and slow phases, the slow statements that completed.
	phaseTable := func(title string, ph phase) {
		slow := ph == phaseLearn || ph == phaseSlow
		fmt.Fprintf(w, "\n%s\n", title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		last := "long tx\t"
		if slow {
			last = "slow done\tslow failed\t"
		}
		fmt.Fprintln(tw, "contender\tp50\tp99\tp99.9\tmax\tacquire p99\tacquire max\tok\tfailed\t(timeout/full/deadline/other)\t"+last)
		for _, c := range r.Contenders {
			pr := c.judged(ph)
			if pr == nil || pr.Issued == 0 { // no lookups: -learn 0
				continue
			}
			last := "-\t"
			switch {
			case slow && c.SlowStmts != nil:
				last = fmt.Sprintf("%d\t%d\t", pr.SlowDone, pr.SlowFailed)
			case slow:
				last = "-\t-\t"
			case c.Load:
				last = fmt.Sprintf("%d\t", pr.LongCommitted)
			}
			f := pr.Failed
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t(%d/%d/%d/%d)\t%s\n", c.Name,
				fmtMS(pr.Latency.P50), fmtMS(pr.Latency.P99), fmtMS(pr.Latency.P999), fmtMS(pr.Latency.Max),
				fmtWait(pr.AcquireWait.P99MS, pr.AcquireWait.N), fmtWait(pr.AcquireWait.MaxMS, pr.AcquireWait.N),
				pr.OK, f.total(), f.AcquireTimeout, f.LaneFull, f.Deadline, f.Other, last)
		}
		tw.Flush()
	}
	phaseTable(fmt.Sprintf("steady phase, %v: %d long transactions, %g lookups/s (primary key) — short-query latency",
		cfg.steady, cfg.longWorkers, cfg.rate), phaseSteady)
	phaseTable(fmt.Sprintf("burst phase, %v: %d long transactions, %g lookups/s with %v of server work each — short-query latency",
		cfg.burst, cfg.burstLongWorkers, cfg.burstRate, cfg.burstWork), phaseBurst)
	phaseTable(fmt.Sprintf("slow phase, %v from the first slow statement, its learning window (%v) included: no long transactions, %d clients of an unannotated %q back to back, %g lookups/s (primary key) — short-query latency",
		cfg.learn+cfg.slow, cfg.learn, cfg.slowClients, slowSQL(cfg), cfg.rate), phaseSlow)
	phaseTable(fmt.Sprintf("learning window, the first %v of the slow phase (included in the slow phase above)", cfg.learn), phaseLearn)

	fmt.Fprintf(w, "\nwhole run\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tseconds\tlong tx committed\tlong tx/s\tlong failed\tlong acquire p99\tserver sessions\tconns opened\t")
	for _, c := range r.Contenders {
		if (!c.Load || c.Steady == nil) && c.SlowStmts == nil {
			continue
		}
		sess := "n/a"
		if c.Sessions.Server != nil {
			sess = fmt.Sprint(*c.Sessions.Server)
		}
		long := "-\t-\t-\t-"
		if c.Load {
			long = fmt.Sprintf("%d\t%.2f\t%d\t%s", c.Long.Committed, c.Long.PerSecond, c.Long.Failed.total(),
				fmtWait(c.Long.AcquireWait.P99MS, c.Long.AcquireWait.N))
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%s\t%s\t%d\t\n", c.Name, c.Seconds, long, sess, c.Sessions.NewConns)
	}
	tw.Flush()

	fmt.Fprintf(w, "\nslow statements, learning period and slow phase (%d clients of %q)\n", cfg.slowClients, slowSQL(cfg))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tcompleted\tper second\tfailed\t(timeout/full/deadline/other)\twithdrawn at end\tlatency p50\tmax\tacquire p99\tlearned\t")
	for _, c := range r.Contenders {
		s := c.SlowStmts
		if s == nil {
			continue
		}
		var secs float64
		for _, pr := range []*phaseResult{c.Learn, c.Slow} {
			if pr != nil {
				secs += pr.Seconds
			}
		}
		learned := "-"
		if l := c.Learning; l != nil && l.ThresholdMS == 0 {
			learned = "off"
		} else if l != nil {
			learned = fmt.Sprintf("%d demoted (threshold %s; Long's cap %d)", l.Demotions, fmtMS(&l.ThresholdMS), l.LongMaxConns)
		}
		f := s.Failed
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%d\t(%d/%d/%d/%d)\t%d\t%s\t%s\t%s\t%s\t\n", c.Name, s.Completed,
			float64(s.Completed)/max(secs, 1e-9), f.total(), f.AcquireTimeout, f.LaneFull, f.Deadline, f.Other, s.Withdrawn,
			fmtMS(s.Latency.P50), fmtMS(s.Latency.Max), fmtWait(s.AcquireWait.P99MS, s.AcquireWait.N), learned)
	}
	tw.Flush()

	r.printPriority(w, cfg)

	fmt.Fprintf(w, "\nratios (one run, side by side)\n")
	ra := r.Ratios
	failedNote := func(name string, ph phase) string {
		c := r.contender(name)
		pr := c.judged(ph)
		if pr == nil || pr.Latency.P99 != nil {
			return ""
		}
		return fmt.Sprintf("(%s's p99 is a failed lookup: %d of %d failed)", name, pr.Failed.total(), pr.Issued)
	}
	for _, l := range []struct {
		name string
		v    *float64
		note string
	}{
		{"steady  pgxpool p99 / pgxlanes p99", ra.SteadyPgxpoolOverLanes, failedNote("pgxpool", phaseSteady)},
		{"steady  two-pool p99 / pgxlanes p99", ra.SteadyTwoPoolOverLanes, failedNote("two-pool", phaseSteady)},
		{"steady  pgxlanes p99 / idle p99", ra.SteadyLanesOverIdle, failedNote("pgxlanes", phaseSteady)},
		{"burst   pgxpool p99 / pgxlanes p99", ra.BurstPgxpoolOverLanes, failedNote("pgxpool", phaseBurst)},
		{"burst   two-pool p99 / pgxlanes p99", ra.BurstTwoPoolOverLanes, failedNote("two-pool", phaseBurst)},
		{"burst   pgxlanes p99 / idle p99", ra.BurstLanesOverIdle, failedNote("pgxlanes", phaseBurst)},
		{"long tx committed, pgxlanes / two-pool", ra.LongLanesOverTwoPool, ""},
		{"long tx committed, pgxlanes / pgxpool", ra.LongLanesOverPgxpool, ""},
		{"slow    pgxpool p99 / pgxlanes p99", ra.SlowPgxpoolOverLanes, failedNote("pgxpool", phaseSlow)},
		{"slow    two-pool p99 / pgxlanes p99", ra.SlowTwoPoolOverLanes, failedNote("two-pool", phaseSlow)},
		{"slow    pgxlanes-nolearn p99 / pgxlanes p99", ra.SlowNoLearnOverLanes, failedNote("pgxlanes-nolearn", phaseSlow)},
		{"slow    pgxlanes p99 / idle p99", ra.SlowLanesOverIdle, failedNote("pgxlanes", phaseSlow)},
		{"critical pgxpool p99 / pgxlanes p99", ra.CriticalPgxpoolOverLanes, ""},
		{"critical pgxlanes-fifo p99 / pgxlanes p99", ra.CriticalFifoOverLanes, ""},
		{"critical pgxlanes p99 / idle p99", ra.CriticalLanesOverIdle, ""},
	} {
		fmt.Fprintf(w, "  %s\n", strings.TrimSpace(fmt.Sprintf("%-44s %s %s", l.name, fmtRatio(l.v), l.note)))
	}
	fmt.Fprintf(w, "\nverdict: each bound from this run's own figures (docs/demo.md, \"The verdict\")\n")
	for _, t := range r.Targets {
		mark := "FAIL"
		switch {
		case t.NotRun:
			mark = "not run"
		case t.Inconclusive != "":
			mark = "inconclusive: " + t.Inconclusive
		case t.Met:
			mark = "pass"
		}
		got := fmtRatio(t.Got)
		switch {
		case t.Got == nil:
		case t.Count:
			got = fmt.Sprint(*t.Got)
		case t.MS:
			got = fmtDurMS(*t.Got)
		}
		fmt.Fprintf(w, "  %-44s %-10s want %-52s %s\n", t.What, got, t.Want, mark)
	}
	switch r.Verdict {
	case "pass":
		var claims []string
		for _, c := range r.Contenders {
			if c.Name == "pgxlanes" && (c.Steady != nil || c.Slow != nil) {
				claims = append(claims, "pgxlanes' lookups did not wait for the transactions nor for the slow statements")
			}
			if c.Name == "pgxlanes" && c.Priority != nil {
				claims = append(claims, "its critical requests went ahead of the background, which did not starve")
			}
		}
		fmt.Fprintf(w, "verdict: PASS: %s\n", strings.Join(claims, "; "))
	case "inconclusive":
		fmt.Fprintf(w, "verdict: INCONCLUSIVE: the machine was too busy to serve the lookups even on an idle pool; run it again when it is quieter\n")
	case "incomplete":
		fmt.Fprintf(w, "verdict: INCOMPLETE: a contender a check needs was not run (-contenders)\n")
	default:
		fmt.Fprintf(w, "verdict: FAIL: %s\n", strings.Join(r.failedChecks(), "; "))
	}
	if errs := r.errorExamples(); len(errs) > 0 {
		fmt.Fprintf(w, "\nfirst error of each kind\n")
		for _, e := range errs {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
}

func (r *report) errorExamples() []string {
	var out []string
	for _, c := range r.Contenders {
		for _, k := range []string{"lookup acquire_timeout", "lookup lane_full", "lookup deadline", "lookup other",
			"long acquire_timeout", "long lane_full", "long deadline", "long other",
			"slow acquire_timeout", "slow lane_full", "slow deadline", "slow other",
			"priority lookup acquire_timeout", "priority lookup lane_full", "priority lookup deadline", "priority lookup other",
			"priority background acquire_timeout", "priority background lane_full", "priority background deadline",
			"priority background other"} {
			if msg, ok := c.Errors[k]; ok {
				out = append(out, fmt.Sprintf("%-16s %-22s %s", c.Name, k, msg))
			}
		}
	}
	return out
}

func fmtMS(v *float64) string {
	if v == nil {
		return "failed"
	}
	return fmtDur(time.Duration(*v * float64(time.Millisecond)))
}

func fmtWait(msv float64, n int) string {
	if n == 0 {
		return "-"
	}
	return fmtDur(time.Duration(msv * float64(time.Millisecond)))
}

// fmtDur prints a latency with three significant digits in ms below a second, in s above.
func fmtDur(d time.Duration) string {
	m := float64(d) / float64(time.Millisecond)
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", m/1000)
	case m >= 100:
		return fmt.Sprintf("%.0fms", m)
	case m >= 10:
		return fmt.Sprintf("%.1fms", m)
	default:
		return fmt.Sprintf("%.2fms", m)
	}
}

func fmtRatio(v *float64) string {
	if v == nil {
		return "n/a"
	}
	switch {
	case *v >= 100:
		return fmt.Sprintf("%.0f×", *v)
	case *v >= 10:
		return fmt.Sprintf("%.1f×", *v)
	}
	return fmt.Sprintf("%.2f×", *v)
}

// printPriority prints the priority phase's table: the critical requests' latency, and the
// background's worst wait for a connection beside its lane's ageing bound (priority_age + a hold).
func (r *report) printPriority(w io.Writer, cfg *config) {
	ran := false
	for _, c := range r.Contenders {
		ran = ran || c.Priority != nil
	}
	if !ran {
		return
	}
	fmt.Fprintf(w, "\npriority phase, %v: %d + %d background clients of low priority hold a connection %v each, back to back, in Short and in Tx; %g critical requests/s (half lookups in Short, half transactions in Tx) — critical latency; background's worst wait against its bound (priority_age + one hold)\n",
		cfg.prio, cfg.prioShortClients, cfg.prioTxClients, cfg.prioHold, cfg.prioRate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tcritical p50\tp99\tmax\tacquire p99\tok\tfailed\tbg short done\tworst wait\tbound\tfailed\tbg tx done\tworst wait\tbound\tfailed\taged grants\t")
	for _, c := range r.Contenders {
		p := c.Priority
		if p == nil {
			continue
		}
		cr := p.Critical
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t", c.Name, fmtMS(cr.Latency.P50), fmtMS(cr.Latency.P99),
			fmtMS(cr.Latency.Max), fmtWait(cr.AcquireWait.P99MS, cr.AcquireWait.N), cr.OK, cr.Failed.total())
		aged := "-"
		for _, b := range []*bgResult{p.BgShort, p.BgTx} {
			if b == nil {
				fmt.Fprint(tw, "-\t-\t-\t-\t")
				continue
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t", b.Done, fmtDurMS(b.WorstWaitMS), fmtBound(b, p.HoldMS), b.Failed.total())
		}
		if p.BgShort != nil && p.BgShort.AgeMS != nil {
			aged = fmt.Sprintf("%d/%d", p.BgShort.AgedGrants, p.BgTx.AgedGrants)
		}
		fmt.Fprintf(tw, "%s\t\n", aged)
	}
	tw.Flush()
}

// fmtBound prints a background lane's ageing bound: priority_age + one hold; "none" without
// one (pgxpool, or priorities off).
func fmtBound(b *bgResult, holdMS float64) string {
	if b.AgeMS == nil || *b.AgeMS == 0 {
		return "none"
	}
	return fmtDurMS(*b.AgeMS + holdMS)
}
