package pgxlanes

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/internal/stmtstats"
	"github.com/pgxlanes/pgxlanes/internal/wire"
	"github.com/pgxlanes/pgxlanes/reserve"
	"github.com/pgxlanes/pgxlanes/txguard"
)

// Pool is a connection pool split into lanes. It has the method set of *pgxpool.Pool, so it
// replaces it with a change of import and constructor, satisfies sqlc's DBTX and this package's
// DB, and works with pgx.BeginFunc, pgx.BeginTxFunc and pgx.CollectRows. It is safe for
// concurrent use.
type Pool struct {
	servers []*server // the primary first, then a server a lane is aimed at
	config  *Config   // resolved: every default filled in
	lanes   [numLanes]laneRuntime
	pooler  bool // Config.TransactionPooler

	guard *txguard.Guard
	sweep sweeper // watches long leases once they near their first step (sweep.go)
	learn *stmtstats.Table
	prob  *probation // Short's tokens for unproven statements; nil without learning
	// anyProven is set by the first fast run of a learned statement: probation applies from then.
	anyProven atomic.Bool
	// learnLog is the learner's log state (learn.go), written only by the reporter.
	learnLog learnLog
	holds    holdStats // the lanes' recent hold times (holdstats.go), recorded by every lease's end
	fleet    *fleet    // the Long lane's fleet-wide cap; nil for none
	obs      observers
	tracer   pgxpool.AcquireTracer // the user's, found on ConnConfig.Tracer
	// explicit says which lane timeouts the user gave: they win over the session's own values
	// (settings.go).
	explicit explicitTimeouts

	shareLog shareLog // rate-limits the tag share's log lines (priority.go)

	closeOnce sync.Once

	status statusLog // recent budget actions and learned changes, for Status (status.go)
}

// laneRuntime is a lane's resolved configuration, the session SQL derived from it once in New,
// and the lane's outcome counters.
type laneRuntime struct {
	cfg LaneConfig
	srv *server // the server the lane is on
	idx int     // the lane's index in srv.res
	// session is staged for a plain statement or held connection of the lane, txSession for a
	// transaction with the lane's own budget; "" when the session defaults are what it needs.
	session   string
	txSession string
	// txLocal follows BEGIN behind a transaction pooler; batchLocals are its statements one by
	// one, for a batch begun with pgx.Batch.BeginTx.
	txLocal     string
	batchLocals []string
	// ladderFirst is when the first step of the lane's own budget is due (sweep.go); 0 for none.
	ladderFirst time.Duration
	counts      laneCounts
}

// callKind says what a lease is for, which decides the session settings it gets.
type callKind uint8

const (
	kindStatement callKind = iota // Query, QueryRow, Exec, SendBatch, CopyFrom, Ping
	kindHeld                      // Acquire, AcquireFunc, AcquireAllIdle, a hand-begun batch
	kindTx                        // Begin, BeginTx, a batch begun with pgx.Batch.BeginTx
)

// New creates a pool from a connection string. See ParseConfig for the lane parameters.
func New(ctx context.Context, connString string) (*Pool, error) {
	cfg, err := ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	return NewWithConfig(ctx, cfg)
}

// NewWithConfig creates a pool from cfg, which must have been created by ParseConfig. It fills
// in every lane default for cfg.MaxConns and validates the result; the error names the field and
// DSN parameter at fault. Like pgxpool, it does not connect before the first use unless
// MinConns > 0.
func NewWithConfig(ctx context.Context, cfg *Config) (*Pool, error) {
	var explicit explicitTimeouts
	if cfg != nil {
		explicit = explicitOf(cfg) // before the defaults are filled in
	}
	cfg, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	p := &Pool{config: cfg, pooler: cfg.TransactionPooler, explicit: explicit}
	p.status.lockTok = make(chan struct{}, 1)
	p.obs.logger = cfg.Logger
	if p.obs.logger == nil {
		p.obs.logger = slog.Default()
	}
	if !cfg.TransactionPooler {
		// The DSN's own timeouts, known now; the server's are read at the first connect.
		for _, l := range Lanes() {
			cc := cfg.ConnConfig
			if s := cfg.Lane(l).Server; s != nil {
				cc = s.ConnConfig
			}
			var note string
			*cfg.Lane(l), note = effectiveTimeouts(l, *cfg.Lane(l), explicit, dsnTimeouts(cc))
			if note != "" {
				p.obs.logger.LogAttrs(ctx, slog.LevelWarn, "pgxlanes: "+note)
			}
		}
	}
	p.obs.onViolation = cfg.OnViolation
	primary, remote := cfg.lanesOn()
	if err := p.addServer(ctx, cfg.Config, primary); err != nil {
		return nil, err
	}
	for _, l := range remote {
		lc := cfg.Lane(l)
		pc := lc.Server.Copy()
		pc.MaxConns = int32(lc.MaxConns)
		if err := p.addServer(ctx, pc, []Lane{l}); err != nil {
			p.Close()
			return nil, err
		}
	}
	if cfg.Short.SlowThreshold > 0 {
		if err := p.newLearner(cfg); err != nil {
			p.Close()
			return nil, err
		}
	}
	p.guard = txguard.New()
	p.startSweeper()
	if n := cfg.Long.FleetMaxConns; n > 0 {
		srv := p.lanes[Long].srv
		name := cfg.Long.FleetName
		if name == "" {
			name = defaultFleetName(srv.pool.Config().ConnConfig)
		}
		p.fleet = newFleet(srv.term, name, n)
	}
	return p, nil
}

// addServer starts the pgxpool and admission of the lanes on one server. The lanes' session SQL
// is computed against PostgreSQL's defaults here, and again against the session's own values when
// the first connection is made (settings.go), before any lease uses it.
func (p *Pool) addServer(ctx context.Context, base *pgxpool.Config, lanes []Lane) error {
	cfg := p.config
	srv := &server{sql: sessionSQL{defaults: LaneConfig{StatementTimeout: Off, LockTimeout: Off}, pooler: cfg.TransactionPooler}}
	for i, l := range lanes {
		lc := *cfg.Lane(l)
		p.lanes[l] = laneRuntime{cfg: lc, srv: srv, idx: i,
			session:   srv.sql.session(lc, false, 0),
			txSession: srv.sql.session(lc, true, lc.Budget),
			txLocal:   srv.sql.local(lc, lc.Budget), batchLocals: srv.sql.batchLocals(lc, lc.Budget),
			ladderFirst: ladderFirst(on(lc.Budget), lc.OverBudget)}
	}
	var err error
	if srv.res, err = reserve.New(cfg.reserveConfig(lanes, int(base.MaxConns))); err != nil {
		return fromReserveConfig(err)
	}
	srv.term = newTerminator(ctx, base, p.obs.logger)
	srv.parks.Store(parkingAllowed(base))
	srv.lifetime = base.MaxConnLifetime
	pc := p.pgxpoolConfig(base, srv)
	srv.connectTimeout = pc.ConnConfig.ConnectTimeout
	if srv.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return fmt.Errorf("pgxlanes: %w", err)
	}
	p.servers = append(p.servers, srv)
	srv.live = make([]liveEntry, min(int(base.MaxConns), liveMax)) // one per slot of srv.res (Size: MaxConns), up to liveMax
	srv.holders.bySlot = make([]*lease, len(srv.live))
	return nil
}

// pgxpoolConfig is the configuration of the pgxpool under the lanes: the user's, with a wire.Conn
// in the path of every connection, and the hooks that read the session's settings and keep the
// pool's figures. Nothing is added to the startup packet: RESET restores the user's settings.
func (p *Pool) pgxpoolConfig(base *pgxpool.Config, srv *server) *pgxpool.Config {
	cfg := p.config
	pc := base.Copy()
	cc := pc.ConnConfig
	// Bound the dial of a connection by the longest acquire timeout, unless the user chose.
	if cc.ConnectTimeout == 0 {
		for _, l := range Lanes() {
			cc.ConnectTimeout = max(cc.ConnectTimeout, on(cfg.Lane(l).AcquireTimeout))
		}
	}
	opts := wire.Options{ResetSQL: resetSQL, Grace: cfg.CancelGrace, NoCancel: cfg.NoCancelRequests}
	if cfg.TransactionPooler {
		opts.Settle = 100 * time.Millisecond // a pooler may acknowledge a cancel before it forwards it
		opts.ResetSQL = ""                   // no session settings: a user's SET LOCAL needs no RESET
	}
	// A wire.Conn in the path of every connection of the pool (wirehook.go), installed on
	// pgxpool's copy of the ConnConfig after the user's BeforeConnect, so that whatever that hook
	// sets is kept.
	userBeforeConnect := pc.BeforeConnect
	pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if userBeforeConnect != nil {
			if err := userBeforeConnect(ctx, cc); err != nil {
				return err
			}
		}
		// The count of Resets as the dial begins: a connection whose dial a Reset overtakes is
		// never parked (park.go), though pgxpool may hand it out once.
		epoch := srv.park.current()
		installWire(cc, opts, func(w *wire.Conn) { w.Epoch = epoch })
		return nil
	}
	if t, ok := cc.Tracer.(pgxpool.AcquireTracer); ok {
		// pgxlanes traces the whole acquire, lane wait included; the pgxpool under it must not
		// trace a second time.
		p.tracer = t
		cc.Tracer = withoutAcquire{cc.Tracer}
	}
	// A ping of an idle connection is bounded by the lane's acquire timeout, a dial is not
	// (pingctx.go).
	pc.ShouldPing = shouldPing(pc.ShouldPing)
	afterConnect, beforeClose := pc.AfterConnect, pc.BeforeClose
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if afterConnect != nil {
			if err := afterConnect(ctx, c); err != nil {
				return err
			}
		}
		if err := p.learnSession(ctx, srv, c); err != nil {
			return err
		}
		if w := wireOf(c.PgConn()); w != nil {
			w.Born = int64(monoNow())
		}
		srv.open.Add(1)
		return nil
	}
	pc.BeforeClose = func(c *pgx.Conn) {
		srv.open.Add(-1)
		if beforeClose != nil {
			beforeClose(c)
		}
	}
	return pc
}

// defaultHandler is the code of pgconn's default BuildContextWatcherHandler, which ParseConfig
// fills in; a function value cannot be compared, but its code pointer can.
var defaultHandler = func() uintptr {
	c, err := pgconn.ParseConfig("host=127.0.0.1")
	if err != nil || c.BuildContextWatcherHandler == nil {
		return 0
	}
	return reflect.ValueOf(c.BuildContextWatcherHandler).Pointer()
}()

// isDefaultHandler reports whether f is nil or pgconn's default handler, as opposed to one the
// user set.
func isDefaultHandler(f func(*pgconn.PgConn) ctxwatch.Handler) bool {
	return f == nil || reflect.ValueOf(f).Pointer() == defaultHandler
}

// Close wakes every waiting caller with ErrClosed, refuses new calls, and closes all
// connections. Like pgxpool's Close, it blocks until every acquired connection is returned.
func (p *Pool) Close() {
	p.closeOnce.Do(func() {
		for _, srv := range p.servers {
			srv.res.Close()
		}
		if p.prob != nil {
			p.prob.close()
		}
		for _, srv := range p.servers {
			srv.park.flush(false, true)
			srv.pool.Close()
		}
		if p.sweep.timer != nil {
			p.closeSweeper()
		}
		if p.guard != nil {
			p.guard.Close()
		}
		if p.fleet != nil {
			p.fleet.close()
		}
		for _, srv := range p.servers {
			srv.holders.lookup.Wait()
			srv.term.close()
		}
	})
}

// Reset closes all idle connections and marks the others to be closed when returned; the lanes
// and their counters are not affected.
func (p *Pool) Reset() {
	for _, srv := range p.servers {
		// pgxpool's Reset first: a lease that takes a connection after the flush below gets one
		// pgxpool opened after the Reset, or one it closes when it comes back (its epoch is old).
		srv.pool.Reset()
		srv.park.flush(true, false) // none acquired before is parked again: pgxpool closes each as it comes back
	}
}

// Config returns a copy of the configuration the pool was created with, with every default
// filled in.
func (p *Pool) Config() *Config { return p.config.Copy() }

// Exec runs sql on a connection of the Short lane (or the lane ctx names, or Long's capacity for a
// statement learned as slow), held until Exec returns. ctx bounds the wait and the statement;
// when it ends, Exec returns at once and the connection is cleaned and kept.
func (p *Pool) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	l, err := p.acquire(ctx, Short, kindStatement, sql)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer l.release(l.gen())
	ct, err := l.conn.Exec(ctx, sql, arguments...)
	return ct, l.fail(err)
}

// Query runs sql like Exec. The connection and its lane slot are held until the rows are closed:
// Rows.Close, or Next returning false. ctx bounds the wait, the statement and the reading of the
// rows. On error the returned Rows is in an error state, as with pgxpool.
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	l, err := p.acquire(ctx, Short, kindStatement, sql)
	if err != nil {
		return errRows{err: err}, err
	}
	rows, err := l.conn.Query(ctx, sql, args...)
	if err != nil {
		err = l.fail(err)
		l.release(l.gen())
		return errRows{err: err}, err
	}
	return l.newRows(rows, true), nil
}

// QueryRow runs sql like Exec. Errors are deferred to Row.Scan, which also releases the
// connection.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	l, err := p.acquire(ctx, Short, kindStatement, sql)
	if err != nil {
		return errRow{err: err}
	}
	return l.newRow(l.conn.QueryRow(ctx, sql, args...), true)
}

// Begin starts a transaction on a connection of the Tx lane (or the lane ctx names). The
// connection and its slot are held until Commit or Rollback. As with pgxpool, ctx affects only
// the wait and the BEGIN: there is no rollback when it ends later; the lane's budget is what
// bounds the transaction.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx is Begin with options. The lane's timeouts and the budget's server-side backstops
// travel with the BEGIN, in its round trip; tracers see pgx's BEGIN as with pgxpool.
func (p *Pool) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	l, err := p.acquire(ctx, Tx, kindTx, "")
	if err != nil {
		return nil, err
	}
	if p.pooler {
		l.w.After(l.txLocal())
	}
	t, err := l.conn.BeginTx(ctx, txOptions)
	l.w.After("")
	if err != nil {
		err = l.fail(err)
		l.release(l.gen())
		return nil, err
	}
	return l.newTx(t, true), nil
}

// CopyFrom runs COPY FROM on a connection of the Tx lane (or the lane ctx names): a bulk load
// has no bounded duration, so it does not use the Short lane.
func (p *Pool) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	l, err := p.acquire(ctx, Tx, kindStatement, "")
	if err != nil {
		return 0, err
	}
	defer l.release(l.gen())
	n, err := l.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, l.fail(err)
}

// Ping checks a connection of the Short lane (or the lane ctx names).
func (p *Pool) Ping(ctx context.Context) error {
	l, err := p.acquire(ctx, Short, kindStatement, "")
	if err != nil {
		return err
	}
	defer l.release(l.gen())
	return l.fail(l.conn.Ping(ctx))
}

// Acquire returns a held connection of the Tx lane (or the lane ctx names). It and its slot are
// held until Conn.Release or Conn.Hijack. The lane's timeouts, if they differ from Short's, go
// with its first statement, and the defaults come back with the next statement after it is
// released: no round trip of their own.
func (p *Pool) Acquire(ctx context.Context) (*Conn, error) {
	l, err := p.acquire(ctx, Tx, kindHeld, "")
	if err != nil {
		return nil, err
	}
	return l.newConn(), nil
}

// AcquireFunc acquires a connection as Acquire does, calls f with it, and releases it when f
// returns or panics. ctx only affects the acquire.
func (p *Pool) AcquireFunc(ctx context.Context, f func(*Conn) error) error {
	c, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return f(c)
}

// AcquireAllIdle acquires the idle connections that the lane ctx names (Tx by default) may take
// without waiting; each gets a lane slot, and on Long with a fleet cap (FleetMaxConns) a fleet
// slot, tried once per connection. The others are put back. Like pgxpool's, it is meant for
// health checks and keep-alives. A context that names an invalid lane gets none.
func (p *Pool) AcquireAllIdle(ctx context.Context) []*Conn {
	var rt route
	if err := p.route(ctx, Tx, "", &rt); err != nil {
		return nil
	}
	srv := p.lanes[rt.lane].srv
	srv.park.flush(false, false) // parked connections are idle ones
	epoch := srv.park.current()  // before pgxpool's acquire: a Reset after it is seen at the end
	idle := srv.pool.AcquireAllIdle(ctx)
	conns := make([]*Conn, 0, len(idle))
	for _, pc := range idle {
		l, ok := p.adopt(ctx, rt, pc, epoch)
		if !ok {
			pc.Release()
			continue
		}
		conns = append(conns, l.newConn())
	}
	return conns
}
