// Package pgxguard puts txguard's budgets on a plain *pgxpool.Pool, with no change to the pool.
//
// Every connection a caller takes from the pool (Acquire, Begin, Query until its rows close) is a
// lease, watched from its acquire to its release against a budget. A lease that overruns is
// flagged (a log line with the backend PID, the sessions holding a lock it waits for and, if
// asked for, the acquiring call site), cancelled
// (a protocol cancel request) or terminated (pg_terminate_backend over the guard's own session,
// verified), up txguard's ladder. The guard hooks pgxpool's AcquireTracer and ReleaseTracer
// through ConnConfig.Tracer, keeping the user's tracer.
//
// This is the first step of a rollout that changes no pool: watch with Flag to learn which
// transactions overrun their budgets, then enforce with Cancel or Terminate, and only then swap
// the pool for pgxlanes, whose lanes stop such transactions from starving short queries
// (docs/migration.md).
//
// # What it costs and what it guarantees
//
//   - An acquire and a release each take one mutex and allocate one lease; the guard runs one
//     goroutine, and cancels and terminates run on goroutines of their own. No caller ever waits
//     on the guard's network I/O: Release only takes the lease's mutex, which the guard never
//     holds across I/O.
//   - A connection that a cancel or terminate was aimed at is closed when it is released, never
//     handed to another caller, so a cancel that arrives late cannot stop another caller's
//     statement. pgxpool itself destroys a connection whose ctx ended, so this costs a reconnect
//     only where pgxpool would often pay one anyway.
//   - Terminate needs PostgreSQL 14 or later (pg_terminate_backend with a timeout, which waits for
//     the backend to go) and a role that may terminate the pool's sessions: the same role, or one
//     with pg_signal_backend.
//   - A connection taken with Conn.Hijack leaves the pool without a release: call Forget with it.
package pgxguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/multitracer"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/txguard"
)

// DefaultBudget is Config.Budget's default: Vitess's transaction killer acts at 30 s.
const DefaultBudget = 30 * time.Second

// terminateWait bounds a terminate: the side session's connect and pg_terminate_backend's wait for
// the backend to go.
const terminateWait = 5 * time.Second

// Config configures a Guard. The zero value flags every connection held longer than 30 s.
type Config struct {
	// Budget is how long a caller may hold a connection, from acquire to release, before Action
	// applies. 0 means DefaultBudget (30 s); use WithBudget for a call that needs more or less.
	Budget time.Duration
	// Action is the ladder for a lease over budget: txguard.Flag (the default: a warning at the
	// budget), txguard.Cancel (a warning at half, a cancel at the budget, a terminate at twice
	// the budget if the connection is still held) or txguard.Terminate (a warning at half, a
	// terminate at the budget).
	Action txguard.Action
	// Logger gets a line for every action and for a flagged lease's return. Default: slog.Default.
	Logger *slog.Logger
	// CallSites records where each connection was acquired, for the log lines and Violation. It
	// costs a runtime.Callers per acquire (about 1 µs); off by default.
	CallSites bool
	// OnViolation, if set, is called after each action with what happened. It runs on a goroutine
	// of the action's own: a slow one delays neither callers nor other leases' actions.
	OnViolation func(Violation)
	// ServerBackstop sets idle_in_transaction_session_timeout in the startup packet of the pool's
	// connections (unless the connection string sets it) to just past the ladder's last step, so
	// that the server ends a transaction left idle by a client that froze or lost its guard.
	// Off by default; ignored with Flag, which never interrupts. It applies to every session of
	// the pool: WithBudget cannot lift it for one transaction.
	ServerBackstop bool
}

// Violation is what the guard did to one lease.
type Violation struct {
	Action   txguard.Action
	Elapsed  time.Duration // how long the connection had been held
	Budget   time.Duration
	PID      uint32 // the backend's process ID
	CallSite string // where it was acquired, when Config.CallSites is on
	// BlockedBy are the sessions holding a lock the lease's statement waits for, looked up when
	// it is flagged (pg_blocking_pids): a flagged transaction is often a victim, not a culprit.
	BlockedBy []Blocker
	// Err is why a cancel or terminate failed; nil when it was carried out (a terminate is
	// carried out only when the server reported the backend gone).
	Err error
}

// Blocker is a session holding a lock that a flagged lease waits for.
type Blocker struct {
	PID uint32
	// CallSite is where this pool acquired the blocking session, when it is one of this pool's
	// leases and Config.CallSites is on; "" otherwise.
	CallSite string
	// OfThisPool says the blocking session is one of this pool's leases.
	OfThisPool bool
}

// Stats counts what a Guard did since it was created.
type Stats struct {
	Watched    int   // leases being watched now
	Flagged    int64 // flags, the half-budget warnings included
	Cancelled  int64 // cancel requests sent
	Terminated int64 // backends verified gone after pg_terminate_backend
	Failed     int64 // cancels and terminates that failed
}

type budgetKey struct{}

// WithBudget returns a ctx that gives the connection acquired with it budget d instead of the
// guard's. d <= 0 means no budget: a LISTEN loop or a migration that may run for hours.
func WithBudget(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, budgetKey{}, d)
}

// Guard watches the leases of one pgxpool. Create it with New before the pool, and Close it after
// the pool.
type Guard struct {
	cfg    Config
	logger *slog.Logger
	sched  *txguard.Guard
	side   *sideSession

	mu     sync.Mutex           // guards leases
	leases map[*pgx.Conn]*lease // the connections acquired now
	counts [4]atomic.Int64      // indexed by the count* constants
	acts   sync.WaitGroup       // OnViolation calls and logs under way after Close
	closed atomic.Bool
}

const (
	countFlagged = iota
	countCancelled
	countTerminated
	countFailed
)

// New validates c, installs the guard's tracer on pc (keeping pc.ConnConfig.Tracer, the user's),
// and returns the guard. pc must come from pgxpool.ParseConfig; create the pool from it afterwards.
// Errors name the field at fault.
func New(pc *pgxpool.Config, c Config) (*Guard, error) {
	if pc == nil || pc.ConnConfig == nil {
		return nil, errors.New("pgxguard: the pgxpool.Config must be created by pgxpool.ParseConfig")
	}
	switch {
	case c.Budget < 0:
		return nil, fmt.Errorf("pgxguard: Config.Budget is %v; want 0 (the default, %v) or more", c.Budget, DefaultBudget)
	case c.Budget == 0:
		c.Budget = DefaultBudget
	}
	switch c.Action {
	case 0:
		c.Action = txguard.Flag
	case txguard.Flag, txguard.Cancel, txguard.Terminate:
	default:
		return nil, fmt.Errorf("pgxguard: Config.Action is %v; want txguard.Flag, Cancel or Terminate", c.Action)
	}
	g := &Guard{cfg: c, logger: c.Logger, leases: map[*pgx.Conn]*lease{}}
	if g.logger == nil {
		g.logger = slog.Default()
	}
	g.side = newSideSession(pc)
	if c.ServerBackstop && c.Action != txguard.Flag {
		const name = "idle_in_transaction_session_timeout"
		if _, set := pc.ConnConfig.RuntimeParams[name]; !set {
			last := txguard.LastStep(c.Budget, c.Action) + time.Second
			pc.ConnConfig.RuntimeParams[name] = strconv.FormatInt(last.Milliseconds(), 10)
		}
	}
	g.sched = txguard.New()
	t := &tracer{g: g}
	if user := pc.ConnConfig.Tracer; user != nil {
		pc.ConnConfig.Tracer = multitracer.New(user, t)
	} else {
		pc.ConnConfig.Tracer = t
	}
	return g, nil
}

// Close stops watching, closes the guard's session and waits for actions under way. Leases still
// held are no longer watched.
func (g *Guard) Close() {
	if g.closed.Swap(true) {
		return
	}
	g.sched.Close()
	g.acts.Wait()
	g.side.close()
}

// Forget stops watching conn, for a connection taken out of the pool with Conn.Hijack (pgxpool
// reports no release for it). It is safe on a connection that is not watched.
func (g *Guard) Forget(conn *pgx.Conn) {
	g.release(conn, false)
}

// Stats returns the guard's counts.
func (g *Guard) Stats() Stats {
	g.mu.Lock()
	n := len(g.leases)
	g.mu.Unlock()
	return Stats{
		Watched:    n,
		Flagged:    g.counts[countFlagged].Load(),
		Cancelled:  g.counts[countCancelled].Load(),
		Terminated: g.counts[countTerminated].Load(),
		Failed:     g.counts[countFailed].Load(),
	}
}

// acquired starts a lease for conn, acquired under ctx.
func (g *Guard) acquired(ctx context.Context, conn *pgx.Conn) {
	budget := g.cfg.Budget
	if d, ok := ctx.Value(budgetKey{}).(time.Duration); ok {
		budget = d
	}
	if budget <= 0 || g.closed.Load() {
		return
	}
	l := &lease{g: g, conn: conn, pid: conn.PgConn().PID()}
	if g.cfg.CallSites {
		l.site = callSite()
	}
	l.tl = txguard.Lease{Owner: l, Start: time.Now(), Budget: budget, Action: g.cfg.Action}
	g.mu.Lock()
	old := g.leases[conn]
	g.leases[conn] = l
	g.mu.Unlock()
	if old != nil { // a hijacked connection acquired again without Forget: a bug, but harmless here
		old.end(g)
	}
	g.sched.Watch(&l.tl)
}

// release ends conn's lease. With closeIfHit, a connection that a cancel or terminate was aimed
// at is closed, so that pgxpool destroys it instead of handing it to another caller.
func (g *Guard) release(conn *pgx.Conn, closeIfHit bool) {
	g.mu.Lock()
	l := g.leases[conn]
	delete(g.leases, conn)
	g.mu.Unlock()
	if l == nil {
		return
	}
	hit, flagged := l.end(g)
	if flagged {
		g.logger.LogAttrs(context.Background(), slog.LevelInfo, "pgxguard: flagged connection returned",
			l.attrs(time.Since(l.tl.Start))...)
	}
	if hit && closeIfHit && !conn.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(ctx) // the caller's own connection: a Terminate message and a close
		cancel()
	}
}

// lease is one acquire-to-release of a connection. The guard acts on it on its own goroutines;
// mu orders those actions against the release.
type lease struct {
	g    *Guard
	conn *pgx.Conn
	pid  uint32
	site string
	tl   txguard.Lease

	mu      sync.Mutex // guards the fields below; never held across I/O
	ended   bool       // released: the guard must not touch conn any more
	hit     bool       // a cancel or terminate was aimed at conn: close it at release
	flagged bool       // a flag was logged: log the return too
}

// end marks l released and stops watching it; it reports whether a cancel or terminate was aimed
// at the connection, and whether it was flagged.
func (l *lease) end(g *Guard) (hit, flagged bool) {
	l.mu.Lock()
	l.ended = true
	hit, flagged = l.hit, l.flagged
	l.mu.Unlock()
	g.sched.Unwatch(&l.tl)
	return hit, flagged
}

// claim reports whether the guard may still act on the connection, and records that it does:
// from here on, the release closes the connection if interrupt is set.
func (l *lease) claim(interrupt bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	if interrupt {
		l.hit = true
	} else {
		l.flagged = true
	}
	return true
}

// Act carries out the guard's decision; see txguard.Owner.
func (l *lease) Act(a txguard.Action, elapsed time.Duration) {
	g := l.g
	v := Violation{Action: a, Elapsed: elapsed, Budget: l.tl.Budget, PID: l.pid, CallSite: l.site}
	switch a {
	case txguard.Flag:
		if !l.claim(false) {
			return
		}
		g.counts[countFlagged].Add(1)
		// Flag runs on the guard's goroutine: the lookup and the report go on one of their own.
		g.acts.Add(1)
		go func() {
			defer g.acts.Done()
			v.BlockedBy = g.blockers(l.pid)
			g.report(v, l)
		}()
		return
	case txguard.Cancel:
		if !l.claim(true) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), terminateWait)
		v.Err = l.conn.PgConn().CancelRequest(ctx)
		cancel()
		g.count(v.Err, countCancelled)
	case txguard.Terminate:
		if !l.claim(true) {
			return
		}
		v.Err = g.side.terminate(l.pid)
		g.count(v.Err, countTerminated)
	default:
		return
	}
	g.report(v, l)
}

func (g *Guard) count(err error, ok int) {
	if err != nil {
		g.counts[countFailed].Add(1)
		return
	}
	g.counts[ok].Add(1)
}

// report logs v and hands it to OnViolation.
func (g *Guard) report(v Violation, l *lease) {
	g.acts.Add(1)
	defer g.acts.Done()
	level, msg := slog.LevelWarn, "pgxguard: connection over budget: "+v.Action.String()
	attrs := l.attrs(v.Elapsed)
	if v.Err != nil {
		level, msg = slog.LevelError, "pgxguard: "+v.Action.String()+" failed"
		attrs = append(attrs, slog.String("error", v.Err.Error()))
	}
	for _, b := range v.BlockedBy {
		who := "another client"
		if b.OfThisPool {
			who = "this pool"
			if b.CallSite != "" {
				who += ", acquired at " + b.CallSite
			}
		}
		attrs = append(attrs, slog.String("blocked_by", strconv.FormatUint(uint64(b.PID), 10)+" ("+who+")"))
	}
	g.logger.LogAttrs(context.Background(), level, msg, attrs...)
	if g.cfg.OnViolation != nil {
		g.cfg.OnViolation(v)
	}
}

func (l *lease) attrs(elapsed time.Duration) []slog.Attr {
	a := []slog.Attr{
		slog.Duration("elapsed", elapsed),
		slog.Duration("budget", l.tl.Budget),
		slog.Uint64("pid", uint64(l.pid)),
	}
	if l.site != "" {
		a = append(a, slog.String("acquired_at", l.site))
	}
	return a
}

// blockers names the sessions holding a lock that backend pid waits for, over the guard's own
// session, and marks those that are this pool's leases. A lookup that fails names none.
func (g *Guard) blockers(pid uint32) []Blocker {
	pids, err := g.side.blockingPIDs(pid)
	if err != nil || len(pids) == 0 {
		return nil
	}
	bs := make([]Blocker, len(pids))
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, p := range pids {
		bs[i].PID = p
		for _, l := range g.leases {
			if l.pid == p {
				bs[i].OfThisPool, bs[i].CallSite = true, l.site
				break
			}
		}
	}
	return bs
}

// callSite returns the first frame outside pgx, pgxpool and this package.
func callSite() string {
	var pcs [24]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if !internalFrame(f.Function) {
			return f.File + ":" + strconv.Itoa(f.Line)
		}
		if !more {
			return ""
		}
	}
}

// tracer is the guard's hook in pgxpool. It needs to be a pgx.QueryTracer to sit in
// ConnConfig.Tracer; its query hooks do nothing.
type tracer struct{ g *Guard }

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *tracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return ctx
}

func (t *tracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	if data.Err == nil && data.Conn != nil {
		t.g.acquired(ctx, data.Conn)
	}
}

func (t *tracer) TraceRelease(_ *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	t.g.release(data.Conn, true)
}
