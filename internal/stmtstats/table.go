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
	// (4096, 32 KiB), enough for the statements of a service whose code has some hundreds to a
	// few thousand distinct statements (texts that differ only in literals are one). It is
	// rounded up to a power of two of at least 8. At most MaxEntries.
	Entries int
	// MinPeriod is the least time between two changes of one statement: a statement demoted
	// stays demoted at least this long, and one promoted stays promoted at least this long, so
	// that no statement flaps faster than one cycle per 2 × MinPeriod. 0 means 10 × Threshold,
	// within [1s, 1m]; negative means none (for tests).
	MinPeriod time.Duration
	// OnChange, if set, is called for every Demoted and Promoted change, with the Table's mutex
	// held: calls come one at a time, in the order of the changes. sql is the text the caller
	// passed with the observation that caused it (OverranText, DoneText), "" otherwise. It must
	// be quick and must not call the Table.
	OnChange func(k Key, c Change, sql string)
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

// Class is what the Table knows of a statement, for routing.
type Class uint8

const (
	Unproven Class = iota // no fast run on record: on probation
	Proven                // at least one fast run on record, and not demoted
	Slow                  // demoted: route it out of the short lane
)

func (c Class) String() string {
	switch c {
	case Unproven:
		return "unproven"
	case Proven:
		return "proven"
	case Slow:
		return "slow"
	}
	return fmt.Sprintf("Class(%d)", uint8(c))
}

// An entry is one word:
//
//	bits 29..63  tag: the same bits of the statement's Key
//	bit  28      used: the entry holds a statement (a word without it is 0, free)
//	bit  27      ref: recently used, for eviction
//	bit  26      demoted
//	bit  25      proven: a fast run is on record
//	bits 13..24  at: when the statement last changed, in ticks of MinPeriod/8 (mod 4096)
//	bits  0..12  f: the weighted fraction of slow runs, in units of 1/one
const (
	ways = 8 // entries per set: 64 bytes, one cache line

	fracMask   = 1<<13 - 1
	atShift    = 13
	atMask     = 1<<12 - 1
	provenBit  = 1 << 25
	demotedBit = 1 << 26
	refBit     = 1 << 27
	usedBit    = 1 << 28
	tagShift   = 29

	one       = 1 << 12 // f = 1
	step      = one / 4 // α = 1/4
	demoteAt  = one / 2 // demote when f >= 1/2
	promoteAt = one / 5 // promote when f <= 1/5 (819/4096)

	ticksPerPeriod = 8 // a change needs at least this many ticks since the last one

	// minRuns: below this many runs in the last window or two, the relative rule cannot tell a
	// statement from the rest of the lane, and it holds a demotion back.
	minRuns = 16
)

type set [ways]atomic.Uint64

// Table learns per statement whether it is slow. See the package documentation.
type Table struct {
	threshold time.Duration
	seed      maphash.Seed
	sets      []set
	mask      uint64 // len(sets) - 1
	tick      int64  // nanoseconds per tick of an entry's at field; 0: no MinPeriod
	window    int64  // nanoseconds, max(Threshold, 1s): the relative rule looks at the runs of the last one or two
	onChange  func(Key, Change, string)
	keys      keyCache
	epoch     time.Time // ticks and windows count from here (monotonic)

	demotions  atomic.Uint64
	promotions atomic.Uint64

	// runs and slowRuns count every observation since New; the window marks are their values
	// when the current window (cur) and the one before it (prev) began. Only roll, under mu,
	// moves the marks; readers load them without it (a window read across a roll is off by
	// at most one window's runs).
	runs, slowRuns atomic.Uint64
	// sample holds the keys (| 1, so that none is 0) of one run in sampleEvery, the last
	// len(sample) of them: which statements Short runs most.
	sample             [16]atomic.Uint64
	winStart           atomic.Int64 // ns since epoch when the current window began
	prevRuns, prevSlow atomic.Uint64
	curRuns, curSlow   atomic.Uint64
	// arrivals counts the calls reported by Arrive: every call, whether it ran or waited or timed
	// out, so that a lane whose slots one statement holds is not mistaken for an idle one.
	// prevArr and curArr are its marks at the windows' starts (moved by roll, as the others).
	// arrSample holds the keys (| 1) of one arrival in sampleEvery, the last len of them: which
	// statements the lane is asked for most; slowSample those of the last slow runs.
	arrivals             atomic.Uint64
	prevArr, curArr      atomic.Uint64
	arrSample            [16]atomic.Uint64
	slowSample           [16]atomic.Uint64
	minRunsForRelative   uint64
	relativeDisabledTest bool // export_test.go: the rule off, for tests of the fraction alone

	// mu serialises insertions, so that a statement never occupies two entries of its set, and
	// changes, so that OnChange sees them in order. Lookups and updates of an entry in place
	// that change no classification do not take it.
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
	mp := cfg.MinPeriod
	if mp == 0 {
		mp = min(max(10*cfg.Threshold, time.Second), time.Minute)
	}
	t := &Table{
		threshold:          cfg.Threshold,
		seed:               maphash.MakeSeed(),
		sets:               make([]set, n/ways),
		mask:               uint64(n/ways - 1),
		window:             int64(max(cfg.Threshold, time.Second)),
		onChange:           cfg.OnChange,
		epoch:              time.Now(),
		minRunsForRelative: minRuns,
	}
	if mp > 0 {
		t.tick = max(int64(mp)/ticksPerPeriod, 1)
	}
	return t, nil
}

// Threshold returns Config.Threshold: the caller reports a run still going after it with
// Overran.
func (t *Table) Threshold() time.Duration {
	if t == nil {
		return 0
	}
	return t.threshold
}

// Key returns the key of the statement with the given SQL text: a hash of the text with its
// literals, comments and redundant whitespace folded (see Fold). A text seen before at the same
// address (a constant, or a string the caller keeps) is not folded again: the Table caches the
// keys of up to 4,096 texts of up to 1 KiB by identity, and retains those texts (keycache.go).
// Nor is a text built anew for each call that is the same text each time: the Table caches the
// keys of up to 2,048 such texts by a plain hash of their content, without the texts. It
// allocates only when it caches a text, at the second call with that string or that content.
func (t *Table) Key(sql string) Key {
	if t == nil {
		return 0
	}
	return t.keys.key(t.seed, sql)
}

// Classify returns what the Table knows of the statement, and marks its entry recently used.
// A statement the Table does not know is Unproven.
func (t *Table) Classify(k Key) Class {
	if t == nil {
		return Proven
	}
	s := &t.sets[uint64(k)&t.mask]
	i, w := s.find(k)
	if i < 0 {
		return Unproven
	}
	if w&refBit == 0 {
		s[i].CompareAndSwap(w, w|refBit) // a hint: if the word changed meanwhile, so be it
	}
	switch {
	case w&demotedBit != 0:
		return Slow
	case w&provenBit != 0:
		return Proven
	}
	return Unproven
}

// Arrive records a call of the statement in the lane, before it waits for a slot, and returns
// Classify(k). A caller that reports every call with Arrive lets the relative rule judge a lane
// whose runs have stopped because one statement holds its slots (see relative); one that does
// not gets the rule over completed runs alone.
func (t *Table) Arrive(k Key) Class {
	if t == nil {
		return Proven
	}
	if n := t.arrivals.Add(1); n%sampleEvery == 0 {
		t.arrSample[n/sampleEvery%uint64(len(t.arrSample))].Store(uint64(k) | 1)
	}
	return t.Classify(k)
}

// Demoted reports whether the statement is currently classified slow. A statement the Table
// does not know is not demoted.
func (t *Table) Demoted(k Key) bool { return t.Classify(k) == Slow }

// Overran records that a run of the statement is still going after Threshold: it counts as one
// slow run now. Call it at most once per run, and pass overran = true to that run's Done.
func (t *Table) Overran(k Key) Change { return t.OverranText(k, "") }

// OverranText is Overran, with the statement's text for OnChange.
func (t *Table) OverranText(k Key, sql string) Change {
	if t == nil {
		return None
	}
	return t.observe(k, true, sql)
}

// Done records that a run of the statement ended after d. If overran is true the run was
// already counted by Overran and Done changes nothing, whatever d is; otherwise the run counts
// as slow if d >= Threshold and as fast if not.
func (t *Table) Done(k Key, d time.Duration, overran bool) Change {
	return t.DoneText(k, "", d, overran)
}

// DoneText is Done, with the statement's text for OnChange.
func (t *Table) DoneText(k Key, sql string, d time.Duration, overran bool) Change {
	if t == nil || overran {
		return None
	}
	return t.observe(k, d >= t.threshold, sql)
}

// observe counts one run of the statement.
func (t *Table) observe(k Key, slow bool, sql string) Change {
	r := t.runs.Add(1)
	if slow {
		n := t.slowRuns.Add(1)
		t.slowSample[n%uint64(len(t.slowSample))].Store(uint64(k) | 1)
	}
	var now int64 // read lazily: a fast run of a settled statement reads no clock
	if r%sampleEvery == 0 {
		t.sample[r/sampleEvery%uint64(len(t.sample))].Store(uint64(k) | 1)
	}
	if slow || r%64 == 0 {
		now = t.now()
		t.roll(now)
	}
	s := &t.sets[uint64(k)&t.mask]
	for {
		i, w := s.find(k)
		if i < 0 {
			if ok, c := t.insert(s, k, slow, sql); ok {
				return c
			}
			continue // inserted by someone else meanwhile: update it
		}
		nw, c := next(w, slow)
		if c != None {
			if now == 0 {
				now = t.now()
			}
			if t.allowed(k, w, c, now) {
				return t.change(s, k, slow, sql, now)
			}
			nw, c = nw&^demotedBit|w&demotedBit, None // held back: the fraction moves, the class stays
			if t.asSlowAsTheLane(k, w, slow) {
				nw |= provenBit
			}
		}
		if nw == w || s[i].CompareAndSwap(w, nw) {
			return c
		}
	}
}

// next returns the entry w after one more run, and the change the fraction alone asks for.
func next(w uint64, slow bool) (uint64, Change) {
	f := w & fracMask
	f -= f >> 2
	if slow {
		f += step
	}
	nw := w&^fracMask | f | refBit
	if !slow {
		nw |= provenBit
	}
	demoted := w&demotedBit != 0
	switch {
	// A statement with no fast run on record has no history to protect: its first slow run
	// demotes it. One with a fast history needs the fraction (three slow runs in a row).
	case !demoted && slow && (f >= demoteAt || w&provenBit == 0):
		return nw | demotedBit, Demoted
	case demoted && f <= promoteAt:
		return nw &^ demotedBit, Promoted
	}
	return nw, None
}

// allowed reports whether a change that the fraction asks for may happen now: not sooner than
// MinPeriod after the statement's last change, and, for a demotion, only when the statement is
// slow relative to what Short runs: at least twice as often slow as all of the Table's runs in
// the last window or two.
func (t *Table) allowed(k Key, w uint64, c Change, now int64) bool {
	if t.tick > 0 && w&usedBit != 0 {
		since := (uint64(now/t.tick) - (w>>atShift)&atMask) & atMask
		if since < ticksPerPeriod {
			return false
		}
	}
	if c != Demoted {
		return true
	}
	f, _ := next(w, true)
	return t.relative(k, f&fracMask)
}

// asSlowAsTheLane reports whether a slow run of a statement not demoted was held back by the
// relative rule itself (enough runs to compare, and the lane as slow as the statement): the
// statement is then as good as proven, so that a saturated server does not keep its hottest
// statement on probation.
func (t *Table) asSlowAsTheLane(k Key, w uint64, slow bool) bool {
	if !slow || w&demotedBit != 0 || t.relativeDisabledTest {
		return false
	}
	if t.runs.Load()-t.prevRuns.Load() < t.minRunsForRelative {
		return false
	}
	f, _ := next(w, true)
	return !t.relative(k, f&fracMask)
}

// relative reports whether a statement whose fraction of slow runs is f stands out from the
// runs of the last window or two: it is slow at least twice as often as they are, and it is not
// the lane's hottest statement (at most half of the sampled recent runs are its own). With too
// few runs to compare, see blocking.
func (t *Table) relative(k Key, f uint64) bool {
	if t.relativeDisabledTest {
		return true
	}
	runs := t.runs.Load() - t.prevRuns.Load()
	if runs < t.minRunsForRelative {
		return t.blocking(k)
	}
	if t.hot(k) {
		return false
	}
	slow := t.slowRuns.Load() - t.prevSlow.Load()
	// g = slow/runs; demote only if f >= 2g, that is f·runs >= 2·slow·one.
	return f*runs >= 2*slow*one
}

// change installs a change under mu: the word is read again, the change decided again with the
// word as it is now, and OnChange told before mu is released.
func (t *Table) change(s *set, k Key, slow bool, sql string, now int64) Change {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		i, w := s.find(k)
		if i < 0 {
			return None // evicted meanwhile; its next run starts again
		}
		nw, c := next(w, slow)
		if c != None && !t.allowed(k, w, c, now) {
			nw, c = nw&^demotedBit|w&demotedBit, None
			if t.asSlowAsTheLane(k, w, slow) {
				nw |= provenBit
			}
		}
		if c != None {
			nw = nw&^(atMask<<atShift) | (uint64(now/t.tickOr1())&atMask)<<atShift
		}
		if nw != w && !s[i].CompareAndSwap(w, nw) {
			continue
		}
		t.report(k, c, sql)
		return c
	}
}

// report counts a change and tells OnChange. Caller must hold mu.
func (t *Table) report(k Key, c Change, sql string) {
	switch c {
	case Demoted:
		t.demotions.Add(1)
	case Promoted:
		t.promotions.Add(1)
	default:
		return
	}
	if t.onChange != nil {
		t.onChange(k, c, sql)
	}
}

func (t *Table) tickOr1() int64 { return max(t.tick, 1) }

func (t *Table) now() int64 { return max(int64(time.Since(t.epoch)), 1) }

// blocking reports whether a statement whose runs the lane cannot compare (fewer than minRuns
// ran in the last window or two) is what holds the lane up: calls keep arriving (at least minRuns
// reported by Arrive), the statement is not what they ask for most (at most half of the sampled
// arrivals), and it is at least half of the last slow runs. That is a statement that turned slow
// (a lock wait) and holds the lane's slots while the other statements' calls wait and time out,
// which are not runs. A saturated lane whose hottest statement is slow is not (its calls are
// most of the arrivals), nor a quiet lane (few arrivals), nor a stall of every statement (no
// statement is half of the slow runs). Its fraction decides.
func (t *Table) blocking(k Key) bool {
	if t.arrivals.Load()-t.prevArr.Load() < t.minRunsForRelative || t.hot(k) {
		return false
	}
	n, mine := share(&t.slowSample, k)
	return n >= 3 && 2*mine >= n
}

// sampleEvery: one run in this many is sampled into Table.sample.
const sampleEvery = 16

// hot reports whether at least half of the sampled recent calls are the statement's own, or fewer
// than four were sampled yet (too early to tell): moving a lane's hottest statement to Long's
// small capacity makes an overload worse, whatever its run times. The calls are the arrivals when
// the caller reports them (Arrive): they follow what the lane is asked for even while few runs
// end; otherwise the runs.
func (t *Table) hot(k Key) bool {
	if t.arrivals.Load() > 0 {
		return hotIn(&t.arrSample, k)
	}
	return hotIn(&t.sample, k)
}

// hotIn is hot over a sample ring.
func hotIn(ring *[16]atomic.Uint64, k Key) bool {
	n, mine := share(ring, k)
	return n < 4 || 2*mine >= n
}

// share returns the number of keys in a sample ring, and how many of them are k's.
func share(ring *[16]atomic.Uint64, k Key) (n, mine int) {
	for i := range ring {
		v := ring[i].Load()
		if v == 0 {
			continue
		}
		n++
		if (v^uint64(k))>>tagShift == 0 {
			mine++
		}
	}
	return n, mine
}

// roll starts a new window when the current one is over.
func (t *Table) roll(now int64) {
	if now-t.winStart.Load() < t.window || !t.mu.TryLock() {
		return // a window rolls late rather than making a run wait for the mutex
	}
	if now-t.winStart.Load() >= t.window {
		t.prevRuns.Store(t.curRuns.Load())
		t.prevSlow.Store(t.curSlow.Load())
		t.curRuns.Store(t.runs.Load())
		t.curSlow.Store(t.slowRuns.Load())
		t.prevArr.Store(t.curArr.Load())
		t.curArr.Store(t.arrivals.Load())
		t.winStart.Store(now)
	}
	t.mu.Unlock()
}

// insert adds the statement to its set after its first run, evicting an entry if the set is
// full; a first slow run may demote it at once (see next), which insert returns. It returns
// false, inserting nothing, if the statement is already in the set.
func (t *Table) insert(s *set, k Key, slow bool, sql string) (bool, Change) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		// Only insert adds statements, and it holds mu: k cannot appear after this check.
		if i, _ := s.find(k); i >= 0 {
			return false, None
		}
		now := t.now()
		// A new statement may change at once: its at lies a whole period back.
		at := (uint64(now/t.tickOr1()) - ticksPerPeriod) & atMask
		base := uint64(k)>>tagShift<<tagShift | usedBit | refBit | at<<atShift
		nw, c := next(base, slow)
		if c == Demoted && !t.allowed(k, base, c, now) {
			nw, c = nw&^demotedBit, None
			if t.asSlowAsTheLane(k, base, slow) {
				nw |= provenBit
			}
		}
		if c != None {
			nw = nw&^(atMask<<atShift) | (uint64(now/t.tickOr1())&atMask)<<atShift
		}
		v, old := s.victim()
		if !s[v].CompareAndSwap(old, nw) {
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
		t.report(k, c, sql)
		return true, c
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
