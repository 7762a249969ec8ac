package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// TestVerdictCatchesLookupsOnTx runs the demo twice at a reduced size, with transactions that hold
// their row for 1 s: as built, and broken so that pgxlanes sends its lookups to the Tx lane, where
// they queue behind the transactions (lookupsOnTx). The verdict's steady checks must pass as built
// and fail broken, and the broken run must end in a failed verdict (exit status 1). The bounds are
// the idle pool's p50 + hold/10 (about 100 ms here) and p99 + hold/2 (about 500 ms); lookups
// behind transactions wait half a hold at the median and a whole one (1 s) at p99.
//
// Not parallel: lookupsOnTx is a package variable.
func TestVerdictCatchesLookupsOnTx(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	runOnce := func(broken bool) (*report, string, error) {
		lookupsOnTx = broken
		defer func() { lookupsOnTx = false }()
		jsonPath := filepath.Join(t.TempDir(), "out.json")
		args := []string{"-dsn", dsn, "-json", jsonPath, "-plot", "", "-quiet",
			"-phases", "main", "-contenders", "idle,pgxpool,pgxlanes",
			"-conns", "8", "-fast-conns", "2", "-rows", "1000",
			"-long-workers", "12", "-burst-long-workers", "3", "-long-hold", "1s",
			"-rate", "100", "-burst-rate", "200", "-burst-work", "2ms",
			"-ramp", "300ms", "-steady", "2s", "-transition", "300ms", "-burst", "1s",
			"-slow-clients", "6", "-slow-sleep", "500ms", "-slow-threshold", "150ms", "-learn", "1500ms", "-slow", "1s"}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var stdout, stderr bytes.Buffer
		err := run(ctx, args, &stdout, &stderr)
		if err != nil && !errors.As(err, new(verdictError)) {
			t.Fatalf("run (broken %v): %v\nstderr:\n%s", broken, err, stderr.String())
		}
		b, rerr := os.ReadFile(jsonPath)
		if rerr != nil {
			t.Fatal(rerr)
		}
		var rep report
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		return &rep, stdout.String(), err
	}
	steady := func(rep *report, q string) target {
		for _, tg := range rep.Targets {
			if tg.What == "steady: pgxlanes "+q {
				return tg
			}
		}
		t.Fatalf("no steady %s check in %+v", q, rep.Targets)
		return target{}
	}

	good, out, err := runOnce(false)
	t.Logf("as built: verdict %s (err %v)\n%s", good.Verdict, err, verdictBlock(out))
	for _, q := range []string{"p50", "p99"} {
		if tg := steady(good, q); !tg.Met || tg.NotRun || tg.Inconclusive != "" {
			t.Errorf("as built, the steady %s check did not pass: %+v", q, tg)
		}
	}

	bad, out, err := runOnce(true)
	t.Logf("broken (lookups on Tx): verdict %s (err %v)\n%s", bad.Verdict, err, verdictBlock(out))
	for _, q := range []string{"p50", "p99"} {
		if tg := steady(bad, q); tg.Met || tg.NotRun || tg.Inconclusive != "" {
			t.Errorf("broken, the steady %s check did not fail: %+v", q, tg)
		}
	}
	if bad.Verdict != "fail" || !errors.As(err, new(verdictError)) {
		t.Errorf("broken: verdict %q, run error %v; want fail and a verdictError", bad.Verdict, err)
	}
	if !strings.Contains(out, "verdict: FAIL: ") || !strings.Contains(out, "steady: pgxlanes p50") {
		t.Errorf("broken: the output does not say the verdict failed on the steady checks:\n%s", verdictBlock(out))
	}
}

// verdictBlock is the output from the verdict on.
func verdictBlock(out string) string {
	if i := strings.Index(out, "\nverdict"); i >= 0 {
		return out[i+1:]
	}
	return out
}

// TestVerdictRules checks the verdict's rules on made-up figures, without a server: the bounds
// come from the run's own hold and idle figures; a failure while the machine probe shows a stall,
// or in a phase where the idle pool failed lookups, is inconclusive; a failure without either is
// a failure.
func TestVerdictRules(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	phaseWith := func(p50, p99 float64, probe float64, failed int) *phaseResult {
		pr := &phaseResult{Latency: quantiles{P50: f(p50), P99: f(p99)}, Probe: waitStats{N: 100, P99MS: probe}}
		pr.Failed.AcquireTimeout = failed
		pr.SlowDone = 2
		return pr
	}
	build := func(lanesSteadyP50, lanesSteadyP99, lanesProbe float64, idleFailed int) *report {
		r := &report{Flags: map[string]string{"slow-sleep": "1.5s"}}
		r.Contenders = []*contenderResult{
			{Name: "idle", Steady: phaseWith(1, 10, 5, idleFailed), Burst: phaseWith(6, 7, 5, 0), Slow: phaseWith(1, 10, 5, 0)},
			{Name: "pgxpool", Steady: phaseWith(1200, 2050, 5, 0), Burst: phaseWith(6, 7, 5, 0), Slow: phaseWith(900, 1500, 5, 0),
				Long: longResult{Committed: 29, HoldP50MS: 2000}},
			{Name: "two-pool", Steady: phaseWith(1, 10, 5, 0), Burst: phaseWith(700, 1400, 5, 0), Slow: phaseWith(2000, 3900, 5, 0),
				Long: longResult{Committed: 25}},
			{Name: "pgxlanes", Steady: phaseWith(lanesSteadyP50, lanesSteadyP99, lanesProbe, 0), Burst: phaseWith(6, 7, 5, 0),
				Slow: phaseWith(1, 10, 5, 0), Long: longResult{Committed: 25}},
		}
		r.compute()
		return r
	}
	check := func(r *report, what string) target {
		for _, tg := range r.Targets {
			if tg.What == what {
				return tg
			}
		}
		t.Fatalf("no check %q", what)
		return target{}
	}
	for _, tc := range []struct {
		name           string
		p50, p99       float64
		probe          float64
		idleFailed     int
		verdict        string
		p50Met, p99Met bool
	}{
		{"near idle", 2, 50, 5, 0, "pass", true, true},
		{"within the bounds (idle + 200 ms, idle + 1 s)", 200, 1000, 5, 0, "pass", true, true},
		{"queued behind transactions", 1000, 2000, 5, 0, "fail", false, false},
		{"a tail stall only", 2, 1100, 5, 0, "fail", true, false},
		{"queued while the machine stalled", 1000, 2000, 250, 0, "inconclusive", false, false},
		{"the idle pool failed lookups", 1000, 2000, 5, 3, "inconclusive", false, false},
	} {
		r := build(tc.p50, tc.p99, tc.probe, tc.idleFailed)
		if r.Verdict != tc.verdict {
			t.Errorf("%s: verdict %q, want %q: %+v", tc.name, r.Verdict, tc.verdict, r.Targets)
		}
		if got := check(r, "steady: pgxlanes p50"); got.Met != tc.p50Met {
			t.Errorf("%s: p50 check %+v, want met %v", tc.name, got, tc.p50Met)
		}
		if got := check(r, "steady: pgxlanes p99"); got.Met != tc.p99Met {
			t.Errorf("%s: p99 check %+v, want met %v", tc.name, got, tc.p99Met)
		}
		if got := check(r, "steady: pgxlanes p99"); got.Want != "≤ idle p99 + hold/2 = 1.01s" {
			t.Errorf("%s: the p99 bound reads %q, want it from the run's hold (2 s) and idle p99 (10 ms)", tc.name, got.Want)
		}
	}
}

// TestVerdictJudgesLearningWindow: the slow phase is judged from its first slow statement, the
// learning window included (issue 23). Lookups that failed in the window alone fail the verdict,
// and a p99 that is a failed lookup there fails the p99 check, though the rest of the phase is
// clean.
func TestVerdictJudgesLearningWindow(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	clean := func() *phaseResult {
		return &phaseResult{Issued: 900, OK: 900, Latency: quantiles{P50: f(1), P99: f(10)}, Probe: waitStats{N: 100, P99MS: 5}, SlowDone: 2}
	}
	for _, tc := range []struct {
		name         string
		windowFailed int
		verdict      string
	}{
		{"a clean window", 0, "pass"},
		{"lookups failed in the window", 300, "fail"},
	} {
		window := clean()
		window.Failed.AcquireTimeout = tc.windowFailed
		whole := &phaseResult{Issued: 1500, OK: 1500 - tc.windowFailed, Latency: quantiles{P50: f(1), P99: f(10)},
			Probe: waitStats{N: 100, P99MS: 5}, SlowDone: 3}
		whole.Failed.AcquireTimeout = tc.windowFailed
		if tc.windowFailed > 0 {
			whole.Latency.P99 = nil // 20 % failed: the p99 falls on a failed lookup
		}
		r := &report{Flags: map[string]string{"slow-sleep": "1.5s"}}
		r.Contenders = []*contenderResult{
			{Name: "idle", Steady: clean(), Burst: clean(), Slow: clean()},
			{Name: "pgxpool", Steady: &phaseResult{Latency: quantiles{P50: f(1000), P99: f(2000)}}, Burst: clean(), Slow: clean(),
				Long: longResult{Committed: 29, HoldP50MS: 2000}},
			{Name: "two-pool", Steady: clean(), Burst: &phaseResult{Latency: quantiles{P50: f(700), P99: f(1400)}}, Slow: clean(),
				Long: longResult{Committed: 25}},
			{Name: "pgxlanes", Steady: clean(), Burst: clean(), Learn: window, Slow: clean(), SlowWhole: whole,
				Long: longResult{Committed: 25}},
		}
		r.compute()
		if r.Verdict != tc.verdict {
			t.Errorf("%s: verdict %q, want %q: %+v", tc.name, r.Verdict, tc.verdict, r.Targets)
		}
		for _, tg := range r.Targets {
			if tg.What == "slow: pgxlanes lookups failed" && (tg.Got == nil || *tg.Got != float64(tc.windowFailed)) {
				t.Errorf("%s: the failed-lookups check counts %v, want the window's %d", tc.name, tg.Got, tc.windowFailed)
			}
		}
	}
}
