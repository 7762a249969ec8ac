package conformance

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/internal/race"
)

// TestStdlibConformance runs pgx's own database/sql tests (stdlib/sql_test.go) with every
// *sql.DB of stdlib.OpenDB taken from the bridge (github.com/pgxlanes/pgxlanes/stdlib on a
// pgxlanes pool), and, as a control, pgx's untouched stdlib tests, the way TestPgxpoolConformance
// runs pgxpool's: one process per test, allowlist_stdlib.txt for what a bridge over a pool cannot
// or does not do the same.
func TestStdlibConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles and runs pgx's database/sql tests twice: not in -short")
	}
	ctx := t.Context()
	control := os.Getenv(envControl) != "0"
	pgxDir, pgxVersion := pgxModuleDir(t)
	f, err := os.Open("allowlist_stdlib.txt")
	require.NoError(t, err)
	allow, err := parseAllowlist(f)
	f.Close()
	require.NoError(t, err)
	removeStale(t, ".")

	gen, err := os.MkdirTemp(".", "_gen-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(gen) })
	require.NoError(t, generateStdlib(pgxDir, gen))

	bins := t.TempDir()
	args := []string{"test", "-c", "-o", bins + string(filepath.Separator)}
	if race.Enabled {
		args = append(args, "-race")
	}
	args = append(args, "./"+filepath.Base(gen))
	if control {
		args = append(args, pgxStdlibPath)
	}
	goCmd(t, args...)
	lanesBin := filepath.Join(bins, filepath.Base(gen)+".test")
	controlBin := filepath.Join(bins, "stdlib.test")

	runDir := t.TempDir()
	names, err := listTests(ctx, lanesBin, runDir)
	require.NoError(t, err)
	require.NotEmpty(t, names)
	if control {
		controlNames, err := listTests(ctx, controlBin, runDir)
		require.NoError(t, err)
		require.Equal(t, controlNames, names, "the rewrite must keep every test")
	}
	// Each suite gets a database of its own: pgx's tests create tables by fixed names.
	lanesEnv := testEnv(pgserver.NewDatabase(t))
	var controlEnv []string
	if control {
		controlEnv = testEnv(pgserver.NewDatabase(t))
	}
	var jobs []job
	for _, n := range names {
		jobs = append(jobs, job{Bin: lanesBin, Test: n, Dir: runDir, Env: lanesEnv, Timeout: testTimeout, MemLimit: memLimit, CPUs: cpus})
		if control {
			jobs = append(jobs, job{Bin: controlBin, Test: n, Dir: runDir, Env: controlEnv, Timeout: testTimeout, MemLimit: memLimit, CPUs: cpus})
		}
	}
	retry := func(j job, r result) bool {
		_, listed := allow[j.Test]
		return !(j.Bin == lanesBin && listed) && r.Cause == "exit status 1"
	}
	all := runAll(ctx, jobs, 4, retry)
	var lanes, ctrl []attempts
	for i, a := range all {
		if jobs[i].Bin == lanesBin {
			lanes = append(lanes, a)
		} else {
			ctrl = append(ctrl, a)
		}
	}
	v := judge(names, lanes, ctrl, allow)
	t.Logf("pgx %s database/sql tests on the bridge: %d passed, %d failed (%d allowlisted), %d skipped", pgxVersion, v.Passed, v.Failed, len(v.Allowed), v.Skipped)
	if control {
		cp, cf, cs := count(ctrl)
		t.Logf("pgx's stdlib (control): %d passed, %d failed, %d skipped", cp, cf, cs)
	}
	slices.Sort(v.Allowed)
	for _, a := range v.Allowed {
		t.Logf("allowlisted failure: %s", a)
	}
	for _, fl := range v.Flaky {
		t.Logf("flaky, passed on retry: %s", fl)
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
		suite := "bridge"
		if jobs[i].Bin != lanesBin {
			suite = "pgx stdlib"
		}
		t.Logf("%s %s (%s, %v):\n%s", suite, r.Test, r.Cause, r.Elapsed.Round(time.Millisecond), indent(failureText(r.Output)))
	}
}
