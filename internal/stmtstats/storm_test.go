package stmtstats_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// run is one run of a statement as a caller drives it: classify, arm the Overran timer, run for
// d, report. It returns the changes it caused and whether the statement was demoted when the
// run was classified.
func run(tab *stmtstats.Table, k stmtstats.Key, d time.Duration, changes chan<- stmtstats.Change) (demoted bool) {
	demoted = tab.Demoted(k)
	start := time.Now()
	timer := time.AfterFunc(tab.Threshold(), func() { changes <- tab.Overran(k) })
	time.Sleep(d)
	changes <- tab.Done(k, time.Since(start), !timer.Stop())
	return demoted
}

// Twelve clients start the same 1.5 s statement at once. The statement is demoted when the runs
// pass the threshold, on their Overran reports alone, long before the first of them ends.
func TestStormDemotesOnOverruns(t *testing.T) {
	for _, history := range []int{0, 1000} {
		t.Run(map[int]string{0: "new statement", 1000: "after 1000 fast runs"}[history], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tab := newTable(t, 0)
				k := tab.Key("select pg_sleep(1.5)")
				play(tab, k, strings.Repeat("f", history))

				start := time.Now()
				changes := make(chan stmtstats.Change, 2*12)
				var demotedAt atomic.Int64
				var wg sync.WaitGroup
				for range 12 {
					wg.Go(func() {
						assert.False(t, run(tab, k, 1500*time.Millisecond, changes), "classified before the storm was seen")
					})
				}
				// Record when the demotion happened, in the bubble's clock.
				go func() {
					for range 12 {
						if <-changes == stmtstats.Demoted {
							demotedAt.Store(int64(time.Since(start)))
						}
					}
				}()
				time.Sleep(threshold + time.Millisecond)
				synctest.Wait()
				assert.True(t, tab.Demoted(k), "demoted while all twelve runs are still in flight")
				assert.Equal(t, int64(threshold), demotedAt.Load(), "demoted at the threshold")
				wg.Wait()
				close(changes)
				var rest []stmtstats.Change
				for c := range changes {
					rest = append(rest, c)
				}
				assert.Equal(t, make([]stmtstats.Change, 12), rest, "the twelve Done calls count nothing again")
				st := tab.Stat()
				assert.Equal(t, uint64(1), st.Demotions)
				assert.Equal(t, 1, st.Demoted)
			})
		})
	}
}

// A lookup that runs all the time waits once on a row lock; the other runs go on meanwhile.
// It stays in the short lane.
func TestLockWaitDoesNotDemote(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tab := newTable(t, 0)
		k := tab.Key("select name from users where id = $1")
		changes := make(chan stmtstats.Change, 10000)
		var wg sync.WaitGroup
		wg.Go(func() { run(tab, k, lockWait, changes) })
		for range 4 {
			wg.Go(func() {
				for range 500 {
					assert.False(t, run(tab, k, fastRun, changes))
				}
			})
		}
		wg.Wait()
		close(changes)
		for c := range changes {
			require.Equal(t, stmtstats.None, c)
		}
		assert.False(t, tab.Demoted(k))
	})
}

// The first slow runs of a new statement arrive at once, in a full set: the statement gets one
// entry, and is demoted once.
func TestConcurrentFirstRunsInsertOnce(t *testing.T) {
	for range 500 {
		tab := newTable(t, 8)
		for i := range 8 {
			play(tab, tab.Key(fmt.Sprintf("cold_%d", i)), "f")
		}
		k := tab.Key("select pg_sleep(1.5)")
		start := make(chan struct{})
		var demotions atomic.Int32
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				<-start
				if tab.Overran(k) == stmtstats.Demoted {
					demotions.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		st := tab.Stat()
		require.Equal(t, 8, st.Tracked)
		require.Equal(t, uint64(1), st.Evictions, "one entry per statement")
		require.Equal(t, int32(1), demotions.Load())
		require.Equal(t, uint64(1), st.Demotions)
	}
}
