package stmtstats_test

import (
	"fmt"
	"strings"
	"testing"
	"testing/quick"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	threshold = 100 * time.Millisecond
	fastRun   = 2 * time.Millisecond
	lockWait  = 600 * time.Millisecond
)

// newTable returns a Table of the fraction alone: no MinPeriod, no relative rule (tests of those
// make their own).
func newTable(t testing.TB, entries int) *stmtstats.Table {
	t.Helper()
	tab, err := stmtstats.New(stmtstats.Config{Threshold: threshold, Entries: entries, MinPeriod: -1})
	require.NoError(t, err)
	stmtstats.NoRelative(tab)
	return tab
}

// play runs the steps on the statement k and returns the changes, as "step:change", and
// whether k was demoted after each step. Steps:
//
//	f  a fast run
//	s  a slow run that ended before its Overran timer fired (Done with d >= Threshold)
//	o  a slow run reported by Overran, then by Done with overran set
//	O  Overran only: a run still in flight
//	d  Done with overran set only: the end of a run that O reported
func play(tab *stmtstats.Table, k stmtstats.Key, steps string) (changes []string, demoted []bool) {
	for i, step := range steps {
		var cs []stmtstats.Change
		switch step {
		case 'f':
			cs = append(cs, tab.Done(k, fastRun, false))
		case 's':
			cs = append(cs, tab.Done(k, lockWait, false))
		case 'o':
			cs = append(cs, tab.Overran(k), tab.Done(k, lockWait, true))
		case 'O':
			cs = append(cs, tab.Overran(k))
		case 'd':
			cs = append(cs, tab.Done(k, lockWait, true))
		default:
			panic("unknown step " + string(step))
		}
		for _, c := range cs {
			if c != stmtstats.None {
				changes = append(changes, fmt.Sprintf("%d:%v", i, c))
			}
		}
		demoted = append(demoted, tab.Demoted(k))
	}
	return changes, demoted
}

func TestDecision(t *testing.T) {
	r := strings.Repeat
	tests := []struct {
		name    string
		steps   string
		changes []string // nil: none
		demoted bool     // after the last step
	}{
		{"one lock wait among many fast runs", r("f", 1000) + "s" + r("f", 1000), nil, false},
		{"one overran lock wait among many fast runs", r("f", 1000) + "o" + r("f", 1000), nil, false},
		{"two lock waits in a row after a fast history", r("f", 1000) + "ss", nil, false},
		{"two slow, six fast, two slow again", "f" + "ss" + r("f", 6) + "ss", nil, false},
		{"one slow run after one fast run", "fs", nil, false},
		{"two slow runs after one fast run", "fss", nil, false},
		{"three slow runs demote", "fsss", []string{"3:demoted"}, true},
		{"three overruns demote", "fOOO", []string{"3:demoted"}, true},
		{"three overran runs demote", "fooo", []string{"3:demoted"}, true},
		{"three slow runs demote a lookup with a fast history", r("f", 1000) + "sss", []string{"1002:demoted"}, true},
		{"mostly slow runs demote", "fsfsfss", []string{"6:demoted"}, true},
		{"Done after Overran does not count the run again", "fOdOd", nil, false},
		{"Done after Overran ignores d", "fOOf" + "d", nil, false},
		{"just demoted: promoted after four fast runs", "fsss" + "ffff", []string{"3:demoted", "7:promoted"}, false},
		{"long slow: promoted after six fast runs", "f" + r("s", 50) + r("f", 6), []string{"3:demoted", "56:promoted"}, false},
		{"slow half the time stays demoted", "f" + r("sf", 50), []string{"7:demoted"}, true},
		{"slow one run in three stays in short", "f" + r("sff", 50), nil, false},
		{"demoted again after promotion", "fsss" + r("f", 20) + "sss", []string{"3:demoted", "7:promoted", "26:demoted"}, true},
		// Probation: a statement with no fast run on record has no history to protect.
		{"the first run of a new statement is slow: demoted", "s", []string{"0:demoted"}, true},
		{"the first run of a new statement overran: demoted", "O", []string{"0:demoted"}, true},
		{"slow from the start: demoted once", r("s", 20), []string{"0:demoted"}, true},
		{"demoted new statement, fast since: promoted", "s" + r("f", 3), []string{"0:demoted", "1:promoted"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab := newTable(t, 0)
			changes, demoted := play(tab, tab.Key("select 1"), tt.steps)
			assert.Equal(t, tt.changes, changes)
			assert.Equal(t, tt.demoted, demoted[len(demoted)-1])
			st := tab.Stat()
			assert.Equal(t, uint64(strings.Count(strings.Join(changes, " "), "demoted")), st.Demotions)
			assert.Equal(t, uint64(strings.Count(strings.Join(changes, " "), "promoted")), st.Promotions)
		})
	}
}

// steps maps random bytes to runs that end: fast, slow, or overran.
func steps(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		sb.WriteByte("fso"[c%3])
	}
	return sb.String()
}

func TestDecisionProperties(t *testing.T) {
	cfg := &quick.Config{MaxCount: 2000}
	check := func(name string, prop func(history string) bool) {
		t.Run(name, func(t *testing.T) {
			assert.NoError(t, quick.Check(func(b []byte) bool { return prop(steps(b)) }, cfg))
		})
	}
	last := func(tail string) func(string) bool {
		return func(history string) bool {
			tab := newTable(t, 0)
			_, demoted := play(tab, tab.Key("q"), history+tail)
			return demoted[len(demoted)-1]
		}
	}
	check("any history then three slow runs: demoted", last("sss"))
	check("any history then three overruns: demoted", last("OOO"))
	check("a fast run, any history, then eight fast runs and two slow: not demoted", func(h string) bool {
		return !last(strings.Repeat("f", 8) + "ss")("f" + h)
	})
	check("any history then six fast runs: not demoted", func(h string) bool { return !last(strings.Repeat("f", 6))(h) })
	check("changes alternate, start with a demotion, and match Demoted", func(h string) bool {
		tab := newTable(t, 0)
		k := tab.Key("q")
		want, now := stmtstats.Demoted, false
		for i := range len(h) {
			changes, demoted := play(tab, k, h[i:i+1])
			for _, c := range changes {
				if !strings.HasSuffix(c, want.String()) {
					return false
				}
				want, now = stmtstats.Demoted+stmtstats.Promoted-want, !now
			}
			if demoted[0] != now {
				return false
			}
		}
		return true
	})
	check("an overran run counts as one slow run", func(h string) bool {
		a, b := newTable(t, 0), newTable(t, 0)
		ca, da := play(a, a.Key("q"), h)
		cb, db := play(b, b.Key("q"), strings.ReplaceAll(h, "o", "s"))
		return assert.ObjectsAreEqual(ca, cb) && assert.ObjectsAreEqual(da, db)
	})
}

func TestStatementsAreIndependent(t *testing.T) {
	tab := newTable(t, 0)
	slow, fast := tab.Key("select pg_sleep(1.5)"), tab.Key("select name from users where id = $1")
	require.NotEqual(t, slow, fast)
	assert.Equal(t, tab.Key("select pg_sleep(1.5)"), slow, "a key depends on the text only")
	play(tab, slow, "sss")
	assert.True(t, tab.Demoted(slow))
	assert.False(t, tab.Demoted(fast))
	assert.True(t, tab.Demoted(tab.Key("select pg_sleep(1.6)")), "texts that differ only in a literal are one statement")
	assert.Equal(t, stmtstats.Unproven, tab.Classify(fast))
	play(tab, fast, "f")
	assert.Equal(t, stmtstats.Proven, tab.Classify(fast))
	assert.Equal(t, stmtstats.Slow, tab.Classify(slow))
	st := tab.Stat()
	assert.Equal(t, stmtstats.Stat{Entries: stmtstats.DefaultEntries, Tracked: 2, Proven: 1, Demoted: 1, Demotions: 1}, st)
}

// A fast run puts a statement on record as proven; a settled fast statement changes nothing.
func TestFastRunsProve(t *testing.T) {
	tab := newTable(t, 8)
	for i := range 1000 {
		k := tab.Key(fmt.Sprintf("select c%d from t", i))
		assert.Equal(t, stmtstats.None, tab.Done(k, fastRun, false))
	}
	st := tab.Stat()
	assert.Equal(t, 8, st.Tracked)
	assert.Equal(t, 8, st.Proven)
	assert.Equal(t, uint64(1000-8), st.Evictions, "a full set evicts proven statements: they only go back to probation")
}

func TestEviction(t *testing.T) {
	// Entries 8 is one set: every statement competes for the same eight entries.
	t.Run("demoted entries outlive cold ones", func(t *testing.T) {
		tab := newTable(t, 8)
		a, b := tab.Key("report a"), tab.Key("report b")
		play(tab, a, "sss")
		play(tab, b, "ooo")
		for i := range 1000 {
			play(tab, tab.Key(fmt.Sprintf("cold_%d", i)), "fs")
		}
		assert.True(t, tab.Demoted(a))
		assert.True(t, tab.Demoted(b))
		st := tab.Stat()
		assert.Equal(t, 8, st.Tracked)
		assert.Equal(t, 2, st.Demoted)
		assert.Equal(t, uint64(1000-6), st.Evictions)
		assert.Zero(t, st.EvictedDemoted)
	})
	t.Run("recently used entries outlive unused ones", func(t *testing.T) {
		for _, used := range []bool{true, false} {
			tab := newTable(t, 8)
			x := tab.Key("search")
			play(tab, x, "fss") // a fast run, two slow runs: one more demotes it, if it is remembered
			for i := range 100 {
				play(tab, tab.Key(fmt.Sprintf("cold_%d", i)), "fs")
				if used {
					tab.Demoted(x) // classified: the search runs all the time
				}
			}
			if !used {
				assert.Equal(t, stmtstats.Unproven, tab.Classify(x), "history evicted")
				continue
			}
			changes, _ := play(tab, x, "s")
			assert.Equal(t, []string{"0:demoted"}, changes, "history kept")
		}
	})
	t.Run("a full set of demoted entries evicts one and says so", func(t *testing.T) {
		tab := newTable(t, 8)
		for i := range 9 {
			play(tab, tab.Key(fmt.Sprintf("report_%d", i)), "sss")
		}
		st := tab.Stat()
		assert.Equal(t, stmtstats.Stat{Entries: 8, Tracked: 8, Demoted: 8, Demotions: 9, Evictions: 1, EvictedDemoted: 1}, st)
		assert.Equal(t, uint64(st.Demoted), st.Demotions-st.Promotions-st.EvictedDemoted)
	})
}

func TestNew(t *testing.T) {
	for _, tt := range []struct {
		cfg     stmtstats.Config
		entries int
		err     string
	}{
		{stmtstats.Config{Threshold: time.Second}, stmtstats.DefaultEntries, ""},
		{stmtstats.Config{Threshold: time.Second, Entries: 1}, 8, ""},
		{stmtstats.Config{Threshold: time.Second, Entries: 1000}, 1024, ""},
		{stmtstats.Config{Threshold: time.Second, Entries: stmtstats.MaxEntries}, stmtstats.MaxEntries, ""},
		{stmtstats.Config{}, 0, "stmtstats: Config.Threshold must be positive, got 0s"},
		{stmtstats.Config{Threshold: -time.Second}, 0, "stmtstats: Config.Threshold must be positive, got -1s"},
		{stmtstats.Config{Threshold: time.Second, Entries: -1}, 0, "stmtstats: Config.Entries must be between 0 and 1048576, got -1"},
		{stmtstats.Config{Threshold: time.Second, Entries: stmtstats.MaxEntries + 1}, 0, "stmtstats: Config.Entries must be between 0 and 1048576, got 1048577"},
	} {
		tab, err := stmtstats.New(tt.cfg)
		if tt.err != "" {
			assert.EqualError(t, err, tt.err)
			assert.Nil(t, tab)
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, tt.entries, tab.Stat().Entries)
		assert.Equal(t, tt.cfg.Threshold, tab.Threshold())
	}
}

func TestNilTable(t *testing.T) {
	var tab *stmtstats.Table
	k := tab.Key("select 1")
	assert.False(t, tab.Demoted(k))
	assert.Equal(t, stmtstats.None, tab.Overran(k))
	assert.Equal(t, stmtstats.None, tab.Done(k, time.Hour, false))
	assert.Equal(t, stmtstats.Stat{}, tab.Stat())
	assert.Zero(t, tab.Threshold())
}

func TestChangeString(t *testing.T) {
	assert.Equal(t, "none demoted promoted Change(7)",
		fmt.Sprint(stmtstats.None, stmtstats.Demoted, stmtstats.Promoted, stmtstats.Change(7)))
}
