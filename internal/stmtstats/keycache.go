package stmtstats

import (
	"hash/maphash"
	"sync/atomic"
	"unsafe"
)

// The key cache: a service runs the same few texts over and over, most of them constants, which
// are the same string every call (the same bytes at the same address). Key remembers the keys of
// recent texts by that identity, so that a text seen before is not folded again: a hit costs a
// multiply and an atomic load, less than hashing the text did before folding.
//
// Identity is sound because an entry holds its string: while cached, its bytes cannot be freed
// and reused for another text, and Go strings do not change. (A string made with unsafe.String
// over bytes that are later changed breaks that rule; it would also break the keys of any map.)
//
// A text gets an entry only the second time its address is seen (a slot of seen remembers the
// last address that missed there), so texts built anew for every call, as ORMs that inline
// values build them, are folded each time and never allocate. Texts longer than
// keyCacheMaxLen are not cached, so the cache retains at most keyCacheSlots × keyCacheMaxLen
// bytes of text (1 MiB) beyond its own 16 KiB, and in practice almost none: constants live in the
// binary, and a string a caller keeps to run again is alive anyway. What it may keep alive is a
// text built per call whose address the allocator happened to reuse, until another text takes
// its slot.
const (
	keyCacheBits   = 10
	keyCacheSlots  = 1 << keyCacheBits
	keyCacheMaxLen = 1 << 10
)

type keyEntry struct {
	sql string
	key Key
}

type keyCache struct {
	slots [keyCacheSlots]atomic.Pointer[keyEntry]
	seen  [keyCacheSlots]atomic.Uintptr // address ^ length of the last miss in the slot; a number, not a reference
}

// slot returns the slot of the text at p with length n (Fibonacci hashing of the address).
func keySlot(p *byte, n int) (uint, uintptr) {
	a := uintptr(unsafe.Pointer(p))
	return uint((uint64(a) * 0x9E3779B97F4A7C15) >> (64 - keyCacheBits)), a ^ uintptr(n)
}

// key returns the cached key of sql, or folds it with seed (and caches it at its second miss).
func (c *keyCache) key(seed maphash.Seed, sql string) Key {
	fold := func(sql string) Key { return Key(foldHash(seed, sql)) }
	if len(sql) == 0 || len(sql) > keyCacheMaxLen {
		return fold(sql)
	}
	p := unsafe.StringData(sql)
	i, tag := keySlot(p, len(sql))
	if e := c.slots[i].Load(); e != nil && unsafe.StringData(e.sql) == p && len(e.sql) == len(sql) {
		return e.key
	}
	k := fold(sql)
	if c.seen[i].Swap(tag) == tag {
		c.slots[i].Store(&keyEntry{sql: sql, key: k})
	}
	return k
}
