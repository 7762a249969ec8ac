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

// TestVerdictCatchesNoPriorities runs the priority phase alone twice, with background calls that
// hold their connection 100 ms: as built, and broken so that no call carries its priority
// (dropPriority), where pgxlanes serves its critical requests behind the background queued
// before them, as pgxlanes-fifo does. The critical check must pass as built and fail broken, and
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
			"-priority", "2s", "-priority-rate", "50", "-priority-hold", "100ms",
			"-priority-short-clients", "16", "-priority-tx-clients", "8"}
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
