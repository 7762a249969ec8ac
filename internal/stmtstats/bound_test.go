package stmtstats_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// A default Table's 4096 entries take 32 KiB of heap, its identity cache 104 KiB and its content
// cache 52 KiB. Feeding it statements must not add to that beyond noise (the runtime's and the
// test framework's own allocations, seen up to 6 KiB) and the caches' entries: a text built per
// call is cached by identity when the allocator reuses the address of one seen before, at most
// 4,096 entries of 32 B holding texts of 32 B here, and by content when the same text comes
// twice, at most 2,048 entries of 16 B.
const (
	tableBound  = 208 << 10
	growthBound = 16<<10 + 4096*64 + 2048*16
)

// A million distinct statements, each fast once and slow once and one in 5000 demoted, leave the heap as
// large as the empty Table did, and every demoted statement is still demoted.
func TestMemoryBound(t *testing.T) {
	const n, demoteEvery = 1_000_000, 5000
	text := func(buf []byte, i int) []byte {
		return strconv.AppendInt(append(buf[:0], "select * from t"...), int64(i), 10)
	}
	buf := make([]byte, 0, 64)

	before := heapAlloc()
	tab := newTable(t, 0)
	empty := heapAlloc()
	for i := range n {
		buf = text(buf, i)
		k := tab.Key(string(buf))
		tab.Demoted(k)
		tab.Done(k, fastRun, false)
		tab.Overran(k)
		tab.Done(k, lockWait, true)
		if i%demoteEvery == 0 {
			play(tab, k, "ss")
		}
	}
	after := heapAlloc()
	runtime.KeepAlive(tab)
	t.Logf("heap: empty Table %d B (bound %d), %d statements added %d B (bound %d)",
		empty-before, tableBound, n, after-empty, growthBound)
	assert.Less(t, empty-before, int64(tableBound))
	assert.Less(t, after-empty, int64(growthBound))

	st := tab.Stat()
	assert.Equal(t, stmtstats.DefaultEntries, st.Tracked)
	assert.Equal(t, n/demoteEvery, st.Demoted)
	assert.Zero(t, st.EvictedDemoted)
	assert.Equal(t, uint64(n-stmtstats.DefaultEntries), st.Evictions)
	for i := 0; i < n; i += demoteEvery {
		require.True(t, tab.Demoted(tab.Key(string(text(buf, i)))), "statement %d", i)
	}
}

func heapAlloc() int64 {
	var m runtime.MemStats
	runtime.GC() // twice: the first only moves sync.Pool caches to their victim caches
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func TestNoAllocations(t *testing.T) {
	tab := newTable(t, 64)
	sqls := make([]string, 1000)
	for i := range sqls {
		sqls[i] = fmt.Sprintf("select name from users%d where id = $1", i)
	}
	i := 0
	allocs := testing.AllocsPerRun(10000, func() {
		k := tab.Key(sqls[i%len(sqls)]) // 1000 statements in 64 entries: inserts and evictions
		i++
		tab.Demoted(k)
		tab.Done(k, fastRun, false)
		tab.Done(k, lockWait, false) // insert
		tab.Overran(k)
		tab.Done(k, lockWait, true)
		tab.Done(k, lockWait, false) // demote
		for range 4 {
			tab.Done(k, fastRun, false) // promote
		}
	})
	assert.Zero(t, allocs)
	st := tab.Stat()
	assert.NotZero(t, st.Evictions, "the insert path was measured")
	assert.NotZero(t, st.Demotions, "the demotion path was measured")
	assert.NotZero(t, st.Promotions, "the promotion path was measured")
}

// stressDuration is PGXLANES_STRESS (a Go duration), default 2s.
func stressDuration(t *testing.T) time.Duration {
	if v := os.Getenv("PGXLANES_STRESS"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "PGXLANES_STRESS")
		return d
	}
	return 2 * time.Second
}

// Goroutines run random statements, each with its own share of slow runs, and count the changes
// they are returned. Stat's counters must equal those counts, and every demotion that is not
// undone by a promotion must be visible, or accounted for by an eviction.
func TestStress(t *testing.T) {
	const goroutines, statements = 32, 64
	for _, entries := range []int{16, 4096} { // 16: constant eviction; 4096: none
		t.Run(fmt.Sprintf("Entries=%d", entries), func(t *testing.T) {
			tab := newTable(t, entries)
			keys := make([]stmtstats.Key, statements)
			for i := range keys {
				keys[i] = tab.Key(fmt.Sprintf("statement_%d", i))
			}
			type count struct{ demotions, promotions [statements]uint64 }
			counts := make([]count, goroutines)
			deadline := time.Now().Add(stressDuration(t))
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					record := func(i int, c stmtstats.Change) {
						switch c {
						case stmtstats.Demoted:
							counts[g].demotions[i]++
						case stmtstats.Promoted:
							counts[g].promotions[i]++
						}
					}
					for n := 0; n%256 != 0 || time.Now().Before(deadline); n++ {
						i := rng.IntN(statements)
						k := keys[i]
						tab.Demoted(k)
						slow := rng.IntN(statements) < i // statement i is slow with probability i/64
						switch {
						case !slow:
							record(i, tab.Done(k, fastRun, false))
						case rng.IntN(2) == 0:
							record(i, tab.Done(k, lockWait, false))
						default:
							record(i, tab.Overran(k))
							record(i, tab.Done(k, lockWait, true))
						}
						if n%1024 == 0 {
							st := tab.Stat()
							assert.LessOrEqual(t, st.Tracked, st.Entries)
							assert.LessOrEqual(t, st.Demoted, st.Tracked)
						}
					}
				})
			}
			wg.Wait()

			var demotions, promotions uint64
			for i := range statements {
				var d, p uint64
				for g := range counts {
					d += counts[g].demotions[i]
					p += counts[g].promotions[i]
				}
				demotions, promotions = demotions+d, promotions+p
				if entries == 4096 {
					// No evictions: a statement's changes alternate, starting with a demotion.
					want := uint64(0)
					if tab.Demoted(keys[i]) {
						want = 1
					}
					assert.Equal(t, want, d-p, "statement %d: %d demotions, %d promotions", i, d, p)
				}
			}
			st := tab.Stat()
			t.Logf("%+v", st)
			assert.Equal(t, demotions, st.Demotions)
			assert.Equal(t, promotions, st.Promotions)
			assert.Equal(t, uint64(st.Demoted), st.Demotions-st.Promotions-st.EvictedDemoted)
			assert.NotZero(t, st.Promotions, "the stress reached promotions")
			if entries == 4096 {
				assert.Zero(t, st.Evictions)
			} else {
				assert.NotZero(t, st.Evictions)
			}
		})
	}
}
