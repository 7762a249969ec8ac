package pgxlanes

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Off turns a lane setting off: no timeout, no budget, no reserve, no bound on the queue. In a
// LaneConfig, zero means the lane's default instead. Off is untyped, so it fits every field.
const Off = -1

// LaneConfig configures one lane. A zero field takes the lane's default, resolved by
// NewWithConfig against the pool's MaxConns (N), so that a Config whose MaxConns changes after
// ParseConfig stays consistent. Off turns a setting off. The DSN parameter of each field is
// lane_<lane>_<setting>; in a DSN, durations need a unit ("250ms", "1s") and 0 means off.
//
//	setting            short              tx               long
//	reserved           N/4 (≥1 if N ≥ 2)  (N-short)/2      0
//	max_conns          N                  its reachable    (N-short)/4 (≥1)
//	max_waiters        32 × max_conns (all lanes)
//	acquire_timeout    1s                 10s              30s
//	statement_timeout  5s                 30s              off
//	lock_timeout       1s                 10s              30s
//	budget             statement + 1s     30s              10m
//	over_budget        cancel             cancel           flag
//	slow_threshold     1s (learning)      -                -
//	fleet_max_conns    -                  -                off
//	priority_age       acquire_timeout/2 (500ms, 5s, 15s)
//	priority_headroom  1                  1                0
//	max_tag_share      -                  off              -
//	fleet_name         -                  -                <database>/<user>[/<application_name>]
//
// An unbounded lane (Tx, Long) can reach at most its reserve plus the shared connections (N minus
// every reserve); that is its default cap, and a larger MaxConns is refused.
type LaneConfig struct {
	// Reserved connections no other lane's unbounded work may take (lane_<lane>_reserved).
	// Short's reserve is what keeps short queries from ever queueing behind transactions. A pool
	// of one connection cannot be split, so Short then reserves none.
	Reserved int
	// MaxConns caps the connections the lane holds at once (lane_<lane>_max_conns). Short may
	// borrow idle connections up to this cap; Tx and Long never exceed their reserve plus the
	// shared connections.
	MaxConns int
	// MaxWaiters bounds the lane's queue (lane_<lane>_max_waiters): a caller beyond it fails at
	// once with ErrLaneFull instead of adding to a queue that cannot drain in time. Default
	// 32 × MaxConns: more cannot be served within an acquire timeout unless the work is far
	// shorter than the timeout. Off: unbounded.
	MaxWaiters int
	// AcquireTimeout bounds the wait for a lane slot behind other callers
	// (lane_<lane>_acquire_timeout). A short query fails within a second instead of waiting
	// behind a full pool; transactions may wait longer. Off: wait until the caller's ctx ends.
	// Opening a connection for the call is not charged to it: that is bounded by
	// ConnConfig.ConnectTimeout (default: the longest acquire timeout), so that a cold start or
	// a recycled connection over a slow link does not fail a Short call.
	AcquireTimeout time.Duration
	// StatementTimeout is PostgreSQL's statement_timeout for the lane's statements
	// (lane_<lane>_statement_timeout). The server enforces it, so a frozen client cannot keep a
	// statement running; the client enforces the lane's Budget too. Short's bounds its hold
	// time, which is what makes its borrowing safe.
	StatementTimeout time.Duration
	// LockTimeout is PostgreSQL's lock_timeout (lane_<lane>_lock_timeout): a short lookup stops
	// waiting on a row lock held by a transaction after a second instead of queueing behind it.
	LockTimeout time.Duration
	// Budget is how long a lease of this lane (a transaction, a held connection, a query's open
	// rows) may last (lane_<lane>_budget); WithBudget overrides it per call. Short's default is
	// its statement timeout plus one second.
	Budget time.Duration
	// OverBudget is what happens to a lease that outlives its budget (lane_<lane>_over_budget =
	// flag, cancel or terminate). The escalation ladder:
	//
	//	flag:      at Budget, a warning with the call site; the work goes on
	//	cancel:    at Budget/2 a warning; at Budget the running statement is cancelled and the
	//	           lease's next call fails; at 2×Budget, if still held, the session is terminated
	//	terminate: at Budget/2 a warning; at Budget the session is terminated
	//
	// For cancel and terminate, the session also gets idle_in_transaction_session_timeout (and a
	// capped statement_timeout) just beyond the last step, so the server ends the transaction
	// even if the client is frozen or gone.
	OverBudget Action
	// SlowThreshold is Short's alone (lane_short_slow_threshold): a statement sent to Short
	// without an annotation whose recent runs mostly take longer than this is learned as slow
	// and admitted to Long's capacity instead, still under Short's timeouts, until it is fast
	// again (see Stat.Learning). Default 1s, about 3 × the p99 of work that belongs in Short and
	// far below its 5s statement timeout. Off: no learning.
	SlowThreshold time.Duration
	// FleetMaxConns is Long's alone (lane_long_fleet_max_conns): how many Long calls may run at
	// once across every pool of the same fleet (FleetName) on the server (all replicas of a
	// service), coordinated with advisory locks in PostgreSQL held by two sessions of each pool.
	// Off (the default): no fleet cap. Refused with TransactionPooler: the slots are
	// session-level locks (docs/scale-out.md).
	FleetMaxConns int
	// PriorityAge is how long a caller may be overtaken by callers of higher priority
	// (WithPriority) in the lane's queue (lane_<lane>_priority_age): once it has waited this
	// long, it is served before every caller that came after it. Default half the lane's
	// AcquireTimeout (500ms, 5s, 15s; the same without an acquire timeout): overtaken no longer
	// than that, a low-priority caller moved to the front by ageing has the other half of its
	// timeout to be served. Off: the lane is strictly FIFO and priorities are ignored.
	PriorityAge time.Duration
	// PriorityHeadroom is how many of the lane's last connections callers of negative priority
	// (PriorityLow) may not take until they have waited PriorityAge (lane_<lane>_priority_headroom):
	// a low-priority caller gets a connection only while the lane could take more than this many
	// after it, so that a caller of priority 0 or more arriving under a saturating background
	// load finds one at once instead of waiting for a release. It never holds back work of
	// priority 0 or more, so it costs nothing to a pool that marks no work low. Default 1 in
	// Short and Tx (when the lane's cap is at least 2 and it orders by priority), none in Long.
	// Off: none.
	PriorityHeadroom int
	// MaxTagShare is Tx's alone (lane_tx_max_tag_share): the fraction of Tx's cap (above 0, at
	// most 1) that the callers of one tag (WithTag; untagged callers count as one tag) may hold
	// while callers of another tag wait. A freed connection then goes to the first waiter of a
	// tag below its share; it never stays idle while anyone waits. Off (the default): no share,
	// as in Vitess's transaction limiter. With TagShareDryRun (lane_tx_tag_share_dry_run) the
	// share is only logged and counted (LaneStat.TagShareRefusals), never applied.
	MaxTagShare    float64
	TagShareDryRun bool
	// FleetName is Long's alone (lane_long_fleet_name): the fleet whose cap FleetMaxConns is.
	// Pools with the same name on the same server share the slots (give every replica of a service
	// the same name, and each service its own). Default: "<database>/<user>", plus
	// "/<application_name>" when the connection sets one. The slots' advisory-lock keys derive
	// from it (docs/scale-out.md).
	FleetName string
	// Server aims the lane at another server, a read replica for reports, with its own connection
	// settings (parse them with pgxpool.ParseConfig). It is Long's alone, and set in code only.
	// The lane keeps its reserve, timeouts, budget, metrics and guard there: it gets a pgxpool of
	// its own of MaxConns connections (default Server.MaxConns), which no other lane borrows, and
	// its own guard session. Its timeouts are that server's session defaults. Short learns no
	// statements then, since a statement learned as slow would go to Long's server.
	Server *pgxpool.Config
}

// Config is the configuration of a Pool. Create it with ParseConfig; the embedded pgxpool.Config
// keeps every pgxpool setting, and MaxConns is the total shared by the lanes. Without
// pool_max_conns, MaxConns is pgxpool's default size plus Short's reserve (5 where pgxpool has
// 4), so that transactions and held connections keep pgxpool's capacity.
type Config struct {
	*pgxpool.Config

	Short LaneConfig
	Tx    LaneConfig
	Long  LaneConfig

	// CancelGrace bounds the cleaning of a connection whose request was ended early (the caller's
	// ctx ended, or the guard cancelled it): the server must answer the cancel request and
	// finish within it, or the connection is closed. The caller never waits for it (but for
	// Conn.Conn and Tx.Conn over TLS, which wait for it before they hand out the *pgx.Conn); the
	// lane slot stays held until it is done. Default 2s.
	CancelGrace time.Duration

	// Logger receives the pool's log lines (budget actions, lock holders, learned statements).
	// Default slog.Default(). It is an observer like any other (see Observer).
	Logger *slog.Logger
	// OnViolation, if set, is called for every budget warning, flag, cancel and terminate (and a
	// terminate that failed: Violation.Err), after it was carried out. It runs on the guard's
	// goroutine: keep it short, and do not close the pool from it. It is shorthand for an
	// observer that implements ViolationObserver.
	OnViolation func(Violation)

	// TransactionPooler must be set when the pool connects through a transaction-mode pooler such
	// as PgBouncer with pool_mode=transaction (DSN: pgxlanes_transaction_pooler=true). Such a
	// pooler rejects unknown startup parameters and shares server sessions between clients, so
	// only SET LOCAL is safe: pgxlanes then sets the lanes' timeouts with SET LOCAL inside
	// transactions only, and plain statements are bounded by the client-side cancel alone.
	TransactionPooler bool
	// NoCancelRequests stops the pool from sending protocol cancel requests
	// (pgxlanes_cancel_requests=false), for a pooler that cannot take them: PgBouncer 1.18.0 to
	// 1.20.x may crash on one (pgbouncer/pgbouncer#801, #822, #904; fixed in 1.21.0). A request
	// ended early is then left to finish by itself: its connection is reused if it does within
	// CancelGrace, and closed otherwise.
	NoCancelRequests bool

	// CaptureCallSites records the stack of every acquire, so that budget warnings name the code
	// that took the connection, as HikariCP's leak detection does. It costs an allocation and a
	// stack walk per acquire: off by default; turn it on to hunt a leak.
	CaptureCallSites bool
}

// Lane returns the configuration of lane l, or nil for an unknown lane.
func (c *Config) Lane(l Lane) *LaneConfig {
	switch l {
	case Short:
		return &c.Short
	case Tx:
		return &c.Tx
	case Long:
		return &c.Long
	}
	return nil
}

// Copy returns a deep copy of c.
func (c *Config) Copy() *Config {
	n := *c
	if c.Config != nil {
		n.Config = c.Config.Copy()
	}
	for _, l := range Lanes() {
		if s := n.Lane(l).Server; s != nil && s.ConnConfig != nil { // without one, resolve refuses it
			n.Lane(l).Server = s.Copy()
		}
	}
	return &n
}

// ParseConfig parses connString like pgxpool.ParseConfig, plus pgxlanes' parameters, which are
// not sent to the server:
//
//   - lane_<short|tx|long>_<setting>, the LaneConfig fields: reserved, max_conns, max_waiters,
//     acquire_timeout, statement_timeout, lock_timeout, budget, over_budget, slow_threshold,
//     fleet_max_conns, fleet_name, priority_age, priority_headroom, max_tag_share (a fraction),
//     tag_share_dry_run
//     (true or false). Durations need a unit ("250ms", "1s"); 0 means off.
//   - pgxlanes_transaction_pooler and pgxlanes_cancel_requests (true or false).
//
// Lane settings not given stay zero, which NewWithConfig resolves to the lane's default. Errors
// name the bad parameter and never contain the connection string or its password.
func ParseConfig(connString string) (*Config, error) {
	pc, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, parseError(err, connString)
	}
	c := &Config{Config: pc}
	// pgxpool took pool_max_conns out of the runtime parameters: read them as pgxpool did (a
	// service file's included) to tell a size given from pgxpool's default.
	if cc, err := pgconn.ParseConfig(connString); err == nil {
		if _, given := cc.RuntimeParams["pool_max_conns"]; !given {
			c.MaxConns = defaultPoolSize(pc.MaxConns)
		}
	}
	params := pc.ConnConfig.RuntimeParams
	for _, b := range []struct {
		name string
		set  func(bool)
	}{
		{"pgxlanes_transaction_pooler", func(v bool) { c.TransactionPooler = v }},
		{"pgxlanes_cancel_requests", func(v bool) { c.NoCancelRequests = !v }},
	} {
		v, ok := params[b.name]
		if !ok {
			continue
		}
		delete(params, b.name)
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("pgxlanes: DSN parameter %s: %q is not true or false", b.name, v)
		}
		b.set(on)
	}
	for k, v := range params {
		if !strings.HasPrefix(k, "lane_") {
			continue
		}
		delete(params, k)
		if err := c.setLaneParam(k, v); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// defaultPoolSize is the pool's size when pool_max_conns is not given: the smallest size whose Tx
// lane can hold as many connections as pgxpool's default pool (p, the greater of 4 and the number
// of CPUs), with Short's reserve on top. A service that replaces pgxpool.New keeps its
// transaction capacity and gains the reserve: 5 connections where pgxpool has 4, 10 for 8.
func defaultPoolSize(p int32) int32 {
	n := p
	for n-int32(shortReserve(int(n))) < p {
		n++
	}
	return n
}

// shortReserve is Short's default reserve in a pool of n: a quarter, at least one, except that a
// pool of one connection cannot be split.
func shortReserve(n int) int {
	if n < 2 {
		return 0
	}
	return max(n/4, 1)
}

// parseError turns pgxpool's parse error into one that says what is wrong, with pgx's reason
// ("failed to configure TLS (sslmode is invalid)"), and without the connection string or its
// password: pgconn redacts the password on a best-effort basis only.
func parseError(err error, connString string) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return errors.New("pgxlanes: invalid connection string")
	}
	// pgconn's message is "cannot parse `<connString>`: <what> (<inner error>)". Rebuild <what>
	// from a copy without the connection string, and keep the inner error with every secret of
	// the connection string taken out; when the secrets cannot be found (the string does not
	// tokenize), keep only what cannot hold them.
	safe := *pe
	safe.ConnString = ""
	what := strings.TrimPrefix(safe.Error(), "cannot parse ``: ")
	inner := errors.Unwrap(pe)
	secrets, ok := secretsOf(connString)
	// A connection string that did not parse at all may not tokenize as secretsOf reads it, and
	// net/url's errors quote pieces of it: keep their reason out.
	ok = ok && !strings.HasPrefix(what, "failed to parse as ")
	if inner != nil {
		what = strings.TrimSuffix(what, " ("+inner.Error()+")")
	}
	if ok {
		what = redactSecrets(what, connString, secrets) // pgconn's message may quote a value
	}
	if inner != nil {
		var num *strconv.NumError
		switch {
		case errors.As(inner, &num):
			what += fmt.Sprintf(" (%q is not a valid number)", num.Num)
		case strings.HasPrefix(inner.Error(), "time: "):
			what += " (" + inner.Error() + ")" // the value of a pool_ duration parameter
		case ok:
			what += " (" + redactSecrets(inner.Error(), connString, secrets) + ")"
		}
	}
	return fmt.Errorf("pgxlanes: connection string: %s", what)
}

// secretsOf returns the values of the password and sslpassword parameters of connString, in the
// forms an error may quote them; ok is false if the string cannot be read well enough to find
// them.
func secretsOf(connString string) (secrets []string, ok bool) {
	add := func(v string) {
		if v == "" {
			return
		}
		secrets = append(secrets, v, strconv.Quote(v), strings.Trim(strconv.Quote(v), `"`), url.QueryEscape(v), url.PathEscape(v))
	}
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		rest := connString[strings.Index(connString, "://")+3:]
		if at := strings.LastIndex(strings.SplitN(rest, "/", 2)[0], "@"); at >= 0 {
			if _, pw, found := strings.Cut(rest[:at], ":"); found {
				add(pw)
				if u, err := url.PathUnescape(pw); err == nil {
					add(u)
				}
			}
		}
		if _, q, found := strings.Cut(connString, "?"); found {
			for _, kv := range strings.Split(q, "&") {
				k, v, _ := strings.Cut(kv, "=")
				if k == "password" || k == "sslpassword" {
					add(v)
					if u, err := url.QueryUnescape(v); err == nil {
						add(u)
					}
				}
			}
		}
		return secrets, true
	}
	// Keyword/value: the values of password and sslpassword, as pgconn reads them.
	s := strings.TrimLeft(connString, " \t\n\r\v\f")
	for len(s) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, false
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t\n\r\v\f")
		var raw string
		if strings.HasPrefix(s, "'") {
			end := 1
			for ; end < len(s) && s[end] != '\''; end++ {
				if s[end] == '\\' {
					end++
				}
			}
			if end >= len(s) {
				return nil, false // unterminated: a secret may run to the end
			}
			raw, s = s[1:end], s[end+1:]
		} else {
			end := 0
			for ; end < len(s) && !strings.ContainsRune(" \t\n\r\v\f", rune(s[end])); end++ {
				if s[end] == '\\' {
					end++
				}
			}
			end = min(end, len(s))
			raw, s = s[:end], s[end:]
		}
		s = strings.TrimLeft(s, " \t\n\r\v\f")
		if strings.HasSuffix(key, "password") {
			add(raw)
			add(strings.NewReplacer(`\'`, `'`, `\\`, `\`, `\ `, ` `).Replace(raw))
		}
	}
	return secrets, true
}

// redactSecrets returns msg without connString and without any of secrets.
func redactSecrets(msg, connString string, secrets []string) string {
	msg = strings.ReplaceAll(msg, connString, "<connection string>")
	for _, sec := range secrets {
		if sec != "" && sec != `""` {
			msg = strings.ReplaceAll(msg, sec, "xxxxx")
		}
	}
	return msg
}

// laneSettings are the lane_<lane>_<setting> parameters and the fields they set.
var laneSettings = []struct {
	name  string
	field string
	i     func(*LaneConfig) *int
	d     func(*LaneConfig) *time.Duration
	a     func(*LaneConfig) *Action
	set   func(lc *LaneConfig, key, setting, v string) error // a setting of its own kind
	s     func(*LaneConfig) *string
}{
	{name: "reserved", field: "Reserved", i: func(l *LaneConfig) *int { return &l.Reserved }},
	{name: "max_conns", field: "MaxConns", i: func(l *LaneConfig) *int { return &l.MaxConns }},
	{name: "max_waiters", field: "MaxWaiters", i: func(l *LaneConfig) *int { return &l.MaxWaiters }},
	{name: "acquire_timeout", field: "AcquireTimeout", d: func(l *LaneConfig) *time.Duration { return &l.AcquireTimeout }},
	{name: "statement_timeout", field: "StatementTimeout", d: func(l *LaneConfig) *time.Duration { return &l.StatementTimeout }},
	{name: "lock_timeout", field: "LockTimeout", d: func(l *LaneConfig) *time.Duration { return &l.LockTimeout }},
	{name: "budget", field: "Budget", d: func(l *LaneConfig) *time.Duration { return &l.Budget }},
	{name: "over_budget", field: "OverBudget", a: func(l *LaneConfig) *Action { return &l.OverBudget }},
	{name: "slow_threshold", field: "SlowThreshold", d: func(l *LaneConfig) *time.Duration { return &l.SlowThreshold }},
	{name: "fleet_max_conns", field: "FleetMaxConns", i: func(l *LaneConfig) *int { return &l.FleetMaxConns }},
	{name: "priority_age", field: "PriorityAge", d: func(l *LaneConfig) *time.Duration { return &l.PriorityAge }},
	{name: "priority_headroom", field: "PriorityHeadroom", i: func(l *LaneConfig) *int { return &l.PriorityHeadroom }},
	{name: "max_tag_share", field: "MaxTagShare", set: setShareParam},
	{name: "tag_share_dry_run", field: "TagShareDryRun", set: setShareParam},
	{name: "fleet_name", field: "FleetName", s: func(l *LaneConfig) *string { return &l.FleetName }},
}

// dsnName returns the DSN setting name of a LaneConfig field.
func dsnName(field string) string {
	for _, s := range laneSettings {
		if s.field == field {
			return s.name
		}
	}
	return strings.ToLower(field)
}

// setLaneParam applies one lane_<lane>_<setting> parameter.
func (c *Config) setLaneParam(key, v string) error {
	name, setting, ok := strings.Cut(strings.TrimPrefix(key, "lane_"), "_")
	if !ok {
		return fmt.Errorf("pgxlanes: DSN parameter %s: want lane_<short|tx|long>_<setting>", key)
	}
	l, err := ParseLane(name)
	if err != nil {
		return fmt.Errorf("pgxlanes: DSN parameter %s: unknown lane %q (lanes are short, tx, long)", key, name)
	}
	lc := c.Lane(l)
	for _, s := range laneSettings {
		if s.name != setting {
			continue
		}
		switch {
		case s.set != nil:
			return s.set(lc, key, setting, v)
		case s.s != nil:
			if v == "" {
				return fmt.Errorf("pgxlanes: DSN parameter %s: empty (leave it out for the default)", key)
			}
			*s.s(lc) = v
		case s.a != nil:
			a, err := ParseAction(v)
			if err != nil {
				return fmt.Errorf("pgxlanes: DSN parameter %s: %q is not flag, cancel or terminate", key, v)
			}
			*s.a(lc) = a
		case s.i != nil:
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("pgxlanes: DSN parameter %s: %q is not a whole number ≥ 0", key, v)
			}
			if n == 0 {
				n = Off
			}
			*s.i(lc) = n
		default:
			d, err := parseDuration(v)
			if err != nil {
				return fmt.Errorf("pgxlanes: DSN parameter %s: %w", key, err)
			}
			*s.d(lc) = d
		}
		return nil
	}
	names := make([]string, len(laneSettings))
	for i, s := range laneSettings {
		names[i] = s.name
	}
	return fmt.Errorf("pgxlanes: DSN parameter %s: unknown lane setting %q (settings are %s)", key, setting, strings.Join(names, ", "))
}

// parseDuration reads a DSN duration: a Go duration with a unit, or 0 for off. A bare number is
// refused: read as milliseconds, lane_tx_budget=10 would be 10ms next to a 10s default.
func parseDuration(v string) (time.Duration, error) {
	if v == "0" {
		return Off, nil
	}
	if _, err := strconv.ParseFloat(v, 64); err == nil {
		return 0, fmt.Errorf("%q has no unit (write %sms or %ss; 0 turns it off)", v, v, v)
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (use 250ms, 1s, 2m; 0 turns it off)", v)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q is negative", v)
	}
	if d == 0 {
		return Off, nil
	}
	return d, nil
}
