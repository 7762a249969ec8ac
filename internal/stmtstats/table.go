package stmtstats

import (
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultEntries is the number of entries of a Table whose Config.Entries is 0.
const DefaultEntries = 4096

// MaxEntries bounds Config.Entries: 8 MiB of entries.
const MaxEntries = 1 << 20

// Config configures a Table.
type Config struct {
	// Threshold is the run time from which a run counts as slow. Required. A run that lasts
	// Threshold or more, or that Overran reported, is slow. Choose it as the longest run the
	// short lane should hold a connection for, about 3 × the p99 of its lookups.
	Threshold time.Duration
	// Entries is the number of statements the Table can remember. 0 means DefaultEntries
	// (4096, 32 KiB), enough for the statements with a slow history of a service whose code
	// has some hundreds to a few thousand distinct statements. It is rounded up to a power of
	// two of at least 8. At most MaxEntries.
	Entries int
}

// Key identifies a statement in one Table. Keys of one Table mean nothing to another.
type Key uint64

// Change is what an observation did to its statement's classification.
type Change uint8

const (
	None     Change = iota // the classification did not change
	Demoted                // the statement is now slow: route it out of the short lane
	Promoted               // the statement was demoted and is fast again
)

func (c Change) String() string {
	switch c {
	case None:
		return "none"
	case Demoted:
		return "demoted"
	case Promoted:
		return "promoted"
	}
	return fmt.Sprintf("Change(%d)", uint8(c))
}

// An entry is one word:
//
//	bits 18..63  tag: the same bits of the statement's Key
//	bit  17      used: the entry holds a statement (a word without it is 0, free)
//	bit  16      ref: recently used, for eviction
//	bit  15      demoted
//	bits  0..14  f: the weighted fraction of slow runs, in units of 1/one
const (
	ways = 8 // entries per set: 64 bytes, one cache line

	fracMask   = 1<<15 - 1
	demotedBit = 1 << 15
	refBit     = 1 << 16
	usedBit    = 1 << 17
	tagShift   = 18

	one         = 1 << 14  // f = 1
	step        = one / 4  // α = 1/4
	demoteAt    = one / 2  // demote when f >= 1/2
	promoteAt   = one / 5  // promote when f <= 1/5 (3276/16384)
	forgetBelow = one / 64 // a statement not demoted with f below this gives its entry up
)

type set [ways]atomic.Uint64

// Table learns per statement whether it is slow. See the package documentation.
type Table struct {
	threshold time.Duration
	seed      maphash.Seed
	sets      []set
	mask      uint64 // len(sets) - 1

	demotions  atomic.Uint64
	promotions atomic.Uint64

	// mu serialises insertions, so that a statement never occupies two entries of its set.
	// Lookups and updates of an entry in place do not take it.
	mu             sync.Mutex
	evictions      uint64 // guarded by mu
	evictedDemoted uint64 // guarded by mu
}

// New returns an empty Table, or an error naming the Config field that is invalid.
func New(cfg Config) (*Table, error) {
	if cfg.Threshold <= 0 {
		return nil, fmt.Errorf("stmtstats: Config.Threshold must be positive, got %v", cfg.Threshold)
	}
	n := cfg.Entries
	switch {
	case n < 0 || n > MaxEntries:
		return nil, fmt.Errorf("stmtstats: Config.Entries must be between 0 and %d, got %d", MaxEntries, n)
	case n == 0:
		n = DefaultEntries
	case n < ways:
		n = ways
	}
	n = 1 << bits.Len(uint(n-1)) // round up to a power of two
	return &Table{
		threshold: cfg.Threshold,
		seed:      maphash.MakeSeed(),
		sets:      make([]set, n/ways),
		mask:      uint64(n/ways - 1),
	}, nil
}

// Threshold returns Config.Threshold: the caller reports a run still going after it with
// Overran.
func (t *Table) Threshold() time.Duration {
	if t == nil {
		return 0
	}
	return t.threshold
}

// Key returns the key of the statement with the given SQL text. It hashes the text and does not
// retain it.
func (t *Table) Key(sql string) Key {
	if t == nil {
		return 0
	}
	return Key(maphash.String(t.seed, sql))
}

// Demoted reports whether the statement is currently classified slow. A statement the Table
// does not know is not demoted.
func (t *Table) Demoted(k Key) bool {
	if t == nil {
		return false
	}
	s := &t.sets[uint64(k)&t.mask]
	i, w := s.find(k)
	if i < 0 {
		return false
	}
	if w&refBit == 0 {
		s[i].CompareAndSwap(w, w|refBit) // a hint: if the word changed meanwhile, so be it
	}
	return w&demotedBit != 0
}

// Overran records that a run of the statement is still going after Threshold: it counts as one
// slow run now. Call it at most once per run, and pass overran = true to that run's Done.
func (t *Table) Overran(k Key) Change {
	if t == nil {
		return None
	}
	return t.observe(k, true)
}

// Done records that a run of the statement ended after d. If overran is true the run was
// already counted by Overran and Done changes nothing, whatever d is; otherwise the run counts
// as slow if d >= Threshold and as fast if not.
func (t *Table) Done(k Key, d time.Duration, overran bool) Change {
	if t == nil || overran {
		return None
	}
	return t.observe(k, d >= t.threshold)
}

// observe counts one run of the statement.
func (t *Table) observe(k Key, slow bool) Change {
	s := &t.sets[uint64(k)&t.mask]
	for {
		i, w := s.find(k)
		if i < 0 {
			if !slow {
				return None // an absent statement is one with no slow history: nothing to learn
			}
			if t.insert(s, k) {
				return None // one slow run never demotes
			}
			continue // inserted by someone else meanwhile: update it
		}
		nw, c := next(w, slow)
		if nw == w || s[i].CompareAndSwap(w, nw) {
			switch c {
			case Demoted:
				t.demotions.Add(1)
			case Promoted:
				t.promotions.Add(1)
			}
			return c
		}
	}
}

// next returns the entry w after one more run, and the change it makes.
func next(w uint64, slow bool) (uint64, Change) {
	f := w & fracMask
	f -= f >> 2
	if slow {
		f += step
	}
	nw := w&^fracMask | f | refBit
	demoted := w&demotedBit != 0
	switch {
	case !demoted && f >= demoteAt:
		return nw | demotedBit, Demoted
	case demoted && f <= promoteAt:
		return nw &^ demotedBit, Promoted
	case !demoted && f < forgetBelow:
		return 0, None
	}
	return nw, None
}

// insert adds the statement to its set after a first slow run, evicting an entry if the set is
// full. It returns false, inserting nothing, if the statement is already in the set.
func (t *Table) insert(s *set, k Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		// Only insert adds statements, and it holds mu: k cannot appear after this check.
		if i, _ := s.find(k); i >= 0 {
			return false
		}
		v, old := s.victim()
		if !s[v].CompareAndSwap(old, uint64(k)>>tagShift<<tagShift|usedBit|refBit|step) {
			continue // the victim was updated or freed meanwhile: choose again
		}
		if old != 0 {
			t.evictions++
			if old&demotedBit != 0 {
				t.evictedDemoted++
			}
			if old&refBit != 0 {
				s.clearRefs(v) // every candidate was recently used: start a new round
			}
		}
		return true
	}
}

// find returns the index and word of the statement's entry, or -1.
func (s *set) find(k Key) (int, uint64) {
	for i := range s {
		if w := s[i].Load(); w&usedBit != 0 && (w^uint64(k))>>tagShift == 0 {
			return i, w
		}
	}
	return -1, 0
}

// victim returns the entry to replace: a free one, else the first in the order of the package
// documentation (not demoted before demoted, not recently used before recently used, lowest f).
func (s *set) victim() (int, uint64) {
	best, bestW, bestScore := 0, uint64(0), uint64(1<<64-1)
	for i := range s {
		w := s[i].Load()
		if w == 0 {
			return i, 0
		}
		score := w & fracMask
		if w&refBit != 0 {
			score |= 1 << 15
		}
		if w&demotedBit != 0 {
			score |= 1 << 16
		}
		if score < bestScore {
			best, bestW, bestScore = i, w, score
		}
	}
	return best, bestW
}

// clearRefs clears the recently-used bit of every entry but skip. A bit set again meanwhile
// stays set.
func (s *set) clearRefs(skip int) {
	for i := range s {
		if w := s[i].Load(); i != skip && w&refBit != 0 {
			s[i].CompareAndSwap(w, w&^refBit)
		}
	}
}
