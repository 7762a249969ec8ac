package pgxlanes

import (
	"time"
	"unicode/utf8"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// The pool learns which unannotated statements sent to Short are slow (internal/stmtstats holds
// the statistic and its bounds): route sends a statement learned as slow to Long's capacity,
// under Short's timeouts, so it can no longer fill Short. A statement still running past the
// threshold is reported by the guard's Mark step before it ends, so a storm of slow statements is
// caught within about the threshold.

// learned tells the learner how long the lease's statement took.
func (p *Pool) learned(l *lease, d time.Duration) {
	p.changed(p.learn.Done(l.rt.key, d, l.has(fOverran)), l.sql)
}

func (p *Pool) changed(c stmtstats.Change, sql string) {
	if c == stmtstats.None {
		return
	}
	e := StatementEvent{SQL: truncate(sql, 80), Demoted: c == stmtstats.Demoted}
	p.status.statement(e)
	p.obs.statement(e)
}

// truncate returns s cut to at most n bytes at a rune boundary, with "…" when cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
