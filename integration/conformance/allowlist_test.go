package conformance

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseAllowlist(t *testing.T) {
	a, err := parseAllowlist(strings.NewReader("# comment\n\nTestA: a reason\n  TestB:   another: with colon  \n"))
	require.NoError(t, err)
	assert.Equal(t, allowlist{"TestA": "a reason", "TestB": "another: with colon"}, a)

	for _, bad := range []struct{ in, want string }{
		{"TestA\n", `line 1: want "TestName: reason"`},
		{"TestA:\n", `line 1: want "TestName: reason"`},
		{"# x\nNotATest: reason\n", "line 2"},
		{"TestA: one\nTestA: two\n", "line 2: TestA is listed twice"},
	} {
		_, err := parseAllowlist(strings.NewReader(bad.in))
		assert.ErrorContains(t, err, bad.want, "%q", bad.in)
	}
}

// TestAllowlistFile checks the committed allowlist's syntax without running anything.
func TestAllowlistFile(t *testing.T) {
	f, err := os.Open("allowlist.txt")
	require.NoError(t, err)
	defer f.Close()
	_, err = parseAllowlist(f)
	require.NoError(t, err)
}

func TestJudge(t *testing.T) {
	pass := func(name string) attempts { return attempts{{Test: name, Outcome: passed}} }
	fail := func(name string) attempts { return attempts{{Test: name, Outcome: failed, Cause: "exit status 1"}} }
	flaky := func(name string) attempts {
		return attempts{{Test: name, Outcome: failed, Cause: "exit status 1"}, {Test: name, Outcome: passed}}
	}
	names := []string{"TestA", "TestB", "TestC", "TestD"}
	tests := []struct {
		name        string
		lanes       []attempts
		control     []attempts
		allow       allowlist
		passed      int
		failed      int
		allowed     []string
		flaky       int
		controlOnly int
		problems    []string // substrings, one per problem, in order
	}{
		{
			name:    "all pass",
			lanes:   []attempts{pass("TestA"), pass("TestB"), pass("TestC"), pass("TestD")},
			control: []attempts{pass("TestA"), pass("TestB"), pass("TestC"), pass("TestD")},
			passed:  4,
		},
		{
			name:    "allowlisted failure is fine",
			lanes:   []attempts{pass("TestA"), fail("TestB"), pass("TestC"), pass("TestD")},
			allow:   allowlist{"TestB": "lane rule"},
			passed:  3,
			failed:  1,
			allowed: []string{"TestB: lane rule"},
		},
		{
			name:     "unlisted failure is a problem",
			lanes:    []attempts{pass("TestA"), fail("TestB"), pass("TestC"), pass("TestD")},
			passed:   3,
			failed:   1,
			problems: []string{"TestB fails against pgxlanes (exit status 1) and is not allowlisted"},
		},
		{
			name:     "allowlisted pass is a problem",
			lanes:    []attempts{pass("TestA"), pass("TestB"), pass("TestC"), pass("TestD")},
			allow:    allowlist{"TestB": "lane rule"},
			passed:   4,
			problems: []string{"TestB passes but is allowlisted (lane rule): remove it"},
		},
		{
			name:     "stale allowlist entry is a problem",
			lanes:    []attempts{pass("TestA"), pass("TestB"), pass("TestC"), pass("TestD")},
			allow:    allowlist{"TestGone": "old"},
			passed:   4,
			problems: []string{"TestGone is allowlisted but is no test of this pgx version"},
		},
		{
			name:     "a failure of both is a problem of the environment; a control flake is not",
			lanes:    []attempts{fail("TestA"), pass("TestB"), pass("TestC"), flaky("TestD")},
			control:  []attempts{fail("TestA"), flaky("TestB"), pass("TestC"), pass("TestD")},
			passed:   3,
			failed:   1,
			flaky:    2,
			problems: []string{"TestA fails against pgxlanes", "TestA fails against plain pgxpool too"},
		},
		{
			name:        "a failure of the control alone is logged, not a problem",
			lanes:       []attempts{pass("TestA"), pass("TestB"), pass("TestC"), pass("TestD")},
			control:     []attempts{fail("TestA"), pass("TestB"), pass("TestC"), pass("TestD")},
			passed:      4,
			controlOnly: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := judge(names, tt.lanes, tt.control, tt.allow)
			assert.Equal(t, tt.passed, v.Passed, "passed")
			assert.Equal(t, tt.failed, v.Failed, "failed")
			assert.Equal(t, tt.allowed, v.Allowed)
			assert.Len(t, v.Flaky, tt.flaky)
			assert.Len(t, v.ControlOnly, tt.controlOnly)
			require.Len(t, v.Problems, len(tt.problems), "%q", v.Problems)
			for i, p := range tt.problems {
				assert.Contains(t, v.Problems[i], p)
			}
		})
	}
}
