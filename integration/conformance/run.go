package conformance

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// outcome is how one test process ended.
type outcome uint8

const (
	passed outcome = iota
	failed
	skipped
)

func (o outcome) String() string {
	return [...]string{"passed", "failed", "skipped"}[o]
}

// job is one test of one compiled package, run in a process of its own.
type job struct {
	Bin     string        // the compiled test binary
	Test    string        // the top-level test's name; its subtests run with it
	Dir     string        // the working directory
	Env     []string      // the environment, in os.Environ's form
	Timeout time.Duration // -test.timeout; the process is killed a few seconds later if still alive
	// MemLimit kills the process when its resident memory exceeds it, so that a test that
	// allocates without bound fails alone instead of pushing the machine out of memory. 0 means no
	// limit; the watch needs /proc and is skipped where there is none.
	MemLimit int64
	// CPUs, if above 0, narrows the process's CPU affinity to that many CPUs where the platform
	// allows (canPin).
	CPUs int
}

// result is what one run of a job gave.
type result struct {
	Test    string
	Outcome outcome
	Cause   string // for a failure: "exit status 1", "timed out after 1m", "killed: ..."
	Output  []byte // combined stdout and stderr of -test.v, its middle cut if long
	Elapsed time.Duration
	PeakRSS int64 // the largest resident set seen by the memory watch, 0 if unwatched
}

// killGrace is how long after -test.timeout a process is killed: long enough for the testing
// package to print its goroutine dump.
const killGrace = 10 * time.Second

// runJob runs j's test once.
func runJob(parent context.Context, j job) result {
	ctx, cancel := context.WithTimeout(parent, j.Timeout+killGrace)
	defer cancel()
	cmd := exec.CommandContext(ctx, j.Bin, "-test.run", "^"+regexp.QuoteMeta(j.Test)+"$",
		"-test.v", "-test.count=1", "-test.timeout="+j.Timeout.String())
	cmd.Dir, cmd.Env = j.Dir, j.Env
	out := &cappedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	r := result{Test: j.Test}
	launch := cmd.Start
	if j.CPUs > 0 {
		launch = func() error { return startPinned(cmd, j.CPUs) }
	}
	if err := launch(); err != nil {
		r.Outcome, r.Cause = failed, err.Error()
		return r
	}
	var overMem memWatch
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if j.MemLimit > 0 {
		wg.Go(func() { overMem.watch(cmd.Process, j.MemLimit, stop) })
	}
	err := cmd.Wait()
	close(stop)
	wg.Wait()
	r.Elapsed = time.Since(start)
	r.Output = out.Bytes()
	r.PeakRSS = overMem.peakRSS()
	switch {
	case overMem.exceeded():
		r.Outcome, r.Cause = failed, fmt.Sprintf("killed: resident memory above %d MiB", j.MemLimit>>20)
	case parent.Err() != nil:
		r.Outcome, r.Cause = failed, "killed: "+parent.Err().Error()
	case ctx.Err() != nil:
		r.Outcome, r.Cause = failed, fmt.Sprintf("killed: still running %v after -test.timeout", killGrace)
	case err != nil && bytes.Contains(r.Output, []byte("panic: test timed out after")):
		r.Outcome, r.Cause = failed, "timed out after "+j.Timeout.String()
	case err != nil:
		r.Outcome, r.Cause = failed, err.Error()
	case bytes.Contains(r.Output, []byte("testing: warning: no tests to run")):
		r.Outcome, r.Cause = failed, "no test matched "+j.Test
	case bytes.Contains(r.Output, []byte("--- SKIP: "+j.Test+" ")):
		r.Outcome = skipped
	default:
		r.Outcome = passed
	}
	return r
}

// memWatch kills a process whose resident set grows beyond a limit.
type memWatch struct {
	mu   sync.Mutex
	over bool
	peak int64
}

func (w *memWatch) peakRSS() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak
}

func (w *memWatch) exceeded() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.over
}

// watch polls p's resident set size from /proc until stop is closed, and kills p the first time
// it exceeds limit. It returns at once where /proc is missing.
func (w *memWatch) watch(p *os.Process, limit int64, stop <-chan struct{}) {
	statm := "/proc/" + strconv.Itoa(p.Pid) + "/statm"
	page := int64(os.Getpagesize())
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		b, err := os.ReadFile(statm)
		if err != nil {
			return // gone, or no /proc
		}
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				w.mu.Lock()
				w.peak = max(w.peak, pages*page)
				w.over = w.peak > limit
				w.mu.Unlock()
				if w.exceeded() {
					_ = p.Kill()
					return
				}
			}
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// cappedBuffer keeps the first and last few KiB of what is written to it.
type cappedBuffer struct {
	mu      sync.Mutex
	head    []byte
	tail    []byte
	dropped int64
}

const capHead, capTail = 16 << 10, 48 << 10

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(p)
	if room := capHead - len(b.head); room > 0 {
		k := min(room, len(p))
		b.head = append(b.head, p[:k]...)
		p = p[k:]
	}
	b.tail = append(b.tail, p...)
	if over := len(b.tail) - capTail; over > 0 {
		b.dropped += int64(over)
		b.tail = append(b.tail[:0], b.tail[over:]...)
	}
	return n, nil
}

func (b *cappedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := append([]byte{}, b.head...)
	if b.dropped > 0 {
		out = fmt.Appendf(out, "\n... %d bytes cut ...\n", b.dropped)
	}
	return append(out, b.tail...)
}

// runAll runs every job on at most parallel processes at once and returns the results in the
// jobs' order. A failed job is run once more (retry says which) before it counts as failed: the
// machine is shared and pgx's tests have timing margins of a few hundred milliseconds.
func runAll(ctx context.Context, jobs []job, parallel int, retry func(job, result) bool) []attempts {
	res := make([]attempts, len(jobs))
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r := runJob(ctx, j)
			res[i] = attempts{r}
			if r.Outcome == failed && retry(j, r) && ctx.Err() == nil {
				res[i] = append(res[i], runJob(ctx, j))
			}
		})
	}
	wg.Wait()
	return res
}

// attempts are the runs of one job, the last one deciding.
type attempts []result

func (a attempts) last() result { return a[len(a)-1] }

// listTests returns the names of the tests in a compiled test binary, without its benchmarks,
// fuzz tests and examples.
func listTests(ctx context.Context, bin, dir string) ([]string, error) {
	cmd := exec.CommandContext(ctx, bin, "-test.list", "^Test")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("conformance: %s -test.list: %w: %s", bin, err, ee.Stderr)
		}
		return nil, fmt.Errorf("conformance: %s -test.list: %w", bin, err)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(l, "Test") {
			names = append(names, l)
		}
	}
	return names, nil
}

// excerptWidth is where excerpt cuts a line; testify prints whole structs on one line.
const excerptWidth = 200

// excerpt returns the lines of a failure's output that say what went wrong: testify's Error
// blocks, t.Error lines, panics and fatal errors, at most max lines.
func excerpt(out []byte, max int) []string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	inError := false
	add := func(l string) {
		if len(lines) < max {
			l = strings.TrimSpace(l)
			if len(l) > excerptWidth {
				l = l[:excerptWidth] + " ..."
			}
			lines = append(lines, l)
		}
	}
	for sc.Scan() {
		l := sc.Text()
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "Error:"):
			inError = true
			add(l)
		case inError && strings.HasPrefix(l, "        \t            \t"):
			add(l)
		case strings.HasPrefix(t, "panic:"), strings.HasPrefix(t, "fatal error:"),
			strings.HasPrefix(t, "runtime: "), strings.Contains(t, "DATA RACE"):
			inError = false
			add(l)
		case isTestLogLine(t):
			inError = false
			add(l)
		default:
			inError = false
		}
	}
	return lines
}

// testLogLine matches a t.Error or t.Fatal line with a message, "pool_test.go:123: message".
var testLogLine = regexp.MustCompile(`^[\w.]+_test\.go:\d+: \S`)

func isTestLogLine(l string) bool { return testLogLine.MatchString(l) }
