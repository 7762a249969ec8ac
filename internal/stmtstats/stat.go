package stmtstats

// Stat is a snapshot of a Table's figures.
//
// Between changes, Demoted = Demotions − Promotions − EvictedDemoted. The counters are exact;
// Tracked and Demoted come from reading every entry once, so while other goroutines update the
// Table they are a sum of per-entry snapshots, not an instant's.
type Stat struct {
	Entries int // the Table's capacity: Config.Entries rounded up
	Tracked int // statements on record: entries in use
	Proven  int // of Tracked, statements with a fast run on record and not demoted
	Demoted int // statements currently demoted

	Demotions  uint64 // Demoted changes returned so far
	Promotions uint64 // Promoted changes returned so far
	// Evictions counts entries replaced by a new statement. A high rate means that Entries is
	// too small, or that SQL texts carry literals.
	Evictions uint64
	// EvictedDemoted counts the evicted entries that were demoted: each ended a demotion without
	// a Promoted change. Eviction prefers entries that are not demoted, so this stays 0 unless
	// a whole set of eight entries is demoted.
	EvictedDemoted uint64
}

// Stat returns a snapshot of the Table's figures. It reads every entry; call it at scrape time,
// not per statement. A nil Table has a zero Stat.
func (t *Table) Stat() Stat {
	if t == nil {
		return Stat{}
	}
	st := Stat{Entries: len(t.sets) * ways}
	for i := range t.sets {
		for j := range t.sets[i] {
			w := t.sets[i][j].Load()
			if w != 0 {
				st.Tracked++
			}
			switch {
			case w&demotedBit != 0:
				st.Demoted++
			case w&provenBit != 0:
				st.Proven++
			}
		}
	}
	t.mu.Lock()
	st.Evictions, st.EvictedDemoted = t.evictions, t.evictedDemoted
	t.mu.Unlock()
	st.Demotions, st.Promotions = t.demotions.Load(), t.promotions.Load()
	return st
}
