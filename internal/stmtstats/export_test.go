package stmtstats

import (
	"hash/maphash"
	"unsafe"
)

// NoRelative turns the relative rule off, for tests of the fraction alone.
func NoRelative(t *Table) { t.relativeDisabledTest = true }

// Cached reports whether the Table's key cache holds sql (by identity).
func Cached(t *Table, sql string) bool {
	if len(sql) == 0 {
		return false
	}
	i, tag := keySlot(unsafe.StringData(sql), len(sql))
	return t.keys.sets[i].lookup(unsafe.StringData(sql), len(sql), tag) != nil
}

// ContentCached reports whether the Table's content cache holds the key of sql's text.
func ContentCached(t *Table, sql string) bool {
	h, i := contentHash(t.seed, sql)
	return t.keys.content[i].lookup(h) != nil
}

// ForgetSeen empties the identity cache's record of misses in sql's set, as four misses of
// other texts in that set would.
func ForgetSeen(t *Table, sql string) {
	i, _ := keySlot(unsafe.StringData(sql), len(sql))
	for w := range keyCacheWays {
		t.keys.sets[i].seen[w].Store(0)
	}
}

// NoContentCache turns the content cache off, for benchmarks of the fold behind it.
func NoContentCache(t *Table) { t.keys.noContent = true }

// KeyBenchTexts and CopiesOf are the benchmarks' texts and their copies (foldref_fuzz_test.go).
var (
	KeyBenchTexts = keyBenchTexts
	CopiesOf      = copiesOf
)

// FoldHash is the key's hash of sql with seed, before the key cache.
func FoldHash(seed maphash.Seed, sql string) uint64 { return foldHash(seed, sql) }
