package conformance

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// allowlist maps a test name to the reason it is expected to fail against pgxlanes.
type allowlist map[string]string

var allowLine = regexp.MustCompile(`^(Test\w*):\s*(\S.*)$`)

// parseAllowlist reads "TestName: reason" lines; blank lines and lines starting with # are
// skipped. Errors name the line.
func parseAllowlist(r io.Reader) (allowlist, error) {
	a := allowlist{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		m := allowLine.FindStringSubmatch(l)
		if m == nil {
			return nil, fmt.Errorf("conformance: allowlist line %d: want \"TestName: reason\", got %q", n, l)
		}
		if _, dup := a[m[1]]; dup {
			return nil, fmt.Errorf("conformance: allowlist line %d: %s is listed twice", n, m[1])
		}
		a[m[1]] = m[2]
	}
	return a, sc.Err()
}

// verdict is the judgement of one run of the stage.
type verdict struct {
	Passed, Failed, Skipped int
	Allowed                 []string // allowlisted failures, "TestName: reason"
	Flaky                   []string // tests that failed once and passed on the retry
	ControlOnly             []string // tests that failed on plain pgxpool twice and passed on pgxlanes
	Problems                []string // what makes the stage fail, one line each
}

// judge checks the lanes results against the allowlist and the control results (nil if the
// control did not run). names is the test list of the compiled lanes package.
func judge(names []string, lanes, control []attempts, allow allowlist) verdict {
	var v verdict
	for name := range allow {
		if !slices.Contains(names, name) {
			v.Problems = append(v.Problems, fmt.Sprintf("%s is allowlisted but is no test of this pgx version: remove it from allowlist.txt", name))
		}
	}
	for _, a := range lanes {
		r := a.last()
		reason, listed := allow[r.Test]
		switch {
		case r.Outcome == skipped:
			v.Skipped++
		case r.Outcome == passed:
			v.Passed++
			if len(a) > 1 {
				v.Flaky = append(v.Flaky, r.Test+" (pgxlanes: "+a[0].Cause+", then passed)")
			}
			if listed {
				v.Problems = append(v.Problems, fmt.Sprintf("%s passes but is allowlisted (%s): remove it from allowlist.txt", r.Test, reason))
			}
		case listed:
			v.Failed++
			v.Allowed = append(v.Allowed, r.Test+": "+reason)
		default:
			v.Failed++
			v.Problems = append(v.Problems, fmt.Sprintf("%s fails against pgxlanes (%s) and is not allowlisted", r.Test, r.Cause))
		}
	}
	lanesFailed := map[string]bool{}
	for _, a := range lanes {
		if r := a.last(); r.Outcome == failed {
			lanesFailed[r.Test] = true
		}
	}
	for _, a := range control {
		r := a.last()
		switch {
		case r.Outcome == failed && lanesFailed[r.Test]:
			v.Problems = append(v.Problems, fmt.Sprintf("%s fails against plain pgxpool too (%s): the environment is broken, not pgxlanes", r.Test, r.Cause))
		case r.Outcome == failed:
			// pgx's own test failed twice on pgx's own pool and passed on pgxlanes: nothing
			// pgxlanes does less than pgxpool (pgx's timing-sensitive tests, such as stdlib's
			// TestBeginTxContextCancel, do this on a loaded machine). Logged, not a failure: the
			// stage checks pgxlanes against the suite.
			v.ControlOnly = append(v.ControlOnly, r.Test+" (pgxpool: "+r.Cause+" twice; pgxlanes passed)")
		case len(a) > 1:
			v.Flaky = append(v.Flaky, r.Test+" (pgxpool: "+a[0].Cause+", then passed)")
		}
	}
	return v
}
