package conformance

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/internal/race"
	_ "github.com/pgxlanes/pgxlanes/pgxlanestest/containers"
)

func TestMain(m *testing.M) { pgserver.Main(m) }

// The knobs of the stage, from the environment.
const (
	// envControl=0 skips the control run of pgx's untouched tests against plain pgxpool.
	envControl = "PGXLANES_CONFORMANCE_CONTROL"
	// envParallel is how many test processes run at once (default 4: the tests mostly wait).
	envParallel = "PGXLANES_CONFORMANCE_PARALLEL"
)

const (
	thisPackage = "github.com/pgxlanes/pgxlanes/integration/conformance"
	// testTimeout bounds each test process. pgxpool's slowest tests take about 6s under the race
	// detector with 4 processes on 2 cores; a test that hangs costs this much wall time.
	testTimeout = 30 * time.Second
	// memLimit is the resident memory at which a test process is killed: pgx's tests peak at
	// about 250 MiB under the race detector.
	memLimit = 2 << 30
	// cpus is the number of CPUs a test process may use. pgxpool's default MaxConns is the
	// greater of 4 and runtime.NumCPU(), and the lanes are sized from it: pinning every process to
	// 4 CPUs gives every machine the pool of a machine with 4 or fewer, and the same failures.
	cpus = 4
)

// TestPgxpoolConformance runs pgx's own pgxpool tests against pgxlanes and, as a control,
// against plain pgxpool. See the package documentation.
func TestPgxpoolConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles and runs pgx's pgxpool tests twice: not in -short")
	}
	if !canPin && runtime.NumCPU() > cpus {
		t.Skipf("this machine has %d CPUs, and only Linux can pin the test processes to %d: pgxpool's default MaxConns, and so the allowlist, depend on it", runtime.NumCPU(), cpus)
	}
	start := time.Now()
	ctx := t.Context()
	control := os.Getenv(envControl) != "0"
	parallel := 4
	if s := os.Getenv(envParallel); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "%s", envParallel)
		require.Positive(t, n, "%s", envParallel)
		parallel = n
	}

	pgxDir, pgxVersion := pgxModuleDir(t)
	allow := readAllowlist(t)
	removeStale(t, ".")

	gen, err := os.MkdirTemp(".", "_gen-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(gen) })
	require.NoError(t, generate(pgxDir, gen, thisPackage+"/"+filepath.Base(gen)))

	// One go test -c for both packages, so that the go command shares the work.
	bins := t.TempDir()
	args := []string{"test", "-c", "-o", bins + string(filepath.Separator)}
	if race.Enabled {
		args = append(args, "-race")
	}
	args = append(args, "./"+filepath.Base(gen))
	if control {
		args = append(args, pgxpoolPath)
	}
	goCmd(t, args...)
	lanesBin := filepath.Join(bins, filepath.Base(gen)+".test")
	controlBin := filepath.Join(bins, "pgxpool.test")
	built := time.Now()

	runDir := t.TempDir()
	names, err := listTests(ctx, lanesBin, runDir)
	require.NoError(t, err)
	require.NotEmpty(t, names)
	if control {
		controlNames, err := listTests(ctx, controlBin, runDir)
		require.NoError(t, err)
		require.Equal(t, controlNames, names, "the rewrite must keep every test")
	}

	// pgx's tests read PGX_TEST_DATABASE only; the few that call ParseConfig("") never reach a
	// server (their BeforeConnect or DialFunc stand in for it). Each suite gets a database of its
	// own because TestPoolCopyFrom creates a table by a fixed name.
	lanesEnv := testEnv(pgserver.NewDatabase(t))
	var controlEnv []string
	if control {
		controlEnv = testEnv(pgserver.NewDatabase(t))
	}
	// Allowlisted tests go first: they include the slow ones (a hang until testTimeout), which
	// then overlap with the rest.
	slices.SortStableFunc(names, func(a, b string) int {
		_, la := allow[a]
		_, lb := allow[b]
		switch {
		case la && !lb:
			return -1
		case lb && !la:
			return 1
		}
		return 0
	})
	var jobs []job
	for _, n := range names {
		jobs = append(jobs, job{Bin: lanesBin, Test: n, Dir: runDir, Env: lanesEnv, Timeout: testTimeout, MemLimit: memLimit, CPUs: cpus})
		if control {
			jobs = append(jobs, job{Bin: controlBin, Test: n, Dir: runDir, Env: controlEnv, Timeout: testTimeout, MemLimit: memLimit, CPUs: cpus})
		}
	}
	// An allowlisted failure is expected, and a crash, a kill or a timeout is no accident of
	// timing: only ordinary test failures (exit status 1) get a second run.
	retry := func(j job, r result) bool {
		_, listed := allow[j.Test]
		return !(j.Bin == lanesBin && listed) && r.Cause == "exit status 1"
	}
	all := runAll(ctx, jobs, parallel, retry)
	var lanes, ctrl []attempts
	for i, a := range all {
		if jobs[i].Bin == lanesBin {
			lanes = append(lanes, a)
		} else {
			ctrl = append(ctrl, a)
		}
	}
	v := judge(names, lanes, ctrl, allow)

	raceNote := ""
	if race.Enabled {
		raceNote = ", race detector on"
	}
	t.Logf("pgx %s pgxpool tests, one process each (%d at a time%s); build %v, runs %v",
		pgxVersion, parallel, raceNote, built.Sub(start).Round(100*time.Millisecond), time.Since(built).Round(100*time.Millisecond))
	t.Logf("pgxlanes: %d passed, %d failed (%d allowlisted), %d skipped", v.Passed, v.Failed, len(v.Allowed), v.Skipped)
	if control {
		cp, cf, cs := count(ctrl)
		t.Logf("pgxpool (control): %d passed, %d failed, %d skipped", cp, cf, cs)
	} else {
		t.Logf("pgxpool (control): not run (%s=0)", envControl)
	}
	t.Logf("slowest: %s; largest resident set %d MiB", slowest(all, jobs, lanesBin, 6), largestRSS(all)>>20)
	slices.Sort(v.Allowed)
	for _, a := range v.Allowed {
		t.Logf("allowlisted failure: %s", a)
	}
	for _, f := range v.Flaky {
		t.Logf("flaky, passed on retry: %s", f)
	}
	for _, c := range v.ControlOnly {
		t.Logf("failed on the control only: %s", c)
	}
	for _, p := range v.Problems {
		t.Error(p)
	}
	for i, a := range all {
		r := a.last()
		if r.Outcome != failed || (jobs[i].Bin == lanesBin && allow[r.Test] != "") {
			continue
		}
		suite := "pgxlanes"
		if jobs[i].Bin != lanesBin {
			suite = "pgxpool"
		}
		t.Logf("%s %s (%s, %v):\n%s", suite, r.Test, r.Cause, r.Elapsed.Round(time.Millisecond), indent(failureText(r.Output)))
	}
}

// count tallies the last attempts of a suite.
func count(s []attempts) (passed_, failed_, skipped_ int) {
	for _, a := range s {
		switch a.last().Outcome {
		case passed:
			passed_++
		case failed:
			failed_++
		case skipped:
			skipped_++
		}
	}
	return
}

// slowest names the n longest test processes, with their suite and time.
func slowest(all []attempts, jobs []job, lanesBin string, n int) string {
	idx := make([]int, len(all))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(all[b].last().Elapsed, all[a].last().Elapsed) })
	var s []string
	for _, i := range idx[:min(n, len(idx))] {
		suite := "pgxpool"
		if jobs[i].Bin == lanesBin {
			suite = "pgxlanes"
		}
		s = append(s, fmt.Sprintf("%s %s %v", suite, jobs[i].Test, all[i].last().Elapsed.Round(10*time.Millisecond)))
	}
	return strings.Join(s, ", ")
}

func largestRSS(all []attempts) int64 {
	var m int64
	for _, a := range all {
		for _, r := range a {
			m = max(m, r.PeakRSS)
		}
	}
	return m
}

// failureText is a failure's excerpt, or the end of its output if nothing in it looks like an
// error.
func failureText(out []byte) string {
	if ex := excerpt(out, 16); len(ex) > 0 {
		return strings.Join(ex, "\n")
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }

// testEnv is the environment of a test process: ours, without other PGX_TEST_ settings, with
// PGX_TEST_DATABASE set to dsn. Under the race detector a process that exits sleeps a second
// for late reports (atexit_sleep_ms=1000), a second per test: GORACE turns that off unless it
// sets it.
func testEnv(dsn string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PGX_TEST_") || strings.HasPrefix(kv, "GORACE=")
	})
	gorace := os.Getenv("GORACE")
	if !strings.Contains(gorace, "atexit_sleep_ms") {
		gorace = strings.TrimSpace(gorace + " atexit_sleep_ms=0")
	}
	return append(env, "GORACE="+gorace, "PGX_TEST_DATABASE="+dsn)
}

// pgxModuleDir returns the directory and version of the pgx module the integration module
// requires, downloading it if the module cache lacks it.
func pgxModuleDir(t *testing.T) (dir, version string) {
	t.Helper()
	out := goCmd(t, "list", "-m", "-f", "{{.Dir}} {{.Version}}", pgxModule)
	dir, version, _ = strings.Cut(strings.TrimSpace(out), " ")
	if dir == "" {
		goCmd(t, "mod", "download", pgxModule)
		out = goCmd(t, "list", "-m", "-f", "{{.Dir}} {{.Version}}", pgxModule)
		dir, version, _ = strings.Cut(strings.TrimSpace(out), " ")
	}
	require.NotEmpty(t, dir, "the module cache has no %s", pgxModule)
	return dir, version
}

func readAllowlist(t *testing.T) allowlist {
	t.Helper()
	f, err := os.Open("allowlist.txt")
	require.NoError(t, err)
	defer f.Close()
	a, err := parseAllowlist(f)
	require.NoError(t, err)
	return a
}

// removeStale removes the _gen-* directories in dir that a killed run left, a day after.
func removeStale(t *testing.T, dir string) {
	t.Helper()
	old, err := filepath.Glob(filepath.Join(dir, "_gen-*"))
	require.NoError(t, err)
	for _, d := range old {
		if fi, err := os.Stat(d); err == nil && time.Since(fi.ModTime()) > 24*time.Hour {
			os.RemoveAll(d)
		}
	}
}

// goCmd runs the go command in this package's directory and returns its standard output.
func goCmd(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), stderr.String())
	return string(out)
}
