package pgxlanes

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/pgxlanes/pgxlanes/txguard"
)

// resetSQL restores the session defaults after any of the settings below (internal/wire stages
// it when a lease ends). RESET returns to the value of the startup packet.
const resetSQL = "reset statement_timeout; reset lock_timeout; reset idle_in_transaction_session_timeout"

// maxPGTimeout is the largest value PostgreSQL accepts for its timeout settings (INT_MAX ms).
const maxPGTimeout = math.MaxInt32 * time.Millisecond

// sessionSQL renders the settings a lease of a lane needs, against the session defaults: the
// values RESET restores, which are the user's and the DBA's (the DSN's runtime parameters and
// options, ALTER ROLE and ALTER DATABASE SET, the server's configuration; pgxlanes puts none of
// its own in the startup packet), or none of ours behind a transaction pooler. It is the one place
// that writes SQL from configuration; only typed durations, rendered as whole milliseconds, are
// ever written into it.
type sessionSQL struct {
	defaults LaneConfig // StatementTimeout and LockTimeout that RESET restores; Off for none
	pooler   bool
}

// setting is one timeout setting and its value.
type setting struct {
	name string
	v    time.Duration
}

// settings are what a lease of lane lc needs beyond the session defaults. A transaction with
// budget b also gets the server-side backstops of that budget: statement_timeout capped and
// idle_in_transaction_session_timeout set just beyond the guard's last step. coarse rounds the
// backstop up (see coarseUp).
func (s sessionSQL) settings(lc LaneConfig, tx bool, b time.Duration, coarse bool) []setting {
	st := lc.StatementTimeout
	var idle time.Duration
	if tx {
		idle = backstop(b, lc.OverBudget)
		if coarse && idle > 0 {
			idle = coarseUp(idle)
		}
		if idle > 0 && (st <= 0 || st > idle) {
			st = idle
		}
	}
	var out []setting
	if on(st) != on(s.defaults.StatementTimeout) {
		out = append(out, setting{"statement_timeout", st})
	}
	if on(lc.LockTimeout) != on(s.defaults.LockTimeout) {
		out = append(out, setting{"lock_timeout", lc.LockTimeout})
	}
	if idle > 0 {
		out = append(out, setting{"idle_in_transaction_session_timeout", idle})
	}
	return out
}

// session returns the statements, as one query, that give a session what a lease of lane lc
// needs (tx: a transaction with budget b): "" when it needs nothing beyond the defaults, and
// always "" behind a transaction pooler, where session settings would leak to other clients.
// Otherwise it sets or resets each of the three settings resetSQL restores, so that what a lease
// gets never depends on what the connection served before.
func (s sessionSQL) session(lc LaneConfig, tx bool, b time.Duration) string {
	if s.pooler {
		return ""
	}
	set := s.settings(lc, tx, b, false)
	if len(set) == 0 {
		return ""
	}
	var out strings.Builder
	out.WriteString(render(set, "set ", "; "))
	for _, name := range sessionSettings {
		found := false
		for _, st := range set {
			found = found || st.name == name
		}
		if !found {
			out.WriteString("; reset " + name)
		}
	}
	return out.String()
}

// sessionSettings are the settings a lease's session SQL may change, which resetSQL restores.
var sessionSettings = [...]string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"}

// local returns the SET LOCAL statements, as one query, of a transaction of lane lc with budget b,
// sent right after its BEGIN behind a transaction pooler.
func (s sessionSQL) local(lc LaneConfig, b time.Duration) string {
	return render(s.settings(lc, true, b, false), "set local ", "; ")
}

// batchLocals are local's statements one by one, for a batch begun with pgx.Batch.BeginTx behind
// a transaction pooler (see batch.go): the extended protocol takes one statement per query. In
// pgx's default exec mode each distinct text is prepared and cached, so the backstop of a budget
// set with WithBudget is rounded up (coarse): a program that computes its budgets does not fill
// the connections' statement caches.
func (s sessionSQL) batchLocals(lc LaneConfig, b time.Duration) []string {
	set := s.settings(lc, true, b, b != lc.Budget)
	out := make([]string, len(set))
	for i := range set {
		out[i] = render(set[i:i+1], "set local ", "")
	}
	return out
}

func render(set []setting, verb, sep string) string {
	var b strings.Builder
	for i, st := range set {
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(verb)
		b.WriteString(st.name)
		b.WriteString(" = ")
		b.WriteString(millis(st.v))
	}
	return b.String()
}

// millis renders d as whole milliseconds, rounded up, for a PostgreSQL timeout setting; Off is 0.
func millis(d time.Duration) string {
	d = on(d)
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return strconv.FormatInt(int64(ms), 10)
}

// backstop is how long after the start of a transaction the server itself should end it when
// its lease has budget b and action a: just beyond the guard's last step. 0 for none: flag never
// ends work, and PostgreSQL's timeouts stop at 2^31-1 ms (about 24.8 days), beyond which there is
// no backstop.
func backstop(b time.Duration, a Action) time.Duration {
	if b <= 0 || a == ActionFlag {
		return 0
	}
	last := txguard.LastStep(b, guardAction(a))
	d := last + max(time.Second, b/10)
	if d < last || d > maxPGTimeout {
		return 0
	}
	return d
}

// coarseUp rounds d up to the next of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 and 8 times a power of ten
// milliseconds, at most 25 % more, and never past PostgreSQL's largest timeout.
func coarseUp(d time.Duration) time.Duration {
	if d >= maxPGTimeout {
		return maxPGTimeout
	}
	steps := [...]time.Duration{10, 12, 15, 20, 25, 30, 40, 50, 60, 80}
	for scale := time.Millisecond / 10; scale <= maxPGTimeout; scale *= 10 {
		for _, st := range steps {
			if v := st * scale; v >= d {
				return min(v, maxPGTimeout)
			}
		}
	}
	return maxPGTimeout
}
