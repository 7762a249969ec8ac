package main

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"runtime"
	"strings"
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
	// Targets are the verdict's checks; Verdict is "pass", "fail", "inconclusive" (the machine
	// could not serve a phase's lookups even on an idle pool) or "incomplete" (a contender a
	// check needs was not run).
	Targets []target `json:"targets"`
	Verdict string   `json:"verdict"`
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
	// in the tables; the idle baseline has none, nor a learning period (Learn, in its own table),
	// and pgxlanes-nolearn runs only Learn and Slow.
	Steady     *phaseResult `json:"steady,omitempty"`
	Transition *phaseResult `json:"transition,omitempty"`
	Burst      *phaseResult `json:"burst,omitempty"`
	Learn      *phaseResult `json:"learn,omitempty"`
	Slow       *phaseResult `json:"slow,omitempty"`
	// SlowWhole is the learning period and the slow phase as one, from the first slow statement,
	// without samples (they are in Learn and Slow): what the slow-phase table, its ratios and the
	// verdict judge. The idle baseline has none (no learning period): its Slow is judged.
	SlowWhole *phaseResult `json:"slow_whole,omitempty"`
	Long      longResult   `json:"long_tx"`
	// SlowStmts are the unannotated slow statements of the learn and slow phases.
	SlowStmts *slowResult `json:"slow_statements,omitempty"`
	// Priority is the priority phase (priority.go), on a pool of its own.
	Priority *priorityResult `json:"priority,omitempty"`
	// Learning is pgxlanes' Stat().Learning() at the end of the run (pgxlanes contenders only).
	Learning *learningResult `json:"learning,omitempty"`
	Sessions sessions        `json:"sessions"`
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
	// Probe is the machine probe's latency during the phase (probe.go): how late a "select 1"
	// on a connection outside the pools ended, from the time it was due.
	Probe waitStats `json:"machine_probe_ms"`
	// LongCommitted counts the long transactions that committed during the phase; SlowDone and
	// SlowFailed the unannotated slow statements that completed or failed during it.
	LongCommitted int `json:"long_tx_committed"`
	SlowDone      int `json:"slow_done"`
	SlowFailed    int `json:"slow_failed"`
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
	Committed int `json:"committed"`
	// PerSecond is over the time the transactions ran: from the start to the learning period.
	PerSecond   float64   `json:"per_second"`
	Failed      failed    `json:"failed"`
	AcquireWait waitStats `json:"acquire_wait_ms"`
	// HoldP50MS is the median time a committed transaction held its row lock, from the lock to
	// the commit (a worker's first transaction, a part of a hold, is not counted); 0 for none.
	HoldP50MS float64 `json:"hold_p50_ms"`
}

// slowResult is what became of the unannotated slow statements, over the learn and slow phases.
type slowResult struct {
	Completed int    `json:"completed"`
	Failed    failed `json:"failed"`
	// Withdrawn: still waiting for a connection when the slow phase ended (their calls were
	// cancelled then; statements already running were left to finish).
	Withdrawn int `json:"withdrawn"`
	// Latency is from the call to its end, over the completed ones: time queued plus the run.
	Latency     quantiles `json:"latency_ms"`
	AcquireWait waitStats `json:"acquire_wait_ms"`
}

// learningResult is pgxlanes' LearningStat.
type learningResult struct {
	ThresholdMS float64 `json:"threshold_ms"`
	Demoted     int     `json:"demoted"`
	Demotions   int64   `json:"demotions"`
	Promotions  int64   `json:"promotions"`
	// LongMaxConns is Long's cap: the capacity a statement learned as slow is admitted to.
	LongMaxConns int `json:"long_max_conns"`
}

// judged returns the figures of phase ph that the tables, the ratios and the verdict judge: for
// the slow phase, the learning window included (SlowWhole) where there was one; nil if c or the
// phase is missing.
func (c *contenderResult) judged(ph phase) *phaseResult {
	if c == nil {
		return nil
	}
	if ph == phaseSlow && c.SlowWhole != nil {
		return c.SlowWhole
	}
	return *c.phase(ph)
}

// phase returns where the result of phase ph goes.
func (c *contenderResult) phase(ph phase) **phaseResult {
	return [...]**phaseResult{&c.Steady, &c.Transition, &c.Burst, &c.Learn, &c.Slow}[ph]
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
	SlowPgxpoolOverLanes   *float64 `json:"slow_p99_pgxpool_over_pgxlanes"`
	SlowTwoPoolOverLanes   *float64 `json:"slow_p99_two_pool_over_pgxlanes"`
	SlowNoLearnOverLanes   *float64 `json:"slow_p99_pgxlanes_nolearn_over_pgxlanes"`
	SlowLanesOverIdle      *float64 `json:"slow_p99_pgxlanes_over_idle"`
	// The priority phase's critical requests.
	CriticalPgxpoolOverLanes *float64 `json:"critical_p99_pgxpool_over_pgxlanes"`
	CriticalFifoOverLanes    *float64 `json:"critical_p99_pgxlanes_fifo_over_pgxlanes"`
	CriticalLanesOverIdle    *float64 `json:"critical_p99_pgxlanes_over_idle"`
}

// target is one check of the verdict (verdict.go). Its bound comes from the same run's figures.
type target struct {
	What string   `json:"what"`
	Want string   `json:"want"`
	Got  *float64 `json:"got"`
	Met  bool     `json:"met"`
	// Count says Got is a count, MS that it is milliseconds; otherwise it is a ratio.
	Count bool `json:"count,omitempty"`
	MS    bool `json:"ms,omitempty"`
	// NotRun: a contender the check needs was not run (-contenders); it counts neither way.
	NotRun bool `json:"not_run,omitempty"`
	// Inconclusive says why the check cannot judge the pool: the idle baseline itself failed
	// lookups in the phase (the machine could not serve the workload). It counts neither way.
	Inconclusive string `json:"inconclusive,omitempty"`
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

func p99(c *contenderResult, ph phase) *float64 {
	if pr := c.judged(ph); pr != nil {
		return pr.Latency.P99
	}
	return nil
}

// criticalP99 is c's critical p99 in the priority phase.
func criticalP99(c *contenderResult) *float64 {
	if c == nil || c.Priority == nil {
		return nil
	}
	return c.Priority.Critical.Latency.P99
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
	nolearn := r.contender("pgxlanes-nolearn")
	r.Ratios = ratios{
		SteadyPgxpoolOverLanes: div(p99(pool, phaseSteady), p99(lanes, phaseSteady)),
		SteadyTwoPoolOverLanes: div(p99(two, phaseSteady), p99(lanes, phaseSteady)),
		SteadyLanesOverIdle:    div(p99(lanes, phaseSteady), p99(idle, phaseSteady)),
		BurstPgxpoolOverLanes:  div(p99(pool, phaseBurst), p99(lanes, phaseBurst)),
		BurstTwoPoolOverLanes:  div(p99(two, phaseBurst), p99(lanes, phaseBurst)),
		BurstLanesOverIdle:     div(p99(lanes, phaseBurst), p99(idle, phaseBurst)),
		LongLanesOverTwoPool:   div(committed(lanes), committed(two)),
		LongLanesOverPgxpool:   div(committed(lanes), committed(pool)),
		SlowPgxpoolOverLanes:   div(p99(pool, phaseSlow), p99(lanes, phaseSlow)),
		SlowTwoPoolOverLanes:   div(p99(two, phaseSlow), p99(lanes, phaseSlow)),
		SlowNoLearnOverLanes:   div(p99(nolearn, phaseSlow), p99(lanes, phaseSlow)),
		SlowLanesOverIdle:      div(p99(lanes, phaseSlow), p99(idle, phaseSlow)),

		CriticalPgxpoolOverLanes: div(criticalP99(pool), criticalP99(lanes)),
		CriticalFifoOverLanes:    div(criticalP99(r.contender("pgxlanes-fifo")), criticalP99(lanes)),
		CriticalLanesOverIdle:    div(criticalP99(lanes), criticalP99(idle)),
	}
	r.Targets = r.verdict()
	r.Verdict = outcome(r.Targets)
}

func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
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
