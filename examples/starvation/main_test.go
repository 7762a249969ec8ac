package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

// TestDemo runs the whole demo briefly, at a small size, and checks its JSON report.
//
// The slow phase is scaled down too: 6 clients of a 0.5 s statement on 4 connections, learned
// at a threshold of 150 ms. pgxlanes demotes it at about 150 ms (the third overrun) and its Short
// lane is clear of the statements it admitted before by about 1 s (the last of them waited 0.5 s
// for a connection, then ran 0.5 s), well within the 1.5 s learning period. With learning off,
// the lookups queue in Short behind the slow statements for about their length: they are slow but,
// at this size, mostly within Short's 1 s acquire timeout, so the test compares latencies instead
// of counting failures.
func TestDemo(t *testing.T) {
	t.Parallel()
	dsn := pgserver.NewDatabase(t)
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.png")
	args := []string{"-dsn", dsn, "-json", jsonPath, "-plot", plotPath,
		"-conns", "4", "-fast-conns", "1", "-rows", "1000",
		"-long-workers", "8", "-burst-long-workers", "1", "-long-hold", "400ms",
		"-rate", "100", "-burst-rate", "300", "-burst-work", "5ms",
		"-ramp", "200ms", "-steady", "1s", "-burst", "1s",
		"-slow-clients", "6", "-slow-sleep", "500ms", "-slow-threshold", "150ms", "-learn", "1500ms", "-slow", "1500ms",
		"-priority", "1s", "-priority-hold", "20ms", "-priority-short-clients", "8", "-priority-tx-clients", "4"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	start := time.Now()
	// At this size (holds of 400 ms) the verdict's bounds are tens of milliseconds, which -race on
	// a loaded machine may exceed: its outcome is logged, not judged here. The verdict is judged at
	// a size it is stated for by TestVerdictCatchesLookupsOnTx, and at full size in docs/demo.md.
	if err := run(ctx, args, &stdout, &stderr); err != nil && !errors.As(err, new(verdictError)) {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	t.Logf("demo ran in %v\n%s", time.Since(start).Round(time.Millisecond), stdout.String())

	for _, want := range []string{"steady phase", "burst phase", "slow phase", "learning period", "ratios", "verdict",
		"pgxpool p99 / pgxlanes p99", "pgxlanes-nolearn p99 / pgxlanes p99", `"select pg_sleep(0.5)"`,
		"priority phase", "critical pgxlanes-fifo p99 / pgxlanes p99", "priority: background worst wait, short"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if !strings.Contains(stderr.String(), "lookups:") {
		t.Errorf("stderr has no progress line:\n%s", stderr.String())
	}

	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("the JSON report does not parse: %v", err)
	}
	if rep.Machine.CPUs < 1 || rep.Machine.Postgres == "" {
		t.Errorf("machine = %+v, want CPUs and the PostgreSQL version", rep.Machine)
	}
	if strings.Contains(string(b), dsn) {
		t.Error("the JSON report contains the DSN")
	}
	if len(rep.Targets) == 0 {
		t.Error("no targets in the report")
	}
	byName := map[string]*contenderResult{}
	for _, c := range rep.Contenders {
		byName[c.Name] = c
	}
	for _, name := range contenderNames {
		c := byName[name]
		if c == nil {
			t.Errorf("contender %s missing from the report", name)
			continue
		}
		// The priority phase: its critical requests, and its background for all but idle.
		if p := c.Priority; name == "two-pool" || name == "pgxlanes-nolearn" {
			if p != nil {
				t.Errorf("%s ran the priority phase", name)
			}
		} else if p == nil || p.Critical.OK == 0 || p.Critical.AcquireWait.N == 0 || p.Probe.N == 0 {
			t.Errorf("%s: priority phase %+v, want critical requests served, their acquire waits, the probe", name, p)
		} else if (p.BgShort == nil) != (name == "idle") || (p.BgShort != nil && (p.BgShort.Done == 0 || p.BgTx.Done == 0)) {
			t.Errorf("%s: priority phase background short %+v tx %+v", name, p.BgShort, p.BgTx)
		}
		if name == "pgxlanes-fifo" {
			if c.Steady != nil || c.Slow != nil {
				t.Errorf("pgxlanes-fifo ran the main phases")
			}
			continue
		}
		// The slow phase as judged includes its learning window, for every contender that has one.
		if name != "idle" && (c.SlowWhole == nil || c.Learn == nil || c.Slow == nil ||
			c.SlowWhole.Issued != c.Learn.Issued+c.Slow.Issued || c.SlowWhole.FromS != c.Learn.FromS) {
			t.Errorf("%s: the slow phase as judged %+v does not span the learning window and the rest", name, c.SlowWhole)
		}
		type phaseCheck struct {
			name string
			pr   *phaseResult
		}
		// Every contender has the slow phase; those under load have its learning period too, the
		// idle baseline has none (nothing to learn) and pgxlanes-nolearn runs only these two.
		phases := []phaseCheck{{"slow", c.Slow}}
		if name != "pgxlanes-nolearn" {
			phases = append(phases, phaseCheck{"steady", c.Steady}, phaseCheck{"burst", c.Burst})
		}
		if name != "idle" {
			phases = append(phases, phaseCheck{"learn", c.Learn})
		}
		for _, ph := range phases {
			switch {
			case ph.pr == nil:
				t.Errorf("%s: no %s phase", name, ph.name)
			case ph.pr.Issued == 0 || ph.pr.OK == 0:
				t.Errorf("%s %s: issued %d, ok %d, want both > 0", name, ph.name, ph.pr.Issued, ph.pr.OK)
			case len(ph.pr.Samples.LatencyMS) != ph.pr.OK || len(ph.pr.Samples.AtMS) != ph.pr.OK:
				t.Errorf("%s %s: %d samples for %d ok lookups", name, ph.name, len(ph.pr.Samples.LatencyMS), ph.pr.OK)
			case ph.pr.AcquireWait.N == 0:
				t.Errorf("%s %s: no acquire waits recorded", name, ph.name)
			case ph.pr.Probe.N == 0:
				t.Errorf("%s %s: no machine probe recorded", name, ph.name)
			}
		}
		if name == "pgxlanes-nolearn" && (c.Steady != nil || c.Burst != nil) {
			t.Errorf("pgxlanes-nolearn ran the steady or burst phase")
		}
		if name == "idle" && (c.Learn != nil || c.SlowStmts != nil) {
			t.Errorf("idle ran slow statements")
		}
		if name != "idle" && (c.SlowStmts == nil || c.SlowStmts.Completed == 0 || c.SlowStmts.AcquireWait.N == 0) {
			t.Errorf("%s: slow statements %+v, want some completed, with their acquire waits", name, c.SlowStmts)
		}
		if c.Load && c.Long.Committed == 0 {
			t.Errorf("%s: no long transaction committed", name)
		}
		if c.Sessions.NewConns < 4 {
			t.Errorf("%s: %d connections opened, want at least 4", name, c.Sessions.NewConns)
		}
	}
	lanes, pool, nolearn := byName["pgxlanes"], byName["pgxpool"], byName["pgxlanes-nolearn"]
	if lanes == nil || pool == nil || nolearn == nil || lanes.Steady == nil || pool.Steady == nil ||
		lanes.Slow == nil || nolearn.Slow == nil || pool.Slow == nil {
		t.FailNow()
	}
	lp, pp := orInf(lanes.Steady.Latency.P99), orInf(pool.Steady.Latency.P99)
	if !(lp < pp) {
		t.Errorf("steady short p99: pgxlanes %vms, pgxpool %vms; want pgxlanes below", lp, pp)
	}

	// The slow phase. Learning on: the statement was learned, no lookup failed after the learning
	// period, and the slow statements still completed in it, none refused. Learning off: nothing
	// learned, and the lookups waited behind the slow statements (or failed): their p99 is far
	// above pgxlanes'. These hold on a loaded 2-core machine: the margins are hundreds of ms.
	switch l := lanes.Learning; {
	case l == nil || l.Demotions < 1:
		t.Errorf("pgxlanes learned nothing: %+v", l)
	case lanes.Slow.Failed.total() != 0:
		t.Errorf("pgxlanes slow phase after the learning window: %d lookups failed (%+v), want none", lanes.Slow.Failed.total(), lanes.Slow.Failed)
	case lanes.Slow.SlowDone == 0 || lanes.Slow.SlowFailed != 0:
		t.Errorf("pgxlanes slow phase: %d slow statements done, %d failed; want some done, none refused",
			lanes.Slow.SlowDone, lanes.Slow.SlowFailed)
	}
	if l := nolearn.Learning; l == nil || l.ThresholdMS != 0 || l.Demotions != 0 {
		t.Errorf("pgxlanes-nolearn learning = %+v, want off", l)
	}
	lp, np, pp := orInf(lanes.Slow.Latency.P99), orInf(nolearn.Slow.Latency.P99), orInf(pool.Slow.Latency.P99)
	if !(np >= 100 && lp < np/5) {
		t.Errorf("slow phase p99: pgxlanes %vms, pgxlanes-nolearn %vms; want learning off ≥ 100ms and 5× learning on", lp, np)
	}
	if !(pp >= 100 && lp < pp/5) {
		t.Errorf("slow phase p99: pgxlanes %vms, pgxpool %vms; want pgxpool ≥ 100ms and 5× pgxlanes", lp, pp)
	}
	if len(rep.Targets) < 7 {
		t.Errorf("%d targets, want the slow phase's too", len(rep.Targets))
	}

	png, err := os.ReadFile(plotPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("%s is not a PNG", plotPath)
	}
}

func orInf(v *float64) float64 {
	if v == nil {
		return math.Inf(1)
	}
	return *v
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" for no error
	}{
		{nil, ""},
		{[]string{"-conns", "1"}, "-conns"},
		{[]string{"-fast-conns", "8"}, "-fast-conns"},
		{[]string{"-burst-long-workers", "17"}, "-burst-long-workers"},
		{[]string{"-rows", "5"}, "-rows"},
		{[]string{"-long-jitter", "1"}, "-long-jitter"},
		{[]string{"-plot", "x.jpg"}, "-plot"},
		{[]string{"-slow-clients", "0"}, "-slow-clients"},
		{[]string{"-slow-sleep", "0s"}, "-slow-sleep"},
		{[]string{"-learn", "-1s"}, "-learn"},
		{[]string{"-phases", "main,nosuch"}, "-phases"},
		{[]string{"-phases", ""}, "-phases"},
		{[]string{"-priority", "0s"}, "-priority"},
		{[]string{"-priority-tx-clients", "0"}, "-priority-tx-clients"},
		{[]string{"-contenders", "pgxlanes,nosuch"}, "nosuch"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-nosuchflag"}, "nosuchflag"},
	} {
		cfg, _, err := parseFlags(tc.args, io.Discard)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.args, err)
			} else if cfg.transition != time.Duration(float64(cfg.longHold)*(1+cfg.longJitter)) {
				t.Errorf("%q: transition %v, want long-hold × (1 + jitter)", tc.args, cfg.transition)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, new(usageError)) {
			t.Errorf("%q: error %v, want a usage error naming %s", tc.args, err, tc.want)
		}
	}
}

func TestRedactArgs(t *testing.T) {
	got := redactArgs([]string{"-dsn", "postgres://u:secret@h/db", "--dsn=postgres://u:secret@h/db", "-conns", "4", "-json"})
	want := []string{"-dsn", "REDACTED", "--dsn=REDACTED", "-conns", "4", "-json"}
	if !slices.Equal(got, want) {
		t.Errorf("redactArgs = %q, want %q", got, want)
	}
}

// TestAbsPath: the demo prints the files it writes by their full path, so that `make demo`, which
// runs it from examples/, points the reader at the right directory.
func TestAbsPath(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := absPath("demo-report.png"), filepath.Join(wd, "demo-report.png"); got != want {
		t.Errorf("absPath(demo-report.png) = %q, want %q", got, want)
	}
	if got := absPath("/tmp/x.png"); got != "/tmp/x.png" {
		t.Errorf("absPath(/tmp/x.png) = %q", got)
	}
}
