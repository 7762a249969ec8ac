package stmtstats_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// A text is cached by identity at its second call, and its cached key is the folded one: the
// same as the key of a copy of the text at another address, which is folded.
func TestKeyCacheByIdentity(t *testing.T) {
	tab := newTable(t, 0)
	const s = "select name from users where id = 42"
	first := tab.Key(s)
	assert.False(t, stmtstats.Cached(tab, s), "cached at its first call")
	assert.Equal(t, first, tab.Key(s))
	require.True(t, stmtstats.Cached(tab, s), "not cached at its second call")
	assert.Equal(t, first, tab.Key(s), "the cached key")

	clone := strings.Clone(s)
	assert.False(t, stmtstats.Cached(tab, clone), "a copy is another string")
	assert.Equal(t, first, tab.Key(clone), "a copy folds to the same key")
	assert.Equal(t, first, tab.Key("select  name from users where id = 7"), "literals still fold")
	assert.NotEqual(t, first, tab.Key("select name from users where email = 42"))

	long := "select " + strings.Repeat("c, ", 400) + "c from t"
	tab.Key(long)
	tab.Key(long)
	assert.False(t, stmtstats.Cached(tab, long), "a text over 1 KiB is not retained")
}

// Texts built anew for every call are folded every time and never allocate; a constant is
// cached and then costs nothing to key.
func TestKeyCacheAllocations(t *testing.T) {
	tab := newTable(t, 0)
	texts := make([]string, 4096)
	for i := range texts {
		texts[i] = fmt.Sprintf("select * from t where id = %d", i)
	}
	i := 0
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		tab.Key(texts[i%len(texts)])
		i++
	}), "a new text each call")
	const s = "select 1"
	assert.Zero(t, testing.AllocsPerRun(1000, func() { tab.Key(s) }), "a cached text")
}

// Many goroutines keying the same and different strings: every key is the folded key, whatever
// the cache holds at the time (run with -race).
func TestKeyCacheConcurrent(t *testing.T) {
	tab := newTable(t, 0)
	ref := newTable(t, 0) // keys of copies: never from a cache hit of the same string
	texts := make([]string, 3000)
	want := make([]stmtstats.Key, len(texts))
	for i := range texts {
		texts[i] = fmt.Sprintf("select c%d from t where id = %d", i%50, i)
		want[i] = tab.Key(strings.Clone(texts[i]))
		require.Equal(t, ref.Key(texts[i]), ref.Key(strings.Clone(texts[i])))
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for j := range 20000 {
				k := (g*7919 + j*31) % len(texts)
				if got := tab.Key(texts[k]); got != want[k] {
					t.Errorf("text %d: key %x, want %x", k, got, want[k])
					return
				}
			}
		})
	}
	wg.Wait()
}

// A service with a thousand constant statements keeps nearly all of them cached: each is folded
// at its first two calls, not at every call. (The direct-mapped cache of 1,024 slots this
// replaced kept 609 of them here: texts that shared a slot evicted each other at every call.)
func TestKeyCacheHoldsManyStatements(t *testing.T) {
	tab := newTable(t, 0)
	texts := make([]string, 1024)
	for i := range texts {
		texts[i] = fmt.Sprintf("select c from t%d where id = $1", i)
	}
	for range 3 { // every text at least twice, round robin as a busy service runs them
		for _, s := range texts {
			tab.Key(s)
		}
	}
	cached := 0
	for _, s := range texts {
		if stmtstats.Cached(tab, s) {
			cached++
		}
	}
	t.Logf("%d of %d statements cached", cached, len(texts))
	assert.GreaterOrEqual(t, cached, len(texts)*95/100)
}
