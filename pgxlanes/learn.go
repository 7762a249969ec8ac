package pgxlanes

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
)

// The pool learns which unannotated statements sent to Short are slow (internal/stmtstats holds
// the statistic and its bounds): route sends a statement learned as slow to Long's capacity,
// under Short's timeouts, so it can no longer fill Short. A statement still running past the
// threshold is reported by the guard's Mark step before it ends, so a storm of slow statements is
// caught within about the threshold.
//
// Until a statement has a fast run on record it is on probation (probation.go): unproven
// statements together hold at most Short's cap less its reserve, so that a new slow statement
// cannot fill Short in the window before it is learned. Texts that differ only in literals are one
// statement. Changes are logged at most once per logInterval; observers see every change, in
// order.

// logInterval rate-limits the learner's log lines.
const logInterval = time.Second

// learnLog is the learner's log state, touched only by reportLearned (the reporter runs one at a
// time).
type learnLog struct {
	last       time.Time
	suppressed int
}

// newLearner makes the Table, with its OnChange, and the probation tokens.
func (p *Pool) newLearner(cfg *Config) error {
	t := cfg.Short.SlowThreshold
	var err error
	p.learn, err = stmtstats.New(stmtstats.Config{Threshold: t, OnChange: p.onChange})
	if err != nil {
		return fmt.Errorf("pgxlanes: short lane: SlowThreshold (lane_short_slow_threshold): %w", err)
	}
	sc := &p.lanes[Short].cfg
	p.prob = newProbation(probationSize(sc.MaxConns, sc.Reserved), probationPerStatement(sc.MaxConns, sc.Reserved))
	return nil
}

// onChange reports a change. It runs under the Table's mutex, on the goroutine that saw the run
// (a caller's, or the guard's for a statement still running): it wakes the probation waiters at
// once, and queues the rest on the reporter, which runs reports in order off every caller's and
// the guard's goroutine. Observers see every change, in order; the log at most once per
// logInterval, with the number of changes it left out since its last line.
func (p *Pool) onChange(k stmtstats.Key, c stmtstats.Change, sql string) {
	if c == stmtstats.Demoted && p.prob != nil {
		p.prob.settle(k)
	}
	e := StatementEvent{SQL: stmtstats.Fold(sql, 80), Demoted: c == stmtstats.Demoted}
	p.servers[0].term.report(func() { p.reportLearned(e) })
}

// reportLearned is onChange's report, run by the reporter.
func (p *Pool) reportLearned(e StatementEvent) {
	p.status.statement(e)
	p.obs.statement(e)
	now := time.Now()
	if now.Sub(p.learnLog.last) < logInterval {
		p.learnLog.suppressed++
		return
	}
	msg := "pgxlanes: statement learned as slow; it now takes Long's capacity under Short's timeouts"
	if !e.Demoted {
		msg = "pgxlanes: statement learned as fast again; it is back in Short"
	}
	attrs := []slog.Attr{slog.String("sql", e.SQL)}
	if n := p.learnLog.suppressed; n > 0 {
		attrs = append(attrs, slog.Int("changes_not_logged", n))
	}
	p.learnLog.last, p.learnLog.suppressed = now, 0
	p.obs.logger.LogAttrs(context.Background(), slog.LevelWarn, msg, attrs...)
}

// learned tells the learner how long the lease's statement took, and gives its probation token
// back. end calls it once per lease that learns, after the lane slot is released. A run that
// proved its statement sends the statement's probation waiters on without a token.
func (p *Pool) learned(l *lease, d time.Duration) {
	overran := l.has(fOverran)
	fast := !overran && d < p.config.Short.SlowThreshold
	if fast && !p.anyProven.Load() {
		p.anyProven.Store(true)
	}
	p.learn.DoneText(l.rt.key, l.sql, d, overran)
	if l.rt.probation {
		p.prob.release(l.rt.key)
	}
	if p.prob != nil && p.prob.waiting.Load() > 0 && p.learn.Classify(l.rt.key) != stmtstats.Unproven {
		p.prob.settle(l.rt.key)
	}
}
