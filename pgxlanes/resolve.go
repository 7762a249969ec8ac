package pgxlanes

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// defaultCancelGrace is Config.CancelGrace's default.
const defaultCancelGrace = 2 * time.Second

// laneDefaults are the lanes' defaults that do not depend on the pool's size.
var laneDefaults = [numLanes]LaneConfig{
	Short: {AcquireTimeout: time.Second, StatementTimeout: 5 * time.Second, LockTimeout: time.Second,
		OverBudget: ActionCancel, SlowThreshold: time.Second, FleetMaxConns: Off},
	Tx: {AcquireTimeout: 10 * time.Second, StatementTimeout: 30 * time.Second, LockTimeout: 10 * time.Second,
		Budget: 30 * time.Second, OverBudget: ActionCancel, SlowThreshold: Off, FleetMaxConns: Off},
	Long: {AcquireTimeout: 30 * time.Second, StatementTimeout: Off, LockTimeout: 30 * time.Second,
		Budget: 10 * time.Minute, OverBudget: ActionFlag, SlowThreshold: Off, FleetMaxConns: Off},
}

// resolve returns a copy of c with every default filled in for c.MaxConns, or an error that
// names the field and DSN parameter at fault. It is the one place where a Config is checked.
func (c *Config) resolve() (*Config, error) {
	if c == nil {
		return nil, errors.New("pgxlanes: Config must not be nil")
	}
	if c.Config == nil || c.ConnConfig == nil || !parsedByPgxpool(c.Config) {
		return nil, errors.New("pgxlanes: Config must be created by ParseConfig (its pgxpool.Config or ConnConfig is nil)")
	}
	r := c.Copy()
	if r.MaxConns < 1 {
		return nil, fmt.Errorf("pgxlanes: MaxConns (pool_max_conns) must be at least 1, got %d", r.MaxConns)
	}
	switch {
	case r.CancelGrace == 0:
		r.CancelGrace = defaultCancelGrace
	case r.CancelGrace < 0:
		return nil, fmt.Errorf("pgxlanes: CancelGrace must be positive, got %v", r.CancelGrace)
	}
	for _, l := range Lanes() {
		if err := r.Lane(l).check(l, r.TransactionPooler); err != nil {
			return nil, err
		}
	}

	// Sizes, lane by lane: each lane's defaults depend on the reserves resolved before it. A lane
	// on another server is sized by that server's pool.
	n := int(r.MaxConns)
	reserveOf := func(lc *LaneConfig, def int) {
		switch lc.Reserved {
		case 0:
			lc.Reserved = def
		case Off:
			lc.Reserved = 0
		}
	}
	reserveOf(&r.Short, shortReserve(n))
	reserveOf(&r.Tx, max(n-r.Short.Reserved, 0)/2)
	reserveOf(&r.Long, 0)
	primary, remote := r.lanesOn()
	sum := 0
	for _, l := range primary {
		sum += r.Lane(l).Reserved
	}
	if sum > n {
		// Name the parameters the user gave: those are what to change.
		var parts, given []string
		for _, l := range Lanes() {
			part := fmt.Sprintf("%s %d", l, r.Lane(l).Reserved)
			if c.Lane(l).Reserved != 0 {
				name := fmt.Sprintf("lane_%s_reserved", l)
				part += " from Reserved (" + name + ")"
				given = append(given, name)
			}
			parts = append(parts, part)
		}
		fix := "raise MaxConns (pool_max_conns)"
		if len(given) > 0 {
			fix = "lower " + strings.Join(given, " or ") + ", or " + fix
		}
		return nil, fmt.Errorf("pgxlanes: the lanes reserve %d connections in all (%s), more than MaxConns (pool_max_conns) %d: %s",
			sum, strings.Join(parts, ", "), n, fix)
	}
	rc := r.reserveConfig(primary, n)
	for i, l := range primary {
		lc := r.Lane(l)
		if lc.MaxConns == 0 {
			switch l {
			case Short:
				lc.MaxConns = n
			case Tx:
				lc.MaxConns = rc.Reachable(i)
			case Long:
				lc.MaxConns = min(max((n-r.Short.Reserved)/4, 1), max(rc.Reachable(i), 1))
			}
			rc.Lanes[i].MaxConns = lc.MaxConns
		}
	}
	for _, l := range remote {
		lc := r.Lane(l)
		if lc.MaxConns == 0 {
			lc.MaxConns = int(max(lc.Server.MaxConns, 1))
		}
	}
	for _, l := range Lanes() {
		lc := r.Lane(l)
		if lc.MaxWaiters == 0 {
			lc.MaxWaiters = 32 * max(lc.MaxConns, 1)
		}
	}

	// Timeouts and budgets.
	for _, l := range Lanes() {
		lc, def := r.Lane(l), laneDefaults[l]
		for _, f := range []struct{ v, d *time.Duration }{
			{&lc.AcquireTimeout, &def.AcquireTimeout}, {&lc.StatementTimeout, &def.StatementTimeout},
			{&lc.LockTimeout, &def.LockTimeout}, {&lc.SlowThreshold, &def.SlowThreshold},
		} {
			if *f.v == 0 {
				*f.v = *f.d
			}
		}
		if lc.Budget == 0 {
			lc.Budget = def.Budget
			if l == Short {
				lc.Budget = Off
				if lc.StatementTimeout > 0 {
					lc.Budget = lc.StatementTimeout + time.Second
				}
			}
		}
		if lc.OverBudget == 0 {
			lc.OverBudget = def.OverBudget
		}
		if lc.FleetMaxConns == 0 {
			lc.FleetMaxConns = Off
		}
		lc.resolvePriority(l)
	}
	if err := reserve.Validate(r.reserveConfig(primary, n)); err != nil {
		return nil, fromReserveConfig(err)
	}
	for _, l := range remote {
		if err := reserve.Validate(r.reserveConfig([]Lane{l}, r.Lane(l).MaxConns)); err != nil {
			return nil, fromReserveConfig(err)
		}
	}
	if r.Long.Server != nil && r.Short.SlowThreshold > 0 {
		if c.Short.SlowThreshold > 0 {
			return nil, errors.New("pgxlanes: short lane: SlowThreshold (lane_short_slow_threshold) cannot be set while Long is on another server (LaneConfig.Server): a statement learned as slow would go to that server")
		}
		r.Short.SlowThreshold = Off
	}
	if r.Short.StatementTimeout <= 0 && r.Short.Budget <= 0 {
		return nil, errors.New("pgxlanes: short lane: StatementTimeout (lane_short_statement_timeout) and Budget (lane_short_budget) are both off: " +
			"Short borrows other lanes' idle connections, which is safe only while its hold time is bounded; set one of them")
	}
	return r, nil
}

// check validates what does not depend on the pool's size. Zero and Off are always valid.
func (lc *LaneConfig) check(l Lane, pooler bool) error {
	bad := func(field, format string, args ...any) error {
		name := fmt.Sprintf("%s (lane_%s_%s)", field, l, dsnName(field))
		if field == "Server" {
			name = "Server" // set in code only
		}
		return fmt.Errorf("pgxlanes: %s lane: %s %s", l, name, fmt.Sprintf(format, args...))
	}
	for _, f := range []struct {
		field string
		v     int64
	}{
		{"Reserved", int64(lc.Reserved)}, {"MaxConns", int64(lc.MaxConns)}, {"MaxWaiters", int64(lc.MaxWaiters)},
		{"AcquireTimeout", int64(lc.AcquireTimeout)}, {"StatementTimeout", int64(lc.StatementTimeout)},
		{"LockTimeout", int64(lc.LockTimeout)}, {"Budget", int64(lc.Budget)},
		{"SlowThreshold", int64(lc.SlowThreshold)}, {"FleetMaxConns", int64(lc.FleetMaxConns)},
		{"PriorityHeadroom", int64(lc.PriorityHeadroom)},
	} {
		if f.v < 0 && f.v != Off {
			return bad(f.field, "must be positive, zero for the default, or Off; got %d", f.v)
		}
	}
	if lc.MaxConns == Off {
		return bad("MaxConns", "cannot be Off (0 in a connection string): a lane needs a cap of at least 1; leave it out (zero in a LaneConfig) for the default")
	}
	if err := lc.checkPriority(l, bad); err != nil {
		return err
	}
	if lc.OverBudget > ActionTerminate {
		return bad("OverBudget", "must be ActionFlag, ActionCancel or ActionTerminate, got %v", lc.OverBudget)
	}
	if pooler && lc.OverBudget == ActionTerminate {
		return bad("OverBudget", "terminate needs the server's backend PID, which a transaction pooler hides (TransactionPooler is set): use cancel")
	}
	if l != Short && lc.SlowThreshold > 0 {
		return bad("SlowThreshold", "is Short's alone: only statements sent to Short without an annotation are learned")
	}
	if l != Long && lc.FleetMaxConns > 0 {
		return bad("FleetMaxConns", "is Long's alone")
	}
	if l != Long && lc.FleetName != "" {
		return bad("FleetName", "is Long's alone")
	}
	if l != Long && lc.Server != nil {
		return bad("Server", "is Long's alone: Short and Tx carry the writes and unannotated statements, which belong on the primary")
	}
	if lc.Server != nil && (lc.Server.ConnConfig == nil || !parsedByPgxpool(lc.Server) || lc.Server.MaxConns < 1) {
		return bad("Server", "must be made by pgxpool.ParseConfig, with MaxConns at least 1")
	}
	if pooler && lc.FleetMaxConns > 0 {
		return bad("FleetMaxConns", "needs session-level advisory locks, which a transaction pooler cannot keep (TransactionPooler is set)")
	}
	for _, f := range []struct {
		field string
		v     time.Duration
	}{{"StatementTimeout", lc.StatementTimeout}, {"LockTimeout", lc.LockTimeout}} {
		if f.v > maxPGTimeout {
			return bad(f.field, "%v exceeds PostgreSQL's largest timeout (%v)", f.v, maxPGTimeout)
		}
	}
	return nil
}

// parsedByPgxpool reports whether pc was made by pgxpool.ParseConfig (or copied from one that
// was), which pgxpool.NewWithConfig requires, and panics without: it reads pgxpool's unexported
// mark, and says yes if a pgx release has none.
func parsedByPgxpool(pc *pgxpool.Config) bool {
	f := reflect.ValueOf(pc).Elem().FieldByName("createdByParseConfig")
	return !f.IsValid() || f.Kind() != reflect.Bool || f.Bool()
}

// reserveConfig is the admission configuration of the lanes of one server, of size n; Off
// becomes reserve's "none". A lane's index in it is its index in lanes.
func (r *Config) reserveConfig(lanes []Lane, n int) reserve.Config {
	rc := reserve.Config{Size: n}
	for _, l := range lanes {
		lc := r.Lane(l)
		rc.Lanes = append(rc.Lanes, reserve.LaneConfig{Name: l.String(), Reserved: lc.Reserved, MaxConns: lc.MaxConns,
			MaxWaiters: on(lc.MaxWaiters), Bounded: l == Short, AcquireTimeout: on(lc.AcquireTimeout),
			PriorityAge: on(lc.PriorityAge), MaxTagShare: lc.tagShareSlots(), TagShareDryRun: lc.TagShareDryRun,
			PriorityHeadroom: on(lc.PriorityHeadroom)})
	}
	return rc
}

// fromReserveConfig names a reserve configuration error by field and DSN parameter.
func fromReserveConfig(err error) error {
	var ce *reserve.ConfigError
	if !errors.As(err, &ce) {
		return fmt.Errorf("pgxlanes: %w", err)
	}
	if ce.Lane == "" {
		return fmt.Errorf("pgxlanes: MaxConns (pool_max_conns): %s", ce.Reason)
	}
	return fmt.Errorf("pgxlanes: %s lane: %s (lane_%s_%s) %s", ce.Lane, ce.Field, ce.Lane, dsnName(ce.Field), ce.Reason)
}

// on returns v, or 0 for Off: what the runtime uses for "none".
func on[T ~int | ~int64](v T) T {
	if v < 0 {
		return 0
	}
	return v
}
