package pgxlanes

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file decides a lane's statement_timeout and lock_timeout from every place they may be set.
// The precedence, highest first (docs/design.md, "Setting sources and precedence"):
//
//  1. the lane's own setting, when given (lane_<lane>_statement_timeout, LaneConfig fields);
//  2. the user's or the DBA's value: the DSN's runtime parameters and options=-c, a SET in
//     AfterConnect, ALTER ROLE / ALTER DATABASE ... SET, the server's configuration;
//  3. the lane's default (LaneConfig's table), for what nobody set.
//
// pgxlanes puts nothing in the startup packet, so RESET restores the user's values and a session
// taken with Hijack has them. Short's hold time must stay bounded for it to borrow: a user's
// statement_timeout of 0 does not reach Short (its default stays, with a log line naming both).

// userValue is a setting as a session has it before pgxlanes sets anything.
type userValue struct {
	v      time.Duration // Off for 0 (no timeout)
	set    bool          // someone set it; false: PostgreSQL's default
	source string        // where: "dsn", or pg_settings.source
}

// userTimeouts are the user's statement_timeout and lock_timeout.
type userTimeouts struct{ stmt, lock userValue }

// explicitTimeouts records which lane settings the user gave, before NewWithConfig filled in
// the defaults: those win over the user's session values.
type explicitTimeouts [numLanes]struct{ stmt, lock, budget bool }

func explicitOf(c *Config) explicitTimeouts {
	var e explicitTimeouts
	for _, l := range Lanes() {
		lc := c.Lane(l)
		e[l].stmt, e[l].lock, e[l].budget = lc.StatementTimeout != 0, lc.LockTimeout != 0, lc.Budget != 0
	}
	return e
}

// pgDuration reads a PostgreSQL time setting: a number in milliseconds, or with a unit (us, ms,
// s, min, h, d), possibly with spaces between. 0 is Off.
func pgDuration(s string) (time.Duration, bool) {
	s = strings.TrimSpace(strings.Trim(strings.TrimSpace(s), `'"`))
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	n, err := strconv.ParseFloat(s[:i], 64)
	if err != nil || n < 0 {
		return 0, false
	}
	unit := time.Millisecond
	switch strings.TrimSpace(s[i:]) {
	case "", "ms":
	case "us":
		unit = time.Microsecond
	case "s":
		unit = time.Second
	case "min":
		unit = time.Minute
	case "h":
		unit = time.Hour
	case "d":
		unit = 24 * time.Hour
	default:
		return 0, false
	}
	d := time.Duration(n * float64(unit))
	if d == 0 {
		return Off, true
	}
	return d, true
}

// dsnTimeouts reads the user's values from the connection string: a runtime parameter
// (statement_timeout=60000) wins over options=-c, as it does in PostgreSQL. A value PostgreSQL
// would refuse is left to the server, which says so at connect.
func dsnTimeouts(cc *pgx.ConnConfig) userTimeouts {
	var u userTimeouts
	opts := parseOptions(cc.RuntimeParams["options"])
	for _, s := range []struct {
		name string
		uv   *userValue
	}{{"statement_timeout", &u.stmt}, {"lock_timeout", &u.lock}} {
		v, ok := cc.RuntimeParams[s.name]
		if !ok {
			v, ok = opts[s.name]
		}
		if !ok {
			continue
		}
		if d, ok := pgDuration(v); ok {
			*s.uv = userValue{v: d, set: true, source: "dsn"}
		}
	}
	return u
}

// parseOptions reads the -c name=value and --name=value switches of the options parameter.
func parseOptions(s string) map[string]string {
	out := map[string]string{}
	f := strings.Fields(s)
	for i := 0; i < len(f); i++ {
		kv := ""
		switch {
		case f[i] == "-c" && i+1 < len(f):
			i++
			kv = f[i]
		case strings.HasPrefix(f[i], "-c"):
			kv = f[i][2:]
		case strings.HasPrefix(f[i], "--"):
			kv = f[i][2:]
		default:
			continue
		}
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[strings.ReplaceAll(strings.ToLower(k), "-", "_")] = v
		}
	}
	return out
}

// serverTimeouts reads the values a new session has, after the user's AfterConnect, and those
// RESET restores. It runs on pgconn, so that no tracer sees it.
func serverTimeouts(ctx context.Context, c *pgconn.PgConn) (userTimeouts, LaneConfig, error) {
	var u userTimeouts
	reset := LaneConfig{StatementTimeout: Off, LockTimeout: Off}
	res, err := c.Exec(ctx, guardTag+"select name, setting, source, reset_val from pg_settings where name in ('statement_timeout', 'lock_timeout')").ReadAll()
	if err != nil {
		return u, reset, fmt.Errorf("pgxlanes: reading the session's statement_timeout and lock_timeout: %w", err)
	}
	for _, r := range res {
		for _, row := range r.Rows {
			if len(row) != 4 {
				continue
			}
			cur, ok1 := pgDuration(string(row[1]))
			rst, ok2 := pgDuration(string(row[3]))
			if !ok1 || !ok2 {
				continue
			}
			uv := userValue{v: cur, set: string(row[2]) != "default", source: string(row[2])}
			switch string(row[0]) {
			case "statement_timeout":
				u.stmt, reset.StatementTimeout = uv, rst
			case "lock_timeout":
				u.lock, reset.LockTimeout = uv, rst
			}
		}
	}
	return u, reset, nil
}

// effectiveTimeouts applies the precedence to lane l: lc is the lane's resolved configuration
// (the defaults filled in), e which of its settings the user gave. It returns lc with the user's
// values where they apply, and a note when Short keeps its default over a user's value of 0.
func effectiveTimeouts(l Lane, lc LaneConfig, e explicitTimeouts, u userTimeouts) (LaneConfig, string) {
	def := laneDefaults[l]
	note := ""
	if !e[l].stmt {
		lc.StatementTimeout = def.StatementTimeout
		if u.stmt.set {
			if l == Short && u.stmt.v == Off {
				note = fmt.Sprintf("short lane keeps statement_timeout %v (lane_short_statement_timeout's default) over the session's statement_timeout 0 (from %s): "+
					"Short borrows other lanes' connections only while its hold time is bounded; set lane_short_statement_timeout to choose", def.StatementTimeout, u.stmt.source)
			} else {
				lc.StatementTimeout = u.stmt.v
			}
		}
	}
	if !e[l].lock {
		lc.LockTimeout = def.LockTimeout
		if u.lock.set {
			lc.LockTimeout = u.lock.v
		}
	}
	if l == Short && !e[l].budget {
		lc.Budget = Off
		if lc.StatementTimeout > 0 {
			lc.Budget = lc.StatementTimeout + time.Second
		}
	}
	return lc, note
}

// sessionLearner reads, once per server, the timeouts a new session has, and sets the lanes'
// timeouts and session SQL from them (the first connection, after the user's AfterConnect; a
// failure is retried with the next connection). Every lease comes after a connection's
// AfterConnect, so every lease sees the result.
type sessionLearner struct {
	done atomic.Bool
	mu   sync.Mutex // serializes the first reads
}

// learnSession is called in AfterConnect of every connection of srv.
func (p *Pool) learnSession(ctx context.Context, srv *server, c *pgx.Conn) error {
	if p.pooler || srv.learner.done.Load() {
		return nil
	}
	srv.learner.mu.Lock()
	defer srv.learner.mu.Unlock()
	if srv.learner.done.Load() {
		return nil
	}
	u, reset, err := serverTimeouts(ctx, c.PgConn())
	if err != nil {
		return err
	}
	srv.sql.defaults = reset
	for _, l := range Lanes() {
		lr := &p.lanes[l]
		if lr.srv != srv {
			continue
		}
		// Only the fields read once a connection is leased are written: the acquire path reads
		// the others (the acquire timeout) before any connection exists.
		eff, note := effectiveTimeouts(l, lr.cfg, p.explicit, u)
		lr.cfg.StatementTimeout, lr.cfg.LockTimeout, lr.cfg.Budget = eff.StatementTimeout, eff.LockTimeout, eff.Budget
		lr.ladderFirst = ladderFirst(on(lr.cfg.Budget), lr.cfg.OverBudget)
		if note != "" && u.stmt.source != "client" {
			p.obs.logger.LogAttrs(ctx, slog.LevelWarn, "pgxlanes: "+note)
		}
		lr.session = srv.sql.session(lr.cfg, false, 0)
		lr.txSession = srv.sql.session(lr.cfg, true, lr.cfg.Budget)
	}
	srv.learner.done.Store(true)
	return nil
}
