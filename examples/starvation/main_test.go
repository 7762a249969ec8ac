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
func TestDemo(t *testing.T) {
	t.Parallel()
	dsn := pgserver.NewDatabase(t)
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.png")
	args := []string{"-dsn", dsn, "-json", jsonPath, "-plot", plotPath,
		"-conns", "4", "-fast-conns", "1", "-rows", "1000",
		"-long-workers", "8", "-burst-long-workers", "1", "-long-hold", "400ms",
		"-rate", "100", "-burst-rate", "300", "-burst-work", "5ms",
		"-ramp", "200ms", "-steady", "1s", "-burst", "1s"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	start := time.Now()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	t.Logf("demo ran in %v\n%s", time.Since(start).Round(time.Millisecond), stdout.String())

	for _, want := range []string{"steady phase", "burst phase", "ratios", "targets", "pgxpool p99 / pgxlanes p99"} {
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
	for _, name := range []string{"idle", "pgxpool", "two-pool", "pgxlanes"} {
		c := byName[name]
		if c == nil {
			t.Errorf("contender %s missing from the report", name)
			continue
		}
		for _, ph := range []struct {
			name string
			pr   *phaseResult
		}{{"steady", c.Steady}, {"burst", c.Burst}} {
			switch {
			case ph.pr == nil:
				t.Errorf("%s: no %s phase", name, ph.name)
			case ph.pr.Issued == 0 || ph.pr.OK == 0:
				t.Errorf("%s %s: issued %d, ok %d, want both > 0", name, ph.name, ph.pr.Issued, ph.pr.OK)
			case len(ph.pr.Samples.LatencyMS) != ph.pr.OK || len(ph.pr.Samples.AtMS) != ph.pr.OK:
				t.Errorf("%s %s: %d samples for %d ok lookups", name, ph.name, len(ph.pr.Samples.LatencyMS), ph.pr.OK)
			case ph.pr.AcquireWait.N == 0:
				t.Errorf("%s %s: no acquire waits recorded", name, ph.name)
			}
		}
		if c.Load && c.Long.Committed == 0 {
			t.Errorf("%s: no long transaction committed", name)
		}
		if c.Sessions.NewConns < 4 {
			t.Errorf("%s: %d connections opened, want at least 4", name, c.Sessions.NewConns)
		}
	}
	lanes, pool := byName["pgxlanes"], byName["pgxpool"]
	if lanes == nil || pool == nil || lanes.Steady == nil || pool.Steady == nil {
		t.FailNow()
	}
	lp, pp := orInf(lanes.Steady.Latency.P99), orInf(pool.Steady.Latency.P99)
	if !(lp < pp) {
		t.Errorf("steady short p99: pgxlanes %vms, pgxpool %vms; want pgxlanes below", lp, pp)
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
