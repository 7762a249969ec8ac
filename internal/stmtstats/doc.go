// Package stmtstats learns, per SQL text, whether a statement is slow.
//
// A pool sends unannotated statements to its short lane. A slow statement that nobody annotated
// (an ORM's report, a search, a count that grew with the data) would hold short slots and bring
// head-of-line blocking back. A Table remembers which statements ran past a threshold, so that
// the caller can route them to another lane. The Table only decides; routing is the caller's.
//
// # Use
//
// For every run of a statement, the caller
//
//  1. takes k := t.Key(sql) and asks t.Demoted(k) to choose a lane;
//  2. arranges for t.Overran(k) to be called once if the run is still going after
//     t.Threshold(), for example with time.AfterFunc;
//  3. calls t.Done(k, d, overran) when the run ends after d, where overran says whether
//     Overran was (or, with the timer already firing, will be) called for this run. With
//     time.AfterFunc, overran is !timer.Stop().
//
// Overran and Done return a Change. A Change other than None is returned exactly once per
// transition, to the one caller whose observation caused it, so that logging one line per
// Demoted and per Promoted change logs each transition once.
//
// d should be the statement's own run time, from the moment it was sent until its result was
// read, without the wait for a connection: a statement must not be demoted because its lane was
// busy.
//
// # The decision
//
// Each run is one observation: slow if it overran (or d >= Threshold), fast otherwise. The Table
// keeps, per statement, an exponentially weighted fraction of slow runs,
//
//	f ← (1 − α)·f + α·slow,  α = 1/4,  f = 0 for a statement never seen slow,
//
// demotes the statement when f reaches 1/2 and promotes it back when f falls to 1/5.
//
// Why a fraction of slow runs and not a mean or percentile of durations: the lane cares only
// whether a run holds a short slot past the threshold, which is a yes or no; and a fraction
// bounds what one run can do. A single run moves f by at most α = 1/4, whatever its duration,
// so one 600 ms lock wait weighs as much as one 2 ms overrun, whereas a mean would be dragged
// past any threshold by one long outlier.
//
// What the numbers give (the fractions are exact in the package's fixed-point arithmetic and
// checked by the tests):
//
//   - A new statement starts at f = 0 ("fast", where it is routed anyway), so the prior doubles
//     as the minimum number of observations: three slow runs in a row demote it
//     (f = 0.25, 0.44, 0.58), one or two never do.
//   - From any state, three slow runs in a row demote: 1 − (3/4)³ > 1/2.
//   - A statement whose last eight runs were fast (six, if it is not demoted) needs three slow
//     runs to be demoted, not one or two. So a lookup with a history of fast runs that waits
//     once on a row lock, or twice, stays in the short lane.
//   - A demoted statement that became fast again is promoted after six fast runs (four if it
//     had just been demoted). The gap between 1/2 and 1/5 (hysteresis) keeps a statement that
//     is slow about half of the time from flapping: it stays demoted. A statement slow one run
//     in three peaks at f ≈ 0.43 and stays in the short lane.
//
// α = 1/4 trades memory against reaction: smaller α forgets a lock wait more slowly but needs
// more slow runs to demote a statement that became slow; larger α lets two slow runs demote a
// fast lookup.
//
// # Fast reaction
//
// Overran counts a run as slow at the moment it passes the threshold, while it is still
// running, and Done with overran set does not count it again. So when twelve runs of a new slow
// statement start together, the third of their Overran calls, about Threshold after they
// started, demotes it: the next caller is routed elsewhere without waiting for any of the twelve
// to end. A lock wait that catches three or more concurrent runs of the same lookup demotes it
// too, on purpose: those runs do hold short slots past the threshold. Its next fast runs
// promote it back.
//
// # What a statement is
//
// A statement is its exact SQL text. Statements that differ only in literals (where id = 42,
// where id = 43) are different statements. pgx sends arguments separately ($1), so one query
// in the code is one text; texts with literals inlined are learned one by one. Normalising
// literals would cost a scan of every text on every call (the key is otherwise one
// hash of the string) and would merge texts whose cost differs with the literal (limit 10 and
// limit 100000). The table protects itself from unbounded texts: fast runs of a statement that
// is not tracked store nothing, and evictions prefer entries that are not demoted.
//
// # Memory
//
// A Table is an array of Entries 8-byte words fixed by New (default 4096 entries, 32 KiB),
// grouped in sets of eight, one cache line each. A statement lives only in the set its hash
// selects. An entry holds 46 bits of the statement's hash (a tag), f in 15 bits of fixed
// point, the demoted bit, a recently-used bit and an in-use bit. Two texts whose hashes agree
// in the set index and the tag share an entry; with 46 tag bits that is about one chance in
// 10¹³ per lookup. The hash is hash/maphash with a seed per Table.
//
// Only statements with a slow history occupy an entry. A statement that is not demoted and
// whose f decays below 1/64 (ten fast runs after one slow one) gives its entry up, since such an
// entry says no more than an absent one. When a slow run of a new statement finds its set full,
// it replaces, in this order: an entry neither demoted nor recently used, one not demoted, one
// demoted but not recently used, any; the lowest f first within each class. "Recently used" is
// the not-recently-used (clock) bit: set when the statement is classified or observed, cleared
// for the whole set when an eviction found no entry without it.
//
// # Concurrency
//
// All methods are safe for concurrent use and allocate nothing. Demoted is eight atomic loads
// in one cache line; Overran and Done also, and one compare-and-swap only when the entry
// changes. A hot statement in steady state (fast with f at its floor, or slow and demoted with
// f = 1) changes nothing, so any number of goroutines classify and observe it without writing
// a shared cache line, where a mutex, even one of many stripes, would write the same line on
// every call because a hot statement always maps to the same stripe. Transitions are computed
// from the old word and installed by one compare-and-swap, which is why each is returned to
// exactly one caller. Only the insertion of a new statement takes the Table's mutex, so that
// a statement never occupies two entries; insertions follow slow runs, so their rate is bounded
// by the number of concurrent runs divided by Threshold.
//
// A nil *Table is valid: it learns nothing, Demoted reports false and every Change is None.
package stmtstats
