package stmtstats

import (
	"hash/maphash"
	"sync/atomic"
	"unsafe"
)

// The key cache: a service runs the same texts over and over, most of them constants, which are
// the same string every call (the same bytes at the same address). Key remembers the keys of
// recent texts by that identity, so that a text seen before is not folded again: a hit costs a
// multiply and a few atomic loads, less than hashing the text did before folding.
//
// Identity is sound because an entry holds its string: while cached, its bytes cannot be freed
// and reused for another text, and Go strings do not change. (A string made with unsafe.String
// over bytes that are later changed breaks that rule; it would also break the keys of any map.)
//
// The cache is 4-way set-associative: 1,024 sets of 4 entries, the set chosen by the text's
// address. A direct-mapped cache of 1,024 slots kept only about 60 % of 1,024 constants: texts
// that shared a slot evicted each other, and were folded at every call. Four ways keep almost
// all of them, and 4,096 entries leave room for services with thousands of statements.
//
// A text gets an entry only the second time its address is seen (each set remembers the
// addresses of its last four misses), so texts built anew for every call are not cached by
// identity: the content cache below knows those that are the same text every time, and those
// whose literals change on every call, as ORMs that inline values build them, are folded each
// time and never allocate. Texts longer than keyCacheMaxLen are not cached by identity (only by
// content, which holds no text), so the cache retains at most keyCacheSets × keyCacheWays ×
// keyCacheMaxLen bytes of text (4 MiB) beyond its own 104 KiB, and in practice almost none:
// constants live in the binary, and a string a caller keeps to run again is alive anyway. What
// it may keep alive is a text built per call whose address the allocator happened to reuse,
// until another text takes its entry.
const (
	keyCacheBits   = 10
	keyCacheSets   = 1 << keyCacheBits
	keyCacheWays   = 4
	keyCacheMaxLen = 1 << 10
)

type keyEntry struct {
	sql string
	key Key
}

// keySet is one set of the cache (104 bytes). tags[w] is the tag (address ^ length) of
// ents[w], a hint that saves reading entries that cannot match: an entry is used only once its
// own string is checked. seen holds the tags of the set's last misses (numbers, not references),
// a ring whose next place is seenAt; an insert replaces ents[putAt % keyCacheWays].
type keySet struct {
	tags   [keyCacheWays]atomic.Uintptr
	ents   [keyCacheWays]atomic.Pointer[keyEntry]
	seen   [keyCacheWays]atomic.Uintptr
	seenAt atomic.Uint32
	putAt  atomic.Uint32
}

type keyCache struct {
	sets      [keyCacheSets]keySet
	content   [contentSets]contentSet
	noContent bool // for benchmarks of the fold: the content cache is not used
}

// The content cache: a text built anew for every call, at a new address, is not found by
// identity, and most such texts are the same text every time (an ORM or a query builder that
// builds "select ... where id = $1" per call). The content cache keeps the keys of such texts by
// a plain hash of their bytes, so that one costs a hash, as its key did before folding, rather
// than a fold. A text whose literals change with every call misses it, and is folded.
//
// It is 4-way set-associative too, 512 sets (2,048 texts), the set chosen by the hash. An entry
// holds the hash and the key, not the text: a text is taken for another only when their 64-bit
// seeded hashes collide, far less often than two statements share a Table entry (44 bits). As in
// the identity cache, a hash gets an entry only the second time it misses (each set remembers
// its last four misses), so texts that differ on every call never allocate and never evict the
// texts that repeat. At most 52 KiB for the sets and 32 KiB of entries.
const (
	contentBits = 9
	contentSets = 1 << contentBits
)

type contentEntry struct {
	hash uint64
	key  Key
}

// contentSet is one set of the content cache: tags[w] is ents[w]'s hash, a hint as in keySet.
type contentSet struct {
	tags   [keyCacheWays]atomic.Uint64
	ents   [keyCacheWays]atomic.Pointer[contentEntry]
	seen   [keyCacheWays]atomic.Uint64
	seenAt atomic.Uint32
	putAt  atomic.Uint32
}

// contentHash is the content cache's hash of sql (never 0, the empty tag), and its set.
func contentHash(seed maphash.Seed, sql string) (uint64, uint) {
	h := maphash.String(seed, sql) | 1
	return h, uint(h >> (64 - contentBits))
}

// lookup returns the entry of the text with hash h, or nil.
func (s *contentSet) lookup(h uint64) *contentEntry {
	for w := range keyCacheWays {
		if s.tags[w].Load() != h {
			continue
		}
		if e := s.ents[w].Load(); e != nil && e.hash == h {
			return e
		}
	}
	return nil
}

// byContent returns the key of sql from the content cache, or folds it (and, if mayCache,
// caches it at its second miss).
func (c *keyCache) byContent(seed maphash.Seed, sql string, mayCache bool) Key {
	if c.noContent {
		return Key(foldHash(seed, sql))
	}
	h, i := contentHash(seed, sql)
	s := &c.content[i]
	if e := s.lookup(h); e != nil {
		return e.key
	}
	k := Key(foldHash(seed, sql))
	if !mayCache {
		return k
	}
	for w := range keyCacheWays {
		if s.seen[w].Load() == h && s.seen[w].CompareAndSwap(h, 0) {
			way := s.putAt.Add(1) % keyCacheWays
			s.ents[way].Store(&contentEntry{hash: h, key: k})
			s.tags[way].Store(h)
			return k
		}
	}
	s.seen[s.seenAt.Add(1)%keyCacheWays].Store(h)
	return k
}

// keySlot returns the set of the text at p with length n (Fibonacci hashing of the address),
// and its tag.
func keySlot(p *byte, n int) (uint, uintptr) {
	a := uintptr(unsafe.Pointer(p))
	return uint((uint64(a) * 0x9E3779B97F4A7C15) >> (64 - keyCacheBits)), a ^ uintptr(n)
}

// lookup returns the entry of the text at p with length n, or nil.
func (s *keySet) lookup(p *byte, n int, tag uintptr) *keyEntry {
	for w := range keyCacheWays {
		if s.tags[w].Load() != tag {
			continue
		}
		if e := s.ents[w].Load(); e != nil && unsafe.StringData(e.sql) == p && len(e.sql) == n {
			return e
		}
	}
	return nil
}

// key returns the cached key of sql, or folds it with seed (and caches it at its second miss).
func (c *keyCache) key(seed maphash.Seed, sql string) Key {
	if len(sql) == 0 {
		return Key(foldHash(seed, sql))
	}
	if len(sql) > keyCacheMaxLen {
		return c.byContent(seed, sql, true) // not retained: known by content alone
	}
	p := unsafe.StringData(sql)
	i, tag := keySlot(p, len(sql))
	s := &c.sets[i]
	if e := s.lookup(p, len(sql), tag); e != nil {
		return e.key
	}
	for w := range keyCacheWays {
		if s.seen[w].Load() == tag && s.seen[w].CompareAndSwap(tag, 0) {
			// Seen before: cache it (by identity only: a constant would take a place in the
			// content cache it never uses). The entry goes in before its tag, so that a lookup
			// that finds the tag finds the entry (or an older one, which its check refuses).
			k := c.byContent(seed, sql, false)
			way := s.putAt.Add(1) % keyCacheWays
			s.ents[way].Store(&keyEntry{sql: sql, key: k})
			s.tags[way].Store(tag)
			return k
		}
	}
	// Remembered for its second call, even when its content is known: a constant whose
	// content the other cache took (its first two calls fell too far apart for this set to
	// remember the first) must still come here, where its key costs no hash.
	s.seen[s.seenAt.Add(1)%keyCacheWays].Store(tag)
	return c.byContent(seed, sql, true)
}
