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

// TestVerdictCatchesNoPriorities runs the priority phase alone twice, at the demo's size (36
// background calls that hold their connection 50 ms ± 50 %) for 2 s: as built, and broken so
// that no call carries its priority (dropPriority), where pgxlanes serves its critical requests
// behind the background queued before them, as pgxlanes-fifo does. The critical check must pass as built and fail broken, and
// the broken run must end in a failed verdict (exit status 1); the background checks must pass in
// both (a FIFO queue starves nobody).
//
// Not parallel: dropPriority is a package variable.
func TestVerdictCatchesNoPriorities(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	runOnce := func(broken bool) (*report, string, error) {
		dropPriority = broken
		defer func() { dropPriority = false }()
		jsonPath := filepath.Join(t.TempDir(), "out.json")
		args := []string{"-dsn", dsn, "-json", jsonPath, "-plot", "", "-quiet",
			"-phases", "priority", "-contenders", "idle,pgxlanes-fifo,pgxlanes",
			"-conns", "8", "-rows", "1000",
			"-priority", "2s", "-priority-rate", "50", "-priority-hold", "50ms",
			"-priority-short-clients", "24", "-priority-tx-clients", "12"}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
	check := func(rep *report, what string) target {
		for _, tg := range rep.Targets {
			if tg.What == what {
				return tg
			}
		}
		t.Fatalf("no check %q in %+v", what, rep.Targets)
		return target{}
	}
	const critical = "priority: pgxlanes critical p99"
	background := []string{"priority: background worst wait, short", "priority: background worst wait, tx"}

	good, out, err := runOnce(false)
	t.Logf("as built: verdict %s (err %v)\n%s", good.Verdict, err, priorityBlock(out))
	for _, what := range append([]string{critical}, background...) {
		if tg := check(good, what); !tg.Met || tg.NotRun || tg.Inconclusive != "" {
			t.Errorf("as built, %q did not pass: %+v", what, tg)
		}
	}
	if len(good.Targets) != 3 {
		t.Errorf("with -phases priority, want the 3 priority checks alone, got %+v", good.Targets)
	}

	bad, out, err := runOnce(true)
	t.Logf("broken (no priorities): verdict %s (err %v)\n%s", bad.Verdict, err, priorityBlock(out))
	if tg := check(bad, critical); tg.Met || tg.NotRun || tg.Inconclusive != "" {
		t.Errorf("broken, the critical check did not fail: %+v", tg)
	}
	for _, what := range background {
		if tg := check(bad, what); !tg.Met {
			t.Errorf("broken, %q failed (a FIFO queue starves nobody): %+v", what, tg)
		}
	}
	if bad.Verdict != "fail" || !errors.As(err, new(verdictError)) {
		t.Errorf("broken: verdict %q, run error %v; want fail and a verdictError", bad.Verdict, err)
	}
	if !strings.Contains(out, "verdict: FAIL: "+critical) {
		t.Errorf("broken: the output does not say the verdict failed on the critical check:\n%s", priorityBlock(out))
	}
}

// priorityBlock is the output from the priority table on.
func priorityBlock(out string) string {
	if i := strings.Index(out, "\npriority phase"); i >= 0 {
		return out[i+1:]
	}
	return out
}

// TestPriorityVerdictRules checks the priority checks' rules on made-up figures, without a
// server: the critical p99 passes against half pgxlanes-fifo's or the idle pool's plus half a
// hold; a background wait over priority_age + a hold, or a refused background call, fails; a
// failure while the machine probe stalled, or with the idle pool failing critical requests, is
// inconclusive.
func TestPriorityVerdictRules(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	age := func(v float64) *float64 { return &v }
	type figures struct {
		lanesP99, fifoP99 *float64
		idleFailed        int
		shortWorst        float64
		shortRefused      int
		probe             float64
	}
	build := func(fg figures) *report {
		prio := func(p99 *float64, bg bool) *priorityResult {
			p := &priorityResult{HoldMS: 50, Probe: waitStats{N: 100, P99MS: fg.probe}}
			p.Critical.Latency.P99 = p99
			if bg {
				p.BgShort = &bgResult{Done: 100, WorstWaitMS: fg.shortWorst, AgeMS: age(500)}
				p.BgShort.Failed.LaneFull = fg.shortRefused
				p.BgTx = &bgResult{Done: 50, WorstWaitMS: 300, AgeMS: age(5000)}
			}
			return p
		}
		idle := prio(f(4), false)
		idle.Critical.Failed.AcquireTimeout = fg.idleFailed
		r := &report{Contenders: []*contenderResult{
			{Name: "idle", Priority: idle},
			{Name: "pgxlanes-fifo", Priority: prio(fg.fifoP99, true)},
			{Name: "pgxlanes", Priority: prio(fg.lanesP99, true)},
		}}
		r.compute()
		return r
	}
	check := func(r *report, what string) target {
		for _, tg := range r.Targets {
			if tg.What == what {
				return tg
			}
		}
		t.Fatalf("no check %q in %+v", what, r.Targets)
		return target{}
	}
	const crit, short = "priority: pgxlanes critical p99", "priority: background worst wait, short"
	for _, tc := range []struct {
		name             string
		fg               figures
		verdict          string
		critMet, bgMet   bool
		critInconclusive bool
	}{
		{"served first", figures{lanesP99: f(40), fifoP99: f(230), shortWorst: 250, probe: 5}, "pass", true, true, false},
		{"within idle + hold/2 only", figures{lanesP99: f(25), fifoP99: f(40), shortWorst: 250, probe: 5}, "pass", true, true, false},
		{"within fifo/2 only", figures{lanesP99: f(110), fifoP99: f(230), shortWorst: 250, probe: 5}, "pass", true, true, false},
		{"fifo failed its p99", figures{lanesP99: f(110), fifoP99: nil, shortWorst: 250, probe: 5}, "pass", true, true, false},
		{"queued in arrival order", figures{lanesP99: f(220), fifoP99: f(230), shortWorst: 250, probe: 5}, "fail", false, true, false},
		{"pgxlanes failed its p99", figures{lanesP99: nil, fifoP99: f(230), shortWorst: 250, probe: 5}, "fail", false, true, false},
		{"background starved", figures{lanesP99: f(40), fifoP99: f(230), shortWorst: 900, probe: 5}, "fail", true, false, false},
		{"background refused", figures{lanesP99: f(40), fifoP99: f(230), shortWorst: 250, shortRefused: 1, probe: 5}, "fail", true, false, false},
		{"machine stalled", figures{lanesP99: f(220), fifoP99: f(230), shortWorst: 250, probe: 80}, "inconclusive", false, true, true},
		{"idle failed", figures{lanesP99: f(220), fifoP99: f(230), shortWorst: 250, probe: 5, idleFailed: 2}, "inconclusive", false, true, true},
	} {
		r := build(tc.fg)
		if r.Verdict != tc.verdict {
			t.Errorf("%s: verdict %q, want %q: %+v", tc.name, r.Verdict, tc.verdict, r.Targets)
		}
		if got := check(r, crit); got.Met != tc.critMet || (got.Inconclusive != "") != tc.critInconclusive {
			t.Errorf("%s: critical check %+v, want met %v, inconclusive %v", tc.name, got, tc.critMet, tc.critInconclusive)
		}
		if got := check(r, short); got.Met != tc.bgMet {
			t.Errorf("%s: background check %+v, want met %v", tc.name, got, tc.bgMet)
		}
		if len(r.Targets) != 3 {
			t.Errorf("%s: %d checks, want the 3 priority checks alone (no main phase ran)", tc.name, len(r.Targets))
		}
	}
}
