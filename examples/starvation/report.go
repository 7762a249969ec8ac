package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// report is everything the demo measured; it is what -json writes.
type report struct {
	Machine    machine            `json:"machine"`
	Args       []string           `json:"args"`
	Flags      map[string]string  `json:"flags"`
	Contenders []*contenderResult `json:"contenders"`
	Ratios     ratios             `json:"ratios"`
	Targets    []target           `json:"targets"`
}

type machine struct {
	CPUs     int    `json:"cpus"`
	CPUModel string `json:"cpu_model"`
	GOOS     string `json:"goos"`
	GOARCH   string `json:"goarch"`
	Go       string `json:"go"`
	Postgres string `json:"postgres"`
	Date     string `json:"date"`
}

type contenderResult struct {
	Name    string  `json:"name"`
	About   string  `json:"about"`
	Load    bool    `json:"long_load"`
	Seconds float64 `json:"seconds"`
	// The phases of the short traffic. Transition (while the long load drops) is recorded but not
	// in the table; the idle baseline has none.
	Steady     *phaseResult `json:"steady,omitempty"`
	Transition *phaseResult `json:"transition,omitempty"`
	Burst      *phaseResult `json:"burst,omitempty"`
	Long       longResult   `json:"long_tx"`
	Sessions   sessions     `json:"sessions"`
	// Errors holds the first error message of each kind, for lookups and long transactions.
	Errors map[string]string `json:"errors,omitempty"`
}

type phaseResult struct {
	FromS   float64 `json:"from_s"` // start, in seconds from the contender's start
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate_per_s"`
	WorkMS  float64 `json:"work_ms"`
	Issued  int     `json:"issued"`
	OK      int     `json:"ok"`
	Failed  failed  `json:"failed"`
	// Latency is from the scheduled time to the end of the call, over every issued lookup; a
	// quantile that falls on a failed lookup is null.
	Latency     quantiles `json:"latency_ms"`
	AcquireWait waitStats `json:"acquire_wait_ms"`
	// LongCommitted counts the long transactions that committed during the phase.
	LongCommitted int `json:"long_tx_committed"`
	// Samples are the successful lookups: scheduled time and latency, in ms.
	Samples struct {
		AtMS      []float64 `json:"at_ms"`
		LatencyMS []float64 `json:"latency_ms"`
	} `json:"samples"`
	FailedAtMS []float64 `json:"failed_at_ms,omitempty"`
}

type quantiles struct {
	P50  *float64 `json:"p50"`
	P99  *float64 `json:"p99"`
	P999 *float64 `json:"p99_9"`
	Max  *float64 `json:"max"`
}

type waitStats struct {
	N     int     `json:"n"`
	P99MS float64 `json:"p99"`
	MaxMS float64 `json:"max"`
}

type failed struct {
	AcquireTimeout int `json:"acquire_timeout"`
	LaneFull       int `json:"lane_full"`
	Deadline       int `json:"deadline"`
	Other          int `json:"other"`
}

func (f *failed) add(k errKind) {
	switch k {
	case kindAcquireTimeout:
		f.AcquireTimeout++
	case kindLaneFull:
		f.LaneFull++
	case kindDeadline:
		f.Deadline++
	case kindOther:
		f.Other++
	}
}

func (f failed) total() int { return f.AcquireTimeout + f.LaneFull + f.Deadline + f.Other }

type longResult struct {
	Committed   int       `json:"committed"`
	PerSecond   float64   `json:"per_second"`
	Failed      failed    `json:"failed"`
	AcquireWait waitStats `json:"acquire_wait_ms"`
}

type sessions struct {
	// Server is the pg_stat_database.sessions delta (PostgreSQL 14+), warm-up included.
	Server *int64 `json:"server"`
	// NewConns is the connections the contender's pools opened.
	NewConns int64 `json:"new_conns"`
}

// ratios are the figures the project's targets are stated in. A ratio is null when one side has
// no figure (a percentile that fell on failed lookups).
type ratios struct {
	SteadyPgxpoolOverLanes *float64 `json:"steady_p99_pgxpool_over_pgxlanes"`
	SteadyTwoPoolOverLanes *float64 `json:"steady_p99_two_pool_over_pgxlanes"`
	SteadyLanesOverIdle    *float64 `json:"steady_p99_pgxlanes_over_idle"`
	BurstPgxpoolOverLanes  *float64 `json:"burst_p99_pgxpool_over_pgxlanes"`
	BurstTwoPoolOverLanes  *float64 `json:"burst_p99_two_pool_over_pgxlanes"`
	BurstLanesOverIdle     *float64 `json:"burst_p99_pgxlanes_over_idle"`
	LongLanesOverTwoPool   *float64 `json:"long_tx_pgxlanes_over_two_pool"`
	LongLanesOverPgxpool   *float64 `json:"long_tx_pgxlanes_over_pgxpool"`
}

type target struct {
	What string   `json:"what"`
	Want string   `json:"want"`
	Got  *float64 `json:"got"`
	Met  bool     `json:"met"`
}

func (r *report) contender(name string) *contenderResult {
	for _, c := range r.Contenders {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func div(a, b *float64) *float64 {
	if a == nil || b == nil || *b == 0 {
		return nil
	}
	v := *a / *b
	v = math.Round(v*1000) / 1000
	return &v
}

func p99(c *contenderResult, burst bool) *float64 {
	if c == nil {
		return nil
	}
	pr := c.Steady
	if burst {
		pr = c.Burst
	}
	if pr == nil {
		return nil
	}
	return pr.Latency.P99
}

func committed(c *contenderResult) *float64 {
	if c == nil {
		return nil
	}
	v := float64(c.Long.Committed)
	return &v
}

// compute fills the ratios and checks the targets.
func (r *report) compute() {
	idle, pool, two, lanes := r.contender("idle"), r.contender("pgxpool"), r.contender("two-pool"), r.contender("pgxlanes")
	r.Ratios = ratios{
		SteadyPgxpoolOverLanes: div(p99(pool, false), p99(lanes, false)),
		SteadyTwoPoolOverLanes: div(p99(two, false), p99(lanes, false)),
		SteadyLanesOverIdle:    div(p99(lanes, false), p99(idle, false)),
		BurstPgxpoolOverLanes:  div(p99(pool, true), p99(lanes, true)),
		BurstTwoPoolOverLanes:  div(p99(two, true), p99(lanes, true)),
		BurstLanesOverIdle:     div(p99(lanes, true), p99(idle, true)),
		LongLanesOverTwoPool:   div(committed(lanes), committed(two)),
		LongLanesOverPgxpool:   div(committed(lanes), committed(pool)),
	}
	atLeast := func(v *float64, x float64) bool { return v != nil && *v >= x }
	atMost := func(v *float64, x float64) bool { return v != nil && *v <= x }
	ra := r.Ratios
	r.Targets = []target{
		{"steady: pgxlanes p99 / idle p99", "≤ 2", ra.SteadyLanesOverIdle, atMost(ra.SteadyLanesOverIdle, 2)},
		{"steady: pgxpool p99 / pgxlanes p99", "≥ 1000", ra.SteadyPgxpoolOverLanes, atLeast(ra.SteadyPgxpoolOverLanes, 1000)},
		{"steady: two-pool p99 / pgxlanes p99", "≥ 0.9 (equal within noise, or better)", ra.SteadyTwoPoolOverLanes,
			atLeast(ra.SteadyTwoPoolOverLanes, 0.9)},
		{"burst: two-pool p99 / pgxlanes p99", "≥ 2 (clearly better)", ra.BurstTwoPoolOverLanes, atLeast(ra.BurstTwoPoolOverLanes, 2)},
		{"long tx committed: pgxlanes / two-pool", "≥ 0.9 (within 10 %)", ra.LongLanesOverTwoPool, atLeast(ra.LongLanesOverTwoPool, 0.9)},
	}
}

func (r *report) printTable(w io.Writer, cfg *config) {
	fmt.Fprintf(w, "\nstarvation demo: %d CPUs (%s), %s, PostgreSQL %s\n", r.Machine.CPUs, r.Machine.CPUModel, r.Machine.Go, r.Machine.Postgres)
	fmt.Fprintf(w, "every contender has %d connections; long transactions lock a row and hold it %v ± %.0f%%\n",
		cfg.conns, cfg.longHold, cfg.longJitter*100)
	for _, c := range r.Contenders {
		fmt.Fprintf(w, "  %-9s %s\n", c.Name, c.About)
	}

	phaseTable := func(title string, get func(*contenderResult) *phaseResult) {
		fmt.Fprintf(w, "\n%s\n", title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "contender\tp50\tp99\tp99.9\tmax\tacquire p99\tacquire max\tok\tfailed\t(timeout/full/deadline/other)\tlong tx\t")
		for _, c := range r.Contenders {
			pr := get(c)
			if pr == nil {
				continue
			}
			longTx := "-"
			if c.Load {
				longTx = fmt.Sprint(pr.LongCommitted)
			}
			f := pr.Failed
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t(%d/%d/%d/%d)\t%s\t\n", c.Name,
				fmtMS(pr.Latency.P50), fmtMS(pr.Latency.P99), fmtMS(pr.Latency.P999), fmtMS(pr.Latency.Max),
				fmtWait(pr.AcquireWait.P99MS, pr.AcquireWait.N), fmtWait(pr.AcquireWait.MaxMS, pr.AcquireWait.N),
				pr.OK, f.total(), f.AcquireTimeout, f.LaneFull, f.Deadline, f.Other, longTx)
		}
		tw.Flush()
	}
	phaseTable(fmt.Sprintf("steady phase, %v: %d long transactions, %g lookups/s (primary key) — short-query latency",
		cfg.steady, cfg.longWorkers, cfg.rate), func(c *contenderResult) *phaseResult { return c.Steady })
	phaseTable(fmt.Sprintf("burst phase, %v: %d long transactions, %g lookups/s with %v of server work each — short-query latency",
		cfg.burst, cfg.burstLongWorkers, cfg.burstRate, cfg.burstWork), func(c *contenderResult) *phaseResult { return c.Burst })

	fmt.Fprintf(w, "\nwhole run\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tseconds\tlong tx committed\tlong tx/s\tlong failed\tlong acquire p99\tserver sessions\tconns opened\t")
	for _, c := range r.Contenders {
		if !c.Load {
			continue
		}
		sess := "n/a"
		if c.Sessions.Server != nil {
			sess = fmt.Sprint(*c.Sessions.Server)
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%d\t%.2f\t%d\t%s\t%s\t%d\t\n", c.Name, c.Seconds, c.Long.Committed, c.Long.PerSecond,
			c.Long.Failed.total(), fmtWait(c.Long.AcquireWait.P99MS, c.Long.AcquireWait.N), sess, c.Sessions.NewConns)
	}
	tw.Flush()

	fmt.Fprintf(w, "\nratios (one run, side by side)\n")
	ra := r.Ratios
	for _, l := range []struct {
		name string
		v    *float64
	}{
		{"steady  pgxpool p99 / pgxlanes p99", ra.SteadyPgxpoolOverLanes},
		{"steady  two-pool p99 / pgxlanes p99", ra.SteadyTwoPoolOverLanes},
		{"steady  pgxlanes p99 / idle p99", ra.SteadyLanesOverIdle},
		{"burst   pgxpool p99 / pgxlanes p99", ra.BurstPgxpoolOverLanes},
		{"burst   two-pool p99 / pgxlanes p99", ra.BurstTwoPoolOverLanes},
		{"burst   pgxlanes p99 / idle p99", ra.BurstLanesOverIdle},
		{"long tx committed, pgxlanes / two-pool", ra.LongLanesOverTwoPool},
		{"long tx committed, pgxlanes / pgxpool", ra.LongLanesOverPgxpool},
	} {
		fmt.Fprintf(w, "  %-40s %s\n", l.name, fmtRatio(l.v))
	}
	fmt.Fprintf(w, "\ntargets\n")
	for _, t := range r.Targets {
		mark := "MISSED"
		if t.Met {
			mark = "met"
		}
		fmt.Fprintf(w, "  %-40s %-10s want %-40s %s\n", t.What, fmtRatio(t.Got), t.Want, mark)
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
			"long acquire_timeout", "long lane_full", "long deadline", "long other"} {
			if msg, ok := c.Errors[k]; ok {
				out = append(out, fmt.Sprintf("%-9s %-22s %s", c.Name, k, msg))
			}
		}
	}
	return out
}

func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
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

func machineInfo(ctx context.Context, conn *pgx.Conn) machine {
	m := machine{CPUs: runtime.NumCPU(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, Go: runtime.Version(),
		Date: time.Now().UTC().Format(time.DateOnly)}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	_ = conn.QueryRow(ctx, "show server_version").Scan(&m.Postgres)
	return m
}
