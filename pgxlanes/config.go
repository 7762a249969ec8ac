package pgxlanes

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LaneConfig configures one lane. ParseConfig fills every field with the defaults below, sized
// for pool_max_conns (N), and with the lane_<lane>_<setting> DSN parameters where given.
//
//	setting            short          tx               long
//	reserved           N/4 (≥1)       (N-short)/2      0
//	max_conns          N              N - short        (N-short)/4 (≥1)
//	max_waiters        32 × max_conns (all lanes)
//	acquire_timeout    1s             10s              30s
//	statement_timeout  5s             30s              0 (none)
//	lock_timeout       1s             10s              30s
//	budget             6s             30s              10m          (short: statement_timeout + 1s)
//	over_budget        cancel         cancel           flag
type LaneConfig struct {
	// Reserved connections no other lane's unbounded work may take (DSN lane_<lane>_reserved).
	// Short's reserve is what keeps short queries from ever queueing behind transactions.
	Reserved int
	// MaxConns caps the connections the lane holds at once (lane_<lane>_max_conns). Short may
	// borrow idle connections up to this cap; Tx and Long never exceed their reserve plus the
	// shared connections, whatever their cap.
	MaxConns int
	// MaxWaiters bounds the lane's queue (lane_<lane>_max_waiters): a caller beyond it fails at
	// once with ErrLaneFull instead of adding to a queue that cannot drain in time. 0 means
	// unbounded. Default 32 × MaxConns: more than that cannot be served within an acquire timeout
	// unless the work is far shorter than the timeout.
	MaxWaiters int
	// AcquireTimeout bounds the wait for a connection (lane_<lane>_acquire_timeout), including
	// the time to open one. A short query fails within about a second instead of waiting behind a
	// full pool; transactions may wait longer. 0 means wait until the caller's ctx ends.
	AcquireTimeout time.Duration
	// StatementTimeout is PostgreSQL's statement_timeout for the lane's statements
	// (lane_<lane>_statement_timeout). The server enforces it, so a frozen client cannot keep a
	// statement running; the client enforces the lane's Budget too (Short's is the statement
	// timeout plus 1s), with a protocol cancel request that keeps the connection. Short's bounds
	// its hold time, which is what makes its borrowing safe. 0 disables it.
	StatementTimeout time.Duration
	// LockTimeout is PostgreSQL's lock_timeout (lane_<lane>_lock_timeout): a short lookup stops
	// waiting on a row lock held by a transaction after 1s instead of queueing behind it. 0
	// disables it.
	LockTimeout time.Duration
	// Budget is how long a lease of this lane (a transaction, a held connection, a query's open
	// rows) may last (lane_<lane>_budget); WithBudget overrides it per call. 0 means no budget.
	Budget time.Duration
	// OverBudget is what happens to a lease that outlives its budget (lane_<lane>_over_budget =
	// flag, cancel or terminate). The escalation ladder:
	//
	//	flag:      at Budget, a warning with the call site; the work goes on
	//	cancel:    at Budget/2 a warning; at Budget the running statement is cancelled and the
	//	           lease's next call fails; at 2×Budget, if still held, the session is terminated
	//	terminate: at Budget/2 a warning; at Budget the session is terminated
	//
	// For cancel and terminate, BEGIN also sets idle_in_transaction_session_timeout (and caps
	// statement_timeout) to just beyond the last step, so the server ends the transaction even if
	// the client is frozen or gone.
	OverBudget Action
}

// Config is the configuration of a Pool. Create it with ParseConfig; the embedded pgxpool.Config
// keeps every pgxpool setting, and MaxConns is the total shared by the lanes.
type Config struct {
	*pgxpool.Config

	Short LaneConfig
	Tx    LaneConfig
	Long  LaneConfig

	// CancelGrace is how long a connection whose context ended waits for the server to answer the
	// protocol cancel request before its socket is closed. Default 2s. Cancelling instead of
	// closing keeps the connection: a timed-out query costs no new server session.
	CancelGrace time.Duration

	// Logger receives the budget warnings and actions. Default slog.Default().
	Logger *slog.Logger
	// OnViolation, if set, is called for every flag, cancel and terminate, after it was carried out.
	// It runs on the pool's guard goroutine (or the goroutine of the action): keep it short, and do
	// not close the pool from it.
	OnViolation func(Violation)
	// TransactionPooler must be set when the pool connects through a transaction-mode pooler such
	// as PgBouncer with pool_mode=transaction (DSN: pgxlanes_transaction_pooler=true). Such a
	// pooler rejects unknown startup parameters and shares server sessions between clients, so
	// only SET LOCAL is safe: pgxlanes then sets every lane's timeouts with SET LOCAL inside
	// transactions, never in the startup packet or with a session SET, and plain statements are
	// bounded by the client-side cancel alone. Default false.
	TransactionPooler bool

	// CaptureCallSites records the stack of every acquire, so that budget warnings name the code
	// that took the connection, as HikariCP's leak detection does. It costs an allocation and a
	// stack walk per acquire: off by default; turn it on to hunt a leak.
	CaptureCallSites bool

	// sizedFor is the MaxConns the lanes were sized for, sized the lanes as ParseConfig left them
	// and explicit the DSN's lane parameters; NewWithConfig resizes untouched lanes when MaxConns
	// changed after ParseConfig.
	sizedFor int32
	sized    [numLanes]LaneConfig
	explicit map[string]string
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

func (c *Config) lanes() [numLanes]LaneConfig { return [numLanes]LaneConfig{c.Short, c.Tx, c.Long} }

// Copy returns a deep copy of c.
func (c *Config) Copy() *Config {
	n := *c
	if c.Config != nil {
		n.Config = c.Config.Copy()
	}
	return &n
}

// ParseConfig parses connString like pgxpool.ParseConfig, plus the lane parameters
// lane_<short|tx|long>_<reserved|max_conns|max_waiters|acquire_timeout|statement_timeout|lock_timeout|budget>.
// Durations are Go durations ("1s", "250ms") or whole milliseconds ("1000"). The lane parameters
// are not sent to the server. Errors name the bad parameter and never contain the password.
func ParseConfig(connString string) (*Config, error) {
	pc, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("pgxlanes: %w", err) // pgconn redacts the password
	}
	explicit := map[string]string{}
	pooler := false
	if v, ok := pc.ConnConfig.RuntimeParams["pgxlanes_transaction_pooler"]; ok {
		delete(pc.ConnConfig.RuntimeParams, "pgxlanes_transaction_pooler")
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("pgxlanes: DSN parameter pgxlanes_transaction_pooler: %q is not true or false", v)
		}
		pooler = b
	}
	for k, v := range pc.ConnConfig.RuntimeParams {
		if strings.HasPrefix(k, "lane_") {
			explicit[k] = v
			delete(pc.ConnConfig.RuntimeParams, k)
		}
	}
	c := &Config{Config: pc, CancelGrace: 2 * time.Second, TransactionPooler: pooler, explicit: explicit}
	if err := c.sizeLanes(); err != nil {
		return nil, err
	}
	return c, nil
}

// laneSettings are the lane_<lane>_<setting> parameters and the fields they set.
var laneSettings = []struct {
	name string
	i    func(*LaneConfig) *int
	d    func(*LaneConfig) *time.Duration
	a    func(*LaneConfig) *Action
}{
	{name: "reserved", i: func(l *LaneConfig) *int { return &l.Reserved }},
	{name: "max_conns", i: func(l *LaneConfig) *int { return &l.MaxConns }},
	{name: "max_waiters", i: func(l *LaneConfig) *int { return &l.MaxWaiters }},
	{name: "acquire_timeout", d: func(l *LaneConfig) *time.Duration { return &l.AcquireTimeout }},
	{name: "statement_timeout", d: func(l *LaneConfig) *time.Duration { return &l.StatementTimeout }},
	{name: "lock_timeout", d: func(l *LaneConfig) *time.Duration { return &l.LockTimeout }},
	{name: "budget", d: func(l *LaneConfig) *time.Duration { return &l.Budget }},
	{name: "over_budget", a: func(l *LaneConfig) *Action { return &l.OverBudget }},
}

// sizeLanes sets every lane to its defaults for MaxConns, then applies the explicit DSN
// parameters. A lane's defaults depend on the lanes before it (Tx's on Short's reserve), so each
// lane gets its parameters before the next one's defaults are computed.
func (c *Config) sizeLanes() error {
	for k := range c.explicit {
		if _, _, err := splitLaneParam(k); err != nil {
			return err
		}
	}
	n := int(c.MaxConns)
	shortReserved := min(max(n/4, 1), n-1)
	c.Short = LaneConfig{Reserved: shortReserved, MaxConns: n, AcquireTimeout: time.Second,
		StatementTimeout: 5 * time.Second, LockTimeout: time.Second, Budget: 6 * time.Second, OverBudget: ActionCancel}
	if err := c.applyExplicit(Short); err != nil {
		return err
	}
	rest := max(n-c.Short.Reserved, 0)
	c.Tx = LaneConfig{Reserved: rest / 2, MaxConns: rest, AcquireTimeout: 10 * time.Second,
		StatementTimeout: 30 * time.Second, LockTimeout: 10 * time.Second, Budget: 30 * time.Second, OverBudget: ActionCancel}
	if err := c.applyExplicit(Tx); err != nil {
		return err
	}
	c.Long = LaneConfig{Reserved: 0, MaxConns: max(rest/4, 1), AcquireTimeout: 30 * time.Second,
		StatementTimeout: 0, LockTimeout: 30 * time.Second, Budget: 10 * time.Minute, OverBudget: ActionFlag}
	if err := c.applyExplicit(Long); err != nil {
		return err
	}
	for _, l := range Lanes() {
		lc := c.Lane(l)
		if _, set := c.explicit["lane_"+l.String()+"_max_waiters"]; !set {
			lc.MaxWaiters = 32 * lc.MaxConns
		}
	}
	c.sizedFor = c.MaxConns
	c.sized = c.lanes()
	return nil
}

func splitLaneParam(key string) (Lane, int, error) {
	rest := strings.TrimPrefix(key, "lane_")
	name, setting, ok := strings.Cut(rest, "_")
	if !ok {
		return 0, 0, fmt.Errorf("pgxlanes: DSN parameter %s: want lane_<short|tx|long>_<setting>", key)
	}
	l, err := ParseLane(name)
	if err != nil {
		return 0, 0, fmt.Errorf("pgxlanes: DSN parameter %s: unknown lane %q (lanes are short, tx, long)", key, name)
	}
	for i, s := range laneSettings {
		if s.name == setting {
			return l, i, nil
		}
	}
	names := make([]string, len(laneSettings))
	for i, s := range laneSettings {
		names[i] = s.name
	}
	return 0, 0, fmt.Errorf("pgxlanes: DSN parameter %s: unknown lane setting %q (settings are %s)", key, setting, strings.Join(names, ", "))
}

func (c *Config) applyExplicit(l Lane) error {
	lc := c.Lane(l)
	for k, v := range c.explicit {
		kl, i, err := splitLaneParam(k)
		if err != nil {
			return err
		}
		if kl != l {
			continue
		}
		s := laneSettings[i]
		if s.a != nil {
			a, err := ParseAction(v)
			if err != nil {
				return fmt.Errorf("pgxlanes: DSN parameter %s: %q is not flag, cancel or terminate", k, v)
			}
			*s.a(lc) = a
			continue
		}
		if s.i != nil {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("pgxlanes: DSN parameter %s: %q is not a whole number ≥ 0", k, v)
			}
			*s.i(lc) = n
			continue
		}
		d, err := parseDuration(v)
		if err != nil {
			return fmt.Errorf("pgxlanes: DSN parameter %s: %w", k, err)
		}
		*s.d(lc) = d
	}
	return nil
}

func parseDuration(v string) (time.Duration, error) {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		if ms < 0 {
			return 0, fmt.Errorf("%q is negative", v)
		}
		if ms > int64(math.MaxInt64/time.Millisecond) {
			return 0, fmt.Errorf("%q milliseconds is too long", v)
		}
		return time.Duration(ms) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (use 1s, 250ms or whole milliseconds)", v)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q is negative", v)
	}
	return d, nil
}

// validate checks c and names the field (and its DSN parameter) at fault.
func (c *Config) validate() error {
	if c.Config == nil || c.ConnConfig == nil {
		return errors.New("pgxlanes: Config must be created by ParseConfig")
	}
	if c.MaxConns < 1 {
		return fmt.Errorf("pgxlanes: MaxConns (pool_max_conns) must be at least 1, got %d", c.MaxConns)
	}
	if c.CancelGrace < 0 {
		return fmt.Errorf("pgxlanes: CancelGrace must not be negative, got %v", c.CancelGrace)
	}
	n := int(c.MaxConns)
	reserved := 0
	for _, l := range Lanes() {
		lc := c.Lane(l)
		bad := func(field, setting, format string, args ...any) error {
			return fmt.Errorf("pgxlanes: %s lane: %s (lane_%s_%s) %s", l, field, l, setting, fmt.Sprintf(format, args...))
		}
		for _, f := range []struct {
			field, setting string
			v              int64
		}{
			{"Reserved", "reserved", int64(lc.Reserved)}, {"MaxConns", "max_conns", int64(lc.MaxConns)},
			{"MaxWaiters", "max_waiters", int64(lc.MaxWaiters)}, {"AcquireTimeout", "acquire_timeout", int64(lc.AcquireTimeout)},
			{"StatementTimeout", "statement_timeout", int64(lc.StatementTimeout)}, {"LockTimeout", "lock_timeout", int64(lc.LockTimeout)},
			{"Budget", "budget", int64(lc.Budget)},
		} {
			if f.v < 0 {
				return bad(f.field, f.setting, "must not be negative")
			}
		}
		if lc.OverBudget < ActionFlag || lc.OverBudget > ActionTerminate {
			return bad("OverBudget", "over_budget", "must be ActionFlag, ActionCancel or ActionTerminate, got %v", lc.OverBudget)
		}
		if c.TransactionPooler && lc.OverBudget == ActionTerminate {
			return bad("OverBudget", "over_budget", "terminate needs the server's backend PID, which a transaction pooler hides (TransactionPooler is set): use cancel")
		}
		if lc.MaxConns < 1 {
			return bad("MaxConns", "max_conns", "must be at least 1")
		}
		if lc.MaxConns > n {
			return bad("MaxConns", "max_conns", "%d exceeds the pool's MaxConns (pool_max_conns) %d", lc.MaxConns, n)
		}
		if lc.Reserved > lc.MaxConns {
			return bad("Reserved", "reserved", "%d exceeds the lane's MaxConns %d", lc.Reserved, lc.MaxConns)
		}
		reserved += lc.Reserved
	}
	if reserved > n {
		return fmt.Errorf("pgxlanes: the lanes reserve %d connections in all (short %d, tx %d, long %d), more than MaxConns (pool_max_conns) %d",
			reserved, c.Short.Reserved, c.Tx.Reserved, c.Long.Reserved, n)
	}
	for _, l := range []Lane{Tx, Long} {
		if c.Lane(l).Reserved == 0 && reserved == n {
			return fmt.Errorf("pgxlanes: %s lane: Reserved (lane_%s_reserved) is 0 and the other lanes reserve all %d connections, so it could never get one", l, l, n)
		}
	}
	return nil
}
