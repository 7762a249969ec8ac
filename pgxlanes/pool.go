package pgxlanes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/pgxlanes/pgxlanes/reserve"
	"github.com/pgxlanes/pgxlanes/txguard"
)

// Pool is a connection pool split into lanes. It has the method set of *pgxpool.Pool, so it
// replaces it with a change of import and constructor, satisfies sqlc's DBTX, and works with
// pgx.BeginFunc, pgx.BeginTxFunc and pgx.CollectRows. It is safe for concurrent use.
type Pool struct {
	pool   *pgxpool.Pool
	res    *reserve.Pool
	config *Config
	lanes  [numLanes]laneRuntime
	// session holds the timeouts every connection starts with (Short's, or none behind a
	// transaction pooler); lanes whose timeouts differ set their own.
	session LaneConfig

	guard   *txguard.Guard
	term    *txguard.Terminator
	logger  *slog.Logger
	holders holders // unbounded-lane leases by PID, for naming lock holders

	// open counts pgxpool's connections (AfterConnect to BeforeClose or hijack) and leased those
	// handed to leases; open > leased means a connection is idle, so pgxpool will not dial.
	open   atomic.Int64
	leased atomic.Int64

	obsMu     sync.Mutex // serializes changes to observers
	obsSeq    uint64     // guarded by obsMu
	observers atomic.Pointer[[]observerEntry]
}

// laneRuntime is a lane's configuration with the SQL derived from it, computed once in New.
type laneRuntime struct {
	cfg LaneConfig
	// sessionSet is run when a statement or held connection of this lane starts, and sessionReset
	// before its connection goes back, when the lane's timeouts differ from the session defaults
	// (Short's, sent in the startup packet); both are "" otherwise.
	sessionSet   string
	sessionReset string
	// beginSuffix follows BEGIN in the same round trip for the lane's own budget: SET LOCAL of the
	// lane's timeouts and of the budget's server-side backstops.
	beginSuffix string
	// begin is the whole BEGIN for the default TxOptions, to spare an allocation per Begin.
	begin string
	// batchSets are beginSuffix's SET LOCALs one by one, queued after the BEGIN of a batch begun
	// with pgx.Batch.BeginTx, for the lane's own budget.
	batchSets []string
}

// callKind says how a call sets its lane's timeouts when they differ from the session defaults.
type callKind uint8

const (
	// kindSession: plain statements (Query, QueryRow, Exec, SendBatch, CopyFrom, Ping) and held
	// connections (Acquire, AcquireFunc): SET at acquire, RESET before release.
	kindSession callKind = iota
	// kindTx: a transaction: SET LOCAL in the BEGIN round trip.
	kindTx
)

// New creates a pool from a connection string. See ParseConfig for the lane parameters.
func New(ctx context.Context, connString string) (*Pool, error) {
	cfg, err := ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	return NewWithConfig(ctx, cfg)
}

// NewWithConfig creates a pool from cfg, which must have been created by ParseConfig. If
// MaxConns was changed after ParseConfig and the lanes were left as ParseConfig sized them, they
// are sized again for the new MaxConns. Like pgxpool, it does not connect before the first use
// unless MinConns > 0.
func NewWithConfig(ctx context.Context, cfg *Config) (*Pool, error) {
	if cfg == nil {
		return nil, errors.New("pgxlanes: Config must not be nil")
	}
	cfg = cfg.Copy()
	if cfg.Config != nil && cfg.MaxConns != cfg.sizedFor && cfg.lanes() == cfg.sized {
		if err := cfg.sizeLanes(); err != nil {
			return nil, err
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := &Pool{config: cfg}
	rc := reserve.Config{Size: int(cfg.MaxConns)}
	// The session defaults: Short's timeouts, sent in the startup packet. Behind a transaction
	// pooler there are none of ours (the server's own apply), so every transaction sets all.
	session := cfg.Short
	if cfg.TransactionPooler {
		session = LaneConfig{StatementTimeout: -1, LockTimeout: -1}
	}
	for _, l := range Lanes() {
		lc := *cfg.Lane(l)
		rc.Lanes = append(rc.Lanes, reserve.LaneConfig{Name: l.String(), Reserved: lc.Reserved, MaxConns: lc.MaxConns,
			MaxWaiters: lc.MaxWaiters, Bounded: l == Short, AcquireTimeout: lc.AcquireTimeout})
		lr := laneRuntime{cfg: lc}
		if !cfg.TransactionPooler && (lc.StatementTimeout != session.StatementTimeout || lc.LockTimeout != session.LockTimeout) {
			lr.sessionSet = "set statement_timeout = " + millis(lc.StatementTimeout) + "; set lock_timeout = " + millis(lc.LockTimeout)
			lr.sessionReset = "reset statement_timeout; reset lock_timeout"
		}
		lr.beginSuffix = beginSuffix(lc, session, lc.Budget)
		lr.begin = "begin" + lr.beginSuffix
		lr.batchSets = batchSettings(lc, session, lc.Budget)
		p.lanes[l] = lr
	}
	res, err := reserve.New(rc)
	if err != nil {
		return nil, fmt.Errorf("pgxlanes: %w", err)
	}
	p.res = res

	pc := cfg.Config.Copy()
	// Short's timeouts are the session defaults, sent in the startup packet: a short query needs
	// no extra round trip. Other lanes override them with SET LOCAL or SET/RESET.
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	if !cfg.TransactionPooler {
		pc.ConnConfig.RuntimeParams["statement_timeout"] = millis(cfg.Short.StatementTimeout)
		pc.ConnConfig.RuntimeParams["lock_timeout"] = millis(cfg.Short.LockTimeout)
	}
	// A context that ends sends a protocol cancel request instead of closing the socket, so the
	// connection survives; the socket is closed only if the server does not answer in time.
	grace := cfg.CancelGrace
	pc.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: grace}
	}
	afterConnect, beforeClose := pc.AfterConnect, pc.BeforeClose
	pc.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if afterConnect != nil {
			if err := afterConnect(ctx, c); err != nil {
				return err
			}
		}
		p.open.Add(1)
		return nil
	}
	pc.BeforeClose = func(c *pgx.Conn) {
		p.open.Add(-1)
		if beforeClose != nil {
			beforeClose(c)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgxlanes: %w", err)
	}
	p.pool = pool
	p.logger = cfg.Logger
	if p.logger == nil {
		p.logger = slog.Default()
	}
	p.session = session
	p.term = txguard.NewTerminator(cfg.ConnConfig)
	p.guard = txguard.New()
	return p, nil
}

// beginSuffix is what follows BEGIN, in the same round trip, for a transaction of lane lc with
// budget b: SET LOCAL of the lane's timeouts where they differ from the session defaults, and of
// the server-side backstops of the budget.
func beginSuffix(lc, session LaneConfig, b time.Duration) string {
	s := ""
	for _, q := range setLocals(lc, session, b, false) {
		s += "; " + q
	}
	return s
}

// batchSettings are beginSuffix's SET LOCALs one by one, for a batch begun with
// pgx.Batch.BeginTx: the extended protocol takes one statement per query. SET, unlike a SELECT of
// set_config, takes no snapshot, so a SET TRANSACTION queued after them still works. In the
// default exec mode pgx prepares and caches each distinct text, so the backstop of a budget set
// with WithBudget is rounded up to one of ten values per decade (coarseUp): a program that
// computes its budgets does not fill the connections' statement caches.
func batchSettings(lc, session LaneConfig, b time.Duration) []string {
	return setLocals(lc, session, b, b != lc.Budget)
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

// setLocals are the SET LOCAL statements of a transaction of lane lc with budget b; coarse
// rounds the budget's backstop up with coarseUp.
func setLocals(lc, session LaneConfig, b time.Duration, coarse bool) []string {
	st := lc.StatementTimeout
	idle := backstop(b, lc.OverBudget)
	if coarse && idle > 0 {
		idle = coarseUp(idle)
	}
	if idle > 0 && (st == 0 || st > idle) {
		st = idle
	}
	var s []string
	if st != session.StatementTimeout {
		s = append(s, "set local statement_timeout = "+millis(st))
	}
	if lc.LockTimeout != session.LockTimeout {
		s = append(s, "set local lock_timeout = "+millis(lc.LockTimeout))
	}
	if idle > 0 {
		s = append(s, "set local idle_in_transaction_session_timeout = "+millis(idle))
	}
	return s
}

// millis renders d as whole milliseconds, rounded up, for a PostgreSQL timeout setting. Only
// typed durations are ever written into SQL.
func millis(d time.Duration) string {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return strconv.FormatInt(int64(ms), 10)
}

// acquire is the one place where a call gets a connection: classify, reserve a lane slot, get a
// pgxpool connection, prepare the session, and watch the lease's budget.
func (p *Pool) acquire(ctx context.Context, def Lane, kind callKind) (*lease, error) {
	start := time.Now()
	a := AnnotationsFrom(ctx)
	lane := def
	if a.LaneSet {
		lane = a.Lane
	}
	if int(lane) >= numLanes {
		return nil, fmt.Errorf("pgxlanes: unknown lane %v set with WithLane", lane)
	}
	lr := &p.lanes[lane]
	slot, err := p.res.Acquire(ctx, int(lane))
	if err != nil {
		return nil, p.acquireFailed(lane, a.Tag, start, err)
	}

	// The rest of the acquire timeout bounds pgxpool's step, which waits only when it has to open
	// a connection (the slots equal pgxpool's MaxConns, so it never queues behind another caller).
	// A deadline context costs allocations and a timer on every call, so it is made only when no
	// connection looks idle; in the rare race where one is taken meanwhile, the caller's ctx and
	// connect_timeout bound the dial, as in plain pgxpool.
	acqCtx, cancelAcq := ctx, context.CancelFunc(nil)
	if t := lr.cfg.AcquireTimeout; t > 0 && p.open.Load() <= p.leased.Load() {
		deadline := start.Add(t)
		if d, ok := ctx.Deadline(); !ok || d.After(deadline) {
			acqCtx, cancelAcq = context.WithDeadline(ctx, deadline)
		}
	}
	pc, err := p.pool.Acquire(acqCtx)
	if cancelAcq != nil {
		cancelAcq()
	}
	if err != nil {
		p.res.Release(slot)
		switch {
		case ctx.Err() != nil:
			err = p.laneError(lane, a.Tag, start, ctx.Err())
		case errors.Is(err, context.DeadlineExceeded) && acqCtx != ctx:
			err = p.laneError(lane, a.Tag, start, ErrAcquireTimeout)
		case errors.Is(err, puddle.ErrClosedPool):
			err = p.laneError(lane, a.Tag, start, ErrClosed)
		default:
			err = fmt.Errorf("pgxlanes: %s lane: %w", lane, err)
		}
		p.observeAcquire(AcquireEvent{Lane: lane, Tag: a.Tag, Wait: time.Since(start), Err: err})
		return nil, err
	}
	return p.lease(ctx, pc, slot, lane, a, start, kind)
}

// lease turns a pgxpool connection and a lane slot into a lease: it prepares the session, starts
// watching the budget, and reports the acquire. On error both are given back.
func (p *Pool) lease(ctx context.Context, pc *pgxpool.Conn, slot reserve.Slot, lane Lane, a Annotations, start time.Time, kind callKind) (*lease, error) {
	lr := &p.lanes[lane]
	p.leased.Add(1)
	l := &lease{p: p, pc: pc, conn: pc.Conn(), slot: slot, lane: lane, tag: a.Tag}
	l.pid = l.conn.PgConn().PID()
	if kind != kindTx && lr.sessionSet != "" {
		if _, err := l.conn.Exec(ctx, lr.sessionSet); err != nil {
			l.destroy()
			err = fmt.Errorf("pgxlanes: %s lane: setting timeouts: %w", lane, err)
			p.observeAcquire(AcquireEvent{Lane: lane, Tag: a.Tag, Wait: time.Since(start), Err: err})
			return nil, err
		}
		l.reset = lr.sessionReset
	}
	l.acquired = time.Now()
	budget := lr.cfg.Budget
	if a.Budget > 0 {
		budget = a.Budget
	}
	l.guard = txguard.Lease{Owner: l, Start: l.acquired, Budget: budget, Action: lr.cfg.OverBudget}
	if p.config.CaptureCallSites {
		l.callSite = txguard.Capture(0) // String skips the frames of pgxlanes and pgx
	}
	p.guard.Watch(&l.guard)
	if lane != Short {
		p.holders.add(l)
	}
	p.observeAcquire(AcquireEvent{Lane: lane, Tag: a.Tag, Wait: l.acquired.Sub(start)})
	return l, nil
}

// acquireFailed converts an error from the reserve step and reports it.
func (p *Pool) acquireFailed(lane Lane, tag string, start time.Time, err error) error {
	var re *reserve.AcquireError
	if errors.As(err, &re) {
		err = fromReserve(lane, tag, re)
	}
	p.observeAcquire(AcquireEvent{Lane: lane, Tag: tag, Wait: time.Since(start), Err: err})
	return err
}

// laneError builds an AcquireError with the lane's current figures.
func (p *Pool) laneError(lane Lane, tag string, start time.Time, cause error) *AcquireError {
	st := p.res.LaneStat(int(lane))
	return &AcquireError{Lane: lane, Tag: tag, Waited: time.Since(start), InUse: st.InUse, MaxConns: st.MaxConns,
		Waiting: st.Waiting, Err: cause}
}

// Close wakes every waiting caller with ErrClosed, refuses new calls, and closes all
// connections. Like pgxpool's Close, it blocks until every acquired connection is returned.
func (p *Pool) Close() {
	p.res.Close()
	p.pool.Close()
	p.guard.Close()
	p.holders.lookup.Wait()
	p.term.Close()
}

// Reset closes all idle connections and marks the others to be closed when returned; the lanes
// and their counters are not affected.
func (p *Pool) Reset() { p.pool.Reset() }

// Config returns a copy of the configuration the pool was created with.
func (p *Pool) Config() *Config { return p.config.Copy() }

// Exec runs sql on a connection of the Short lane (or the lane ctx names), which is held until
// Exec returns. ctx bounds the wait for a connection and the statement.
func (p *Pool) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	l, err := p.acquire(ctx, Short, kindSession)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer l.release()
	ct, err := l.conn.Exec(ctx, sql, arguments...)
	if err != nil {
		p.blameLockTimeout(l, err)
	}
	return ct, l.wrap(err)
}

// Query runs sql on a connection of the Short lane (or the lane ctx names). The connection and
// its lane slot are held until the rows are closed: Rows.Close, or Next returning false. ctx
// bounds the wait, the statement and the reading of the rows. On error the returned Rows is in
// an error state, as with pgxpool.
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	l, err := p.acquire(ctx, Short, kindSession)
	if err != nil {
		return errRows{err: err}, err
	}
	rows, err := l.conn.Query(ctx, sql, args...)
	if err != nil {
		p.blameLockTimeout(l, err)
		l.release()
		err = l.wrap(err)
		return errRows{err: err}, err
	}
	l.rows = leaseRows{Rows: rows, l: l, release: true}
	return &l.rows, nil
}

// QueryRow runs sql on a connection of the Short lane (or the lane ctx names). Errors are
// deferred to Row.Scan, which also releases the connection.
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	l, err := p.acquire(ctx, Short, kindSession)
	if err != nil {
		return errRow{err: err}
	}
	l.row = leaseRow{r: l.conn.QueryRow(ctx, sql, args...), l: l, release: true}
	return &l.row
}

// SendBatch sends b on a connection of the Short lane (or the lane ctx names), held until the
// BatchResults is closed. A batch that begins a transaction keeps its connection until that
// transaction ends, so it goes to the Tx lane unless ctx names a lane:
//   - begun with pgx.Batch.BeginTx, it gets the lane's timeouts and budget backstops as a Begin
//     does: pgxlanes queues a SET LOCAL for each right after the BEGIN, in the same round trip,
//     and BatchResults hides their results. b itself is not changed.
//   - begun by a "begin" queued by hand, its connection gets the lane's timeouts with SET and
//     RESET, as a held connection does, since the batch may end the transaction and go on.
func (p *Pool) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	kind := batchKindOf(b)
	lane, ck := Short, kindSession
	switch kind {
	case batchBeginTx:
		lane, ck = Tx, kindTx
	case batchHandBegin:
		lane = Tx
	}
	l, err := p.acquire(ctx, lane, ck)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	hidden := 0
	if kind == batchBeginTx {
		lr := &p.lanes[l.lane]
		sets := lr.batchSets
		if l.guard.Budget != lr.cfg.Budget {
			sets = batchSettings(lr.cfg, p.session, l.guard.Budget)
		}
		if len(sets) > 0 {
			b = withQueriesAfterFirst(b, sets)
			hidden = len(sets)
		}
	}
	br := &poolBatchResults{br: l.conn.SendBatch(ctx, b), l: l, hidden: hidden}
	if tx := br.br.Tx(); tx != nil {
		br.tx = &poolTx{t: tx, l: l}
	} else {
		br.release = true
	}
	return br
}

// withQueriesAfterFirst returns a copy of b with sqls queued after its first query. The copy
// keeps b's unexported state (the options of Batch.BeginTx) and shares its queued queries and
// their callbacks; the new queries are new each time, since pgx writes into a queued query as it
// sends it.
func withQueriesAfterFirst(b *pgx.Batch, sqls []string) *pgx.Batch {
	nb := *b
	nb.QueuedQueries = make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+len(sqls))
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries[0])
	for _, sql := range sqls {
		nb.QueuedQueries = append(nb.QueuedQueries, &pgx.QueuedQuery{SQL: sql})
	}
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries[1:]...)
	return &nb
}

type batchKind uint8

const (
	batchPlain     batchKind = iota
	batchBeginTx             // pgx.Batch.BeginTx, whatever its BeginQuery
	batchHandBegin           // a first query that starts with BEGIN
)

func batchKindOf(b *pgx.Batch) batchKind {
	if b == nil || len(b.QueuedQueries) == 0 {
		return batchPlain
	}
	// pgx keeps BeginTx's options unexported; FailedBatchResults tells whether they are set.
	if pgx.FailedBatchResults(b, nil).Tx() != nil {
		return batchBeginTx
	}
	s := strings.TrimLeft(b.QueuedQueries[0].SQL, " \t\r\n")
	if len(s) >= 5 && strings.EqualFold(s[:5], "begin") {
		return batchHandBegin
	}
	return batchPlain
}

// Begin starts a transaction on a connection of the Tx lane (or the lane ctx names). The
// connection and its slot are held until Commit or Rollback. As with pgxpool, ctx affects only
// the wait and the BEGIN: there is no rollback when it ends later; the lane's budget is what
// bounds the transaction.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx is Begin with options. The lane's statement and lock timeouts are set with SET LOCAL in
// the same round trip as BEGIN, so they vanish with the transaction.
func (p *Pool) BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error) {
	l, err := p.acquire(ctx, Tx, kindTx)
	if err != nil {
		return nil, err
	}
	t, err := l.conn.BeginTx(ctx, p.txOptions(l.lane, l.guard.Budget, txOptions))
	if err != nil {
		l.release()
		return nil, l.wrap(err)
	}
	l.tx = poolTx{t: t, l: l}
	return &l.tx, nil
}

// txOptions returns o with a BeginQuery that also sets the lane's timeouts and the backstops of
// budget b.
func (p *Pool) txOptions(lane Lane, b time.Duration, o pgx.TxOptions) pgx.TxOptions {
	lr := &p.lanes[lane]
	suffix := lr.beginSuffix
	if b != lr.cfg.Budget {
		suffix = beginSuffix(lr.cfg, p.session, b)
	} else if o == (pgx.TxOptions{}) {
		o.BeginQuery = lr.begin
		return o
	}
	if suffix == "" {
		return o
	}
	if o.BeginQuery == "" {
		o.BeginQuery = beginSQL(o)
	}
	o.BeginQuery += suffix
	return o
}

// beginSQL renders the BEGIN statement for o as pgx does.
func beginSQL(o pgx.TxOptions) string {
	s := "begin"
	if o.IsoLevel != "" {
		s += " isolation level " + string(o.IsoLevel)
	}
	if o.AccessMode != "" {
		s += " " + string(o.AccessMode)
	}
	if o.DeferrableMode != "" {
		s += " " + string(o.DeferrableMode)
	}
	return s
}

// CopyFrom runs COPY FROM on a connection of the Tx lane (or the lane ctx names): a bulk load
// has no bounded duration, so it does not use the Short lane.
func (p *Pool) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	l, err := p.acquire(ctx, Tx, kindSession)
	if err != nil {
		return 0, err
	}
	defer l.release()
	n, err := l.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
	return n, l.wrap(err)
}

// Ping checks a connection of the Short lane (or the lane ctx names).
func (p *Pool) Ping(ctx context.Context) error {
	l, err := p.acquire(ctx, Short, kindSession)
	if err != nil {
		return err
	}
	defer l.release()
	return l.wrap(l.conn.Ping(ctx))
}

// Acquire returns a held connection of the Tx lane (or the lane ctx names). It and its slot are
// held until Conn.Release or Conn.Hijack. If the lane's timeouts differ from Short's, they are set
// on the session now and reset before the connection goes back.
func (p *Pool) Acquire(ctx context.Context) (*Conn, error) {
	l, err := p.acquire(ctx, Tx, kindSession)
	if err != nil {
		return nil, err
	}
	l.held = Conn{l: l}
	return &l.held, nil
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
// without waiting; each gets a lane slot. The others are put back. Like pgxpool's, it is meant for
// health checks and keep-alives.
func (p *Pool) AcquireAllIdle(ctx context.Context) []*Conn {
	a := AnnotationsFrom(ctx)
	lane := Tx
	if a.LaneSet && int(a.Lane) < numLanes {
		lane = a.Lane
	}
	idle := p.pool.AcquireAllIdle(ctx)
	conns := make([]*Conn, 0, len(idle))
	for _, pc := range idle {
		slot, ok := p.res.TryAcquire(int(lane))
		if !ok {
			pc.Release()
			continue
		}
		l, err := p.lease(ctx, pc, slot, lane, a, time.Now(), kindSession)
		if err != nil {
			continue
		}
		l.held = Conn{l: l}
		conns = append(conns, &l.held)
	}
	return conns
}
