package stmtstats_test

import (
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// The relative rule: a statement is demoted only when it is slow at least twice as often as all
// of the runs of the last window or two. When everything runs slow (a saturated server), no
// statement is "the slow one".
func TestRelativeRule(t *testing.T) {
	newRel := func(t *testing.T) *stmtstats.Table {
		tab, err := stmtstats.New(stmtstats.Config{Threshold: threshold, MinPeriod: -1})
		require.NoError(t, err)
		return tab
	}
	t.Run("one slow statement among fast lookups is demoted", func(t *testing.T) {
		tab := newRel(t)
		lookup, report := tab.Key("select v from items where id = $1"), tab.Key("select pg_sleep(1.5)")
		play(tab, lookup, strings100("f"))
		changes, _ := play(tab, report, "O")
		assert.Equal(t, []string{"0:demoted"}, changes)
	})
	t.Run("a saturated lane: the only statement, slow on every run, is never demoted", func(t *testing.T) {
		tab := newRel(t)
		k := tab.Key("select 1")
		changes, demoted := play(tab, k, "f"+strings100("s")+strings100("o")+strings100("s"))
		assert.Empty(t, changes)
		assert.False(t, demoted[len(demoted)-1])
	})
	t.Run("everything slow: none of the statements is demoted", func(t *testing.T) {
		tab := newRel(t)
		var keys []stmtstats.Key
		for i := range 10 {
			keys = append(keys, tab.Key(fmt.Sprintf("select c%d from t where id = $1", i)))
		}
		for _, k := range keys {
			play(tab, k, "f")
		}
		for range 100 {
			for _, k := range keys {
				c, _ := play(tab, k, "s")
				require.Empty(t, c)
			}
		}
		assert.Zero(t, tab.Stat().Demotions)
	})
	t.Run("the lane's hottest statement, slow in bursts: not demoted", func(t *testing.T) {
		tab := newRel(t)
		hot, other := tab.Key("select v from items where id = $1"), tab.Key("select name from users where id = $1")
		play(tab, hot, strings100("f"))
		for range 100 {
			// Mostly fast, with a burst of overruns now and then (a stall of the whole server).
			c, _ := play(tab, hot, "ffffffffffffffffff"+"ooo")
			require.Empty(t, c)
			play(tab, other, "ff")
		}
		assert.Zero(t, tab.Stat().Demotions)
		// The same bursts from a statement that is a small share of the runs do demote it.
		for range 50 {
			play(tab, other, "ffffffffffffffffffff")
		}
		c, _ := play(tab, hot, "ooo")
		// Its fraction was past 1/2 already (the last burst, held back): the first overrun demotes.
		assert.Equal(t, []string{"0:demoted"}, c)
	})
	t.Run("too few runs to compare: held back", func(t *testing.T) {
		tab := newRel(t)
		changes, _ := play(tab, tab.Key("select pg_sleep(1.5)"), "O")
		assert.Empty(t, changes)
	})
}

// When few runs end because one statement holds the lane's slots (a lock wait) while the other
// statements' calls keep arriving and time out, the statement is judged by its fraction; a
// saturated lane's hottest statement, a quiet lane, or a stall of every statement are not.
func TestRelativeRuleBlockedLane(t *testing.T) {
	newRel := func(t *testing.T) *stmtstats.Table {
		tab, err := stmtstats.New(stmtstats.Config{Threshold: threshold, MinPeriod: -1})
		require.NoError(t, err)
		return tab
	}
	arrive := func(tab *stmtstats.Table, k stmtstats.Key, n int) {
		for range n {
			tab.Arrive(k)
		}
	}
	t.Run("a proven statement that holds the lane while lookups wait: demoted", func(t *testing.T) {
		tab := newRel(t)
		lookup, locked := tab.Key("select v from items where id = $1"), tab.Key("update items set v = v + 1 where id = $1")
		play(tab, lookup, "ffff")
		play(tab, locked, "ff")  // proven fast; 6 runs in all: too few to compare
		arrive(tab, lookup, 400) // the lookups' calls wait and time out: no runs
		arrive(tab, locked, 8)
		changes, _ := play(tab, locked, "OOO") // three of its runs pass the threshold
		assert.Equal(t, []string{"2:demoted"}, changes)
	})
	t.Run("the same without arrivals reported: held back (too few runs)", func(t *testing.T) {
		tab := newRel(t)
		lookup, locked := tab.Key("select v from items where id = $1"), tab.Key("update items set v = v + 1 where id = $1")
		play(tab, lookup, "ffff")
		play(tab, locked, "ff")
		changes, _ := play(tab, locked, "OOOOOOOO")
		assert.Empty(t, changes)
	})
	t.Run("a saturated start: the lane's only statement, slow, is never demoted", func(t *testing.T) {
		tab := newRel(t)
		k := tab.Key("select 1")
		play(tab, k, "f")
		for range 50 {
			arrive(tab, k, 400)
			c, _ := play(tab, k, "OOOOOOOO")
			require.Empty(t, c)
		}
	})
	t.Run("a quiet lane: held back", func(t *testing.T) {
		tab := newRel(t)
		lookup, report := tab.Key("select v from items where id = $1"), tab.Key("select count(*) from items")
		play(tab, lookup, "ff")
		play(tab, report, "f")
		arrive(tab, lookup, 10)
		changes, _ := play(tab, report, "OOOO")
		assert.Empty(t, changes)
	})
	t.Run("a stall of every statement: none demoted", func(t *testing.T) {
		tab := newRel(t)
		var keys []stmtstats.Key
		for i := range 10 {
			k := tab.Key(fmt.Sprintf("select c%d from t where id = $1", i))
			keys = append(keys, k)
			play(tab, k, "f")
		}
		for range 5 {
			for _, k := range keys {
				arrive(tab, k, 40)
				c, _ := play(tab, k, "O")
				require.Empty(t, c)
			}
		}
		assert.Zero(t, tab.Stat().Demotions)
	})
}

func strings100(s string) string {
	b := make([]byte, 0, 100*len(s))
	for range 100 {
		b = append(b, s...)
	}
	return string(b)
}

// MinPeriod: a statement changes at most once per period, whatever its runs say.
func TestMinPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period = 10 * threshold
		tab, err := stmtstats.New(stmtstats.Config{Threshold: threshold, MinPeriod: period})
		require.NoError(t, err)
		stmtstats.NoRelative(tab)
		k := tab.Key("select v from items where id = $1")
		changes, _ := play(tab, k, "fsss")
		require.Equal(t, []string{"3:demoted"}, changes)
		changes, demoted := play(tab, k, strings100("f"))
		assert.Empty(t, changes, "fast at once: held demoted for the period")
		assert.True(t, demoted[len(demoted)-1])
		time.Sleep(period)
		changes, _ = play(tab, k, "f")
		assert.Equal(t, []string{"0:promoted"}, changes, "after the period, the next fast run promotes")
		changes, _ = play(tab, k, "sss"+strings100("s"))
		assert.Empty(t, changes, "slow at once again: held promoted for the period")
		time.Sleep(period)
		changes, _ = play(tab, k, "s")
		assert.Equal(t, []string{"0:demoted"}, changes)
		assert.Equal(t, uint64(2), tab.Stat().Demotions)
	})
}

// OnChange sees every change once, in order, even when many goroutines cause them. Each goroutine
// runs the statement slow in blocks of 8 (then 16 fast), so that changes happen however the
// goroutines interleave: one slow run in three, spread evenly, keeps the statement's fraction
// under the demotion mark, and once made the test see no change at all in a CI run.
func TestOnChangeInOrder(t *testing.T) {
	var mu sync.Mutex
	var seen []stmtstats.Change
	tab, err := stmtstats.New(stmtstats.Config{Threshold: threshold, MinPeriod: -1,
		OnChange: func(_ stmtstats.Key, c stmtstats.Change, sql string) {
			mu.Lock()
			seen = append(seen, c)
			mu.Unlock()
			assert.Equal(t, "select pg_sleep(?)", sql)
		}})
	require.NoError(t, err)
	stmtstats.NoRelative(tab)
	k := tab.Key("select pg_sleep(1)")
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 2000 {
				if (i/8+g)%3 == 0 {
					tab.DoneText(k, "select pg_sleep(?)", lockWait, false)
				} else {
					tab.DoneText(k, "select pg_sleep(?)", fastRun, false)
				}
			}
		})
	}
	wg.Wait()
	require.NotEmpty(t, seen)
	for i, c := range seen {
		want := stmtstats.Demoted
		if i%2 == 1 {
			want = stmtstats.Promoted
		}
		require.Equal(t, want, c, "change %d of %d", i, len(seen))
	}
	st := tab.Stat()
	assert.Equal(t, st.Demotions+st.Promotions, uint64(len(seen)))
}
