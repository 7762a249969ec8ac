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
			"-contenders", "idle,pgxpool,pgxlanes",
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
