// Package stmtstats learns, per statement, whether it is slow, and whether it is proven fast.
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
//  1. takes k := t.Key(sql) and asks t.Arrive(k) (Classify, and the call counted for the
//     relative rule) to choose a lane: Slow (demoted), Proven (a fast run on record) or Unproven
//     (none: the caller may hold it to a share of the lane, on probation);
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
// Each run is one observation: slow if it overran (or d >= Threshold), fast otherwise. A fast run
// marks the statement proven. The Table keeps, per statement, an exponentially weighted fraction
// of slow runs,
//
//	f ← (1 − α)·f + α·slow,  α = 1/4,  f = 0 for a statement never seen slow,
//
// and asks to demote the statement when f reaches 1/2, or at its first slow run if it is not
// proven (no fast history to protect), and to promote it back when f falls to 1/5. Two rules can
// hold a change back:
//
//   - MinPeriod: a statement changes at most once per Config.MinPeriod (default 10 × Threshold
//     within [1s, 1m]), so no demote/promote cycle is shorter than 2 × MinPeriod. The time of the
//     last change is kept in the entry, in ticks of MinPeriod/8 modulo 4096 (a change exactly a
//     multiple of 512 periods after the last one may wait one more period).
//   - The relative rule, for demotions: the statement must be slow at least twice as often as
//     all of the Table's runs over the last one or two windows (max(Threshold, 1s) each), and
//     it must not be the lane's hottest statement (at least half of the last 16 sampled calls,
//     one in 16, its own). The calls are those reported by Arrive, as they arrive, before they
//     wait for a slot; a caller that reports none gets the runs instead. When every statement is
//     slow, none is demoted. A slow run held back by this rule marks the statement proven: it is
//     as slow as the lane, not slower.
//   - With fewer than 16 runs in the last window or two there is nothing to compare with, and a
//     demotion is held back, unless the lane is blocked by the statement: at least 16 calls
//     arrived (Arrive) in that time, it is not the hottest, and it is at least half of the last
//     16 slow runs (a statement that turned slow on a lock wait and holds the lane's slots while
//     the other statements' calls give up, which are not runs). Its fraction then decides.
//
// Why a fraction of slow runs and not a mean or percentile of durations: the lane cares only
// whether a run holds a short slot past the threshold, which is a yes or no; and a fraction
// bounds what one run can do. A single run moves f by at most α = 1/4, whatever its duration,
// so one 600 ms lock wait weighs as much as one 2 ms overrun, whereas a mean would be dragged
// past any threshold by one long outlier.
//
// What the numbers give for a proven statement (the fractions are exact in the package's
// fixed-point arithmetic and checked by the tests, with the two rules off):
//
//   - From any state, three slow runs in a row demote: 1 − (3/4)³ > 1/2.
//   - A statement whose last eight runs were fast (six, if it is not demoted) needs three slow
//     runs to be demoted, not one or two. So a lookup with a history of fast runs that waits
//     once on a row lock, or twice, stays in the short lane.
//   - A demoted statement that became fast again is promoted after six fast runs (four if it
//     had just been demoted), MinPeriod permitting. The gap between 1/2 and 1/5 (hysteresis)
//     keeps a statement that is slow about half of the time demoted. A statement slow one run in
//     three peaks at f ≈ 0.43 and stays in the short lane.
//
// OnChange (Config) is called for every change under the Table's mutex, in order: changes are
// rare, and only they take the mutex.
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
// A statement is its SQL text with literals folded (see Fold): texts that differ only in
// numbers, strings, lists of literals or parameters, comments or whitespace share a key, so a
// query builder that inlines values (where id = 42, where id in (1,2,3)) is learned as one
// statement. Key hashes the folded text in one pass over the text, without building it and
// without allocating. Folding costs several times a plain hash of the text, so Key first looks
// the string up by identity in a cache of 4,096 entries in sets of four (keycache.go): a text
// seen before at the same address, a constant or a string the caller keeps, costs a few atomic
// loads, less than the plain hash. A text built per call is looked up next by a plain hash of
// its content in a cache of 2,048: one that is the same text every call (a query builder's
// parameterised query) costs that hash and a lookup; one whose literals change on every call is
// folded (BenchmarkKey measures the four). Texts whose cost depends on a literal (limit 10 and
// limit 100000) share an entry: the price of folding.
//
// # Memory
//
// A Table is an array of Entries 8-byte words fixed by New (default 4096 entries, 32 KiB),
// grouped in sets of eight, one cache line each, and two key caches (see keycache.go): by
// identity, 104 KiB and the texts it holds (at most 4,096 of at most 1 KiB), and by content,
// 52 KiB and at most 2,048 entries of 16 B, which hold no text. A statement lives only in the
// set its hash selects. An entry holds 35 bits of the statement's hash (a tag), f in 13 bits of
// fixed point, the time of its last change in 12 bits, the proven and demoted bits, a
// recently-used bit and an in-use bit. Two folded texts whose hashes agree in the set index (9 bits by
// default) and the tag share an entry: about one chance in 10¹¹ per lookup with the default
// table. The hash is hash/maphash with a seed per Table, over the folded text.
//
// Every statement with a run on record occupies an entry (a proven one must be remembered to
// leave probation). When the first run of a new statement finds its set full, it replaces, in
// this order: an entry neither demoted nor recently used, one not demoted, one
// demoted but not recently used, any; the lowest f first within each class. "Recently used" is
// the not-recently-used (clock) bit: set when the statement is classified or observed, cleared
// for the whole set when an eviction found no entry without it.
//
// # Concurrency
//
// All methods are safe for concurrent use and allocate nothing, but Key when it caches a text
// (once per text, at its second call with the same string or the same content). Classify is
// eight atomic loads in one cache line; Overran and Done also, and one compare-and-swap only
// when the entry changes. A hot statement in steady state (fast with f at its floor, or slow and demoted with
// f = 1) changes no entry, so any number of goroutines classify and observe it without writing
// its cache line, where a mutex, even one of many stripes, would write the same line on every
// call because a hot statement always maps to the same stripe. Every run does add to two shared
// counters (runs, slow runs) for the relative rule, and one run in 16 stores its key in a sample
// ring. Each change is returned to exactly one caller. Only the insertion of a new statement and
// a change of class take the Table's mutex, so that a statement never occupies two entries and
// changes are seen in order (OnChange).
//
// A nil *Table is valid: it learns nothing, Classify reports Proven, Demoted reports false and
// every Change is None.
package stmtstats
