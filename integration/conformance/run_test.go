package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helperEnv selects what TestHelperProcess does when the runner tests start this test binary as
// a child, in the manner of os/exec's tests.
const helperEnv = "CONFORMANCE_HELPER"

// TestHelperProcess is not a test: the runner tests run it as a child that passes, fails, skips,
// crashes, hangs, grows its memory or reports its CPUs on demand.
func TestHelperProcess(t *testing.T) {
	mode, arg, _ := strings.Cut(os.Getenv(helperEnv), ":")
	switch mode {
	case "":
		t.Skip("a child process of the runner tests")
	case "pass":
	case "fail":
		t.Error("helper: failing on purpose")
	case "skip":
		t.Skip("helper: skipping on purpose")
	case "crash":
		go panic("helper: crash") // a panic off the test goroutine ends the whole process
		time.Sleep(10 * time.Second)
	case "hang":
		time.Sleep(time.Minute)
	case "grow":
		// Touch 1 MiB a millisecond, up to 1 GiB: the memory watch must stop it well before.
		var keep [][]byte
		for range 1024 {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
			time.Sleep(time.Millisecond)
		}
		runtime.KeepAlive(keep)
	case "numcpu":
		fmt.Printf("numcpu=%d\n", runtime.NumCPU())
	case "flaky":
		// Fails the first time, when the marker file arg does not exist yet.
		if _, err := os.Stat(arg); err != nil {
			require.NoError(t, os.WriteFile(arg, nil, 0o644))
			t.Error("helper: first run fails")
		}
	}
}

func helperJob(t *testing.T, mode string) job {
	self, err := os.Executable()
	require.NoError(t, err)
	return job{Bin: self, Test: "TestHelperProcess", Dir: t.TempDir(), Env: append(os.Environ(), helperEnv+"="+mode),
		Timeout: 20 * time.Second, MemLimit: memLimit}
}

func TestRunJob(t *testing.T) {
	tests := []struct {
		mode     string
		edit     func(*job)
		outcome  outcome
		cause    string // prefix
		excerpts string // in the excerpt
	}{
		{mode: "pass", outcome: passed},
		{mode: "skip", outcome: skipped},
		{mode: "fail", outcome: failed, cause: "exit status 1", excerpts: "run_test.go:29: helper: failing on purpose"},
		{mode: "crash", outcome: failed, cause: "exit status 2", excerpts: "panic: helper: crash"},
		{mode: "hang", edit: func(j *job) { j.Timeout = time.Second }, outcome: failed, cause: "timed out after 1s", excerpts: "panic: test timed out after 1s"},
		{mode: "grow", edit: func(j *job) { j.MemLimit = 300 << 20 }, outcome: failed, cause: "killed: resident memory above 300 MiB"},
		{mode: "pass", edit: func(j *job) { j.Test = "TestNoSuchTest" }, outcome: failed, cause: "no test matched TestNoSuchTest"},
	}
	for _, tt := range tests {
		t.Run(tt.mode+"/"+tt.cause, func(t *testing.T) {
			j := helperJob(t, tt.mode)
			if tt.edit != nil {
				tt.edit(&j)
			}
			start := time.Now()
			r := runJob(t.Context(), j)
			require.Equal(t, tt.outcome, r.Outcome, "output:\n%s", r.Output)
			assert.True(t, strings.HasPrefix(r.Cause, tt.cause), "cause %q, want %q", r.Cause, tt.cause)
			if tt.excerpts != "" {
				assert.Contains(t, strings.Join(excerpt(r.Output, 10), "\n"), tt.excerpts)
			}
			assert.Less(t, time.Since(start), 15*time.Second)
		})
	}
}

// TestRunAllIsolatesFailures runs a crash, a failure, a pass and a flaky test side by side: each
// is judged on its own, and only the retried ones run twice.
func TestRunAllIsolatesFailures(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "flaky-ran")
	jobs := []job{helperJob(t, "crash"), helperJob(t, "fail"), helperJob(t, "pass"), helperJob(t, "flaky:"+marker)}
	res := runAll(t.Context(), jobs, 2, func(_ job, r result) bool { return strings.HasPrefix(r.Cause, "exit status 1") })

	require.Len(t, res, 4)
	assert.Len(t, res[0], 1, "a crash (exit status 2) is not retried")
	assert.Equal(t, failed, res[0].last().Outcome)
	assert.Len(t, res[1], 2, "a failure is retried once")
	assert.Equal(t, failed, res[1].last().Outcome)
	assert.Len(t, res[2], 1)
	assert.Equal(t, passed, res[2].last().Outcome)
	assert.Len(t, res[3], 2)
	assert.Equal(t, failed, res[3][0].Outcome)
	assert.Equal(t, passed, res[3].last().Outcome)
}

func TestStartPinned(t *testing.T) {
	if !canPin {
		t.Skip("only Linux pins")
	}
	j := helperJob(t, "numcpu")
	j.CPUs = 1
	r := runJob(t.Context(), j)
	require.Equal(t, passed, r.Outcome, "output:\n%s", r.Output)
	assert.Contains(t, string(r.Output), "numcpu=1\n")

	// The pinning narrows the child, not this process.
	j.CPUs = 0
	r = runJob(t.Context(), j)
	require.Equal(t, passed, r.Outcome, "output:\n%s", r.Output)
	assert.Contains(t, string(r.Output), fmt.Sprintf("numcpu=%d\n", runtime.NumCPU()))
}

func TestCappedBuffer(t *testing.T) {
	var b cappedBuffer
	head := strings.Repeat("h", capHead)
	middle := strings.Repeat("m", 1000)
	tail := strings.Repeat("t", capTail)
	for _, s := range []string{head, middle, tail} {
		n, err := b.Write([]byte(s))
		require.NoError(t, err)
		require.Equal(t, len(s), n)
	}
	assert.Equal(t, head+"\n... 1000 bytes cut ...\n"+tail, string(b.Bytes()))
}

func TestExcerpt(t *testing.T) {
	out := "=== RUN   TestX\n" +
		"    pool_test.go:12: \n" +
		"        \tError Trace:\t/x/pool_test.go:12\n" +
		"        \tError:      \tReceived unexpected error:\n" +
		"        \t            \tpgxlanes: short lane: wait queue full\n" +
		"        \tTest:       \tTestX\n" +
		"    pool_test.go:20: plain t.Error message\n" +
		"--- FAIL: TestX (0.01s)\n" +
		"fatal error: runtime: out of memory\n"
	assert.Equal(t, []string{
		"Error:      \tReceived unexpected error:",
		"pgxlanes: short lane: wait queue full",
		"pool_test.go:20: plain t.Error message",
		"fatal error: runtime: out of memory",
	}, excerpt([]byte(out), 10))
	assert.Len(t, excerpt([]byte(out), 2), 2)

	long := "    pool_test.go:1: " + strings.Repeat("x", 500) + "\n"
	ex := excerpt([]byte(long), 10)
	require.Len(t, ex, 1)
	assert.Len(t, ex[0], excerptWidth+len(" ..."))
}
