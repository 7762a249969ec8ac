package pgxlanes

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The bounds of a Status and of LockWaits: what an on-call page shows stays small whatever the
// pool's size or the storm's.
const (
	// StatusMaxLeases is the most leases a Status lists: the ones held longest.
	StatusMaxLeases = 20
	// StatusMaxEvents is the most budget actions, and the most learned statement changes, a
	// Status lists: the most recent.
	StatusMaxEvents = 20
	// StatusMaxLockWaits is the most (waiter, holder) pairs LockWaits returns.
	StatusMaxLockWaits = 20

	// lockWaitsInterval is how long a LockWaits answer is reused: it reads pg_locks, which
	// briefly takes the lock manager's partition locks, so many viewers cost one query a second.
	lockWaitsInterval = time.Second
)

// Status is a snapshot of the pool for a person during an incident: each lane's figures, the
// leases held longest, what the learner moved and the recent budget actions. It is built from
// memory, without I/O; LockWaits adds who blocks whom, from the server. It holds no SQL parameter
// values and nothing of the connection string.
type Status struct {
	Taken time.Time
	// Lanes are Stat's lane figures, Short, Tx and Long in that order.
	Lanes []LaneStat
	// Leases are the Tx and Long leases (transactions, held connections, rows of a Long query)
	// held longest, longest first, at most StatusMaxLeases of HeldLeases. Short leases are not
	// listed: Short's statement timeout bounds them, and the short path keeps no registry.
	Leases     []LeaseStatus
	HeldLeases int
	// Learning is Stat().Learning(); Statements are the most recent changes the learner made,
	// newest first, at most StatusMaxEvents.
	Learning   LearningStat
	Statements []StatementChange
	// Actions are the most recent budget warnings and actions, newest first, at most
	// StatusMaxEvents; ActionsTotal counts every one since the pool started.
	Actions      []BudgetAction
	ActionsTotal int64
}

// LeaseStatus is one lease held now.
type LeaseStatus struct {
	Lane Lane
	Tag  string
	Kind string // "transaction", "held connection" or "rows"
	PID  uint32 // the backend PID (behind PgBouncer, PgBouncer's key)
	Age  time.Duration
	// Budget is the lease's budget, 0 for none; Action what happens past it.
	Budget time.Duration
	Action Action
	// Flagged: the guard flagged it over budget; Violation names the action it took ("cancel",
	// "terminate"), "" while none was taken.
	Flagged   bool
	Violation string
	// CallSite is where it was acquired, with Config.CaptureCallSites; "" otherwise.
	CallSite string
}

// StatementChange is a change the learner made to an unannotated statement sent to Short.
type StatementChange struct {
	At time.Time
	// SQL is the statement's text, truncated to 80 bytes: the text the application sent, without
	// its parameters.
	SQL     string
	Demoted bool // learned as slow; false: learned as fast again
}

// BudgetAction is one budget warning or action, as a Violation reports it.
type BudgetAction struct {
	At       time.Time
	Lane     Lane
	Tag      string
	Action   Action
	Warning  bool // the warning at half the budget: nothing was done yet
	PID      uint32
	Budget   time.Duration
	Elapsed  time.Duration
	CallSite string
	Err      string // the action failed: a terminate not verified
}

// LockWait is a session of this pool's database waiting for a lock, and one session holding it.
type LockWait struct {
	// Waiter is the waiting backend, Waited how long its statement has run. WaiterLease is the
	// pool's Tx or Long lease on it, nil otherwise (another client, or a Short statement).
	Waiter      uint32
	Waited      time.Duration
	WaiterLease *LeaseStatus
	// Holder is the blocking backend, HolderState its pg_stat_activity state and HolderXactAge
	// the age of its transaction. HolderLease is the pool's lease on it, nil otherwise.
	Holder        uint32
	HolderState   string
	HolderXactAge time.Duration
	HolderLease   *LeaseStatus
}

// statusLog keeps the recent budget actions and learned changes for Status: two small rings fed
// by rare events (a budget action, a learned change), never by the hot path.
type statusLog struct {
	mu sync.Mutex
	// Guarded by mu:
	actions    [StatusMaxEvents]BudgetAction
	nActions   int64 // actions recorded in all; the newest is at (nActions-1) % len
	statements [StatusMaxEvents]StatementChange
	nStmts     int64

	// lockWaits caches the last LockWaits answer for lockWaitsInterval. Guarded by lockTok (a
	// token, held by whoever has it), which also makes concurrent viewers wait for one query
	// instead of sending several; a viewer waits for the token only as long as its ctx allows, not
	// for another viewer's round trip on a link that may have stalled.
	lockTok   chan struct{}
	lockAt    time.Time
	lockWaits []LockWait
	lockErr   error
}

func (s *statusLog) violation(v Violation) {
	a := BudgetAction{At: time.Now(), Lane: v.Lane, Tag: v.Tag, Action: v.Action, Warning: v.Warning, PID: v.PID,
		Budget: v.Budget, Elapsed: v.Elapsed, CallSite: v.CallSite}
	if v.Err != nil {
		a.Err = v.Err.Error()
	}
	s.mu.Lock()
	s.actions[s.nActions%StatusMaxEvents] = a
	s.nActions++
	s.mu.Unlock()
}

func (s *statusLog) statement(e StatementEvent) {
	s.mu.Lock()
	s.statements[s.nStmts%StatusMaxEvents] = StatementChange{At: time.Now(), SQL: e.SQL, Demoted: e.Demoted}
	s.nStmts++
	s.mu.Unlock()
}

// newestFirst returns the n most recent of ring, which has had total entries written.
func newestFirst[T any](ring []T, total int64) []T {
	n := min(total, int64(len(ring)))
	out := make([]T, 0, n)
	for i := int64(1); i <= n; i++ {
		out = append(out, ring[(total-i)%int64(len(ring))])
	}
	return out
}

// Status returns a snapshot of the pool for a status page (package metrics/statuspage serves it).
// It takes the lanes' locks and the lease registry's briefly, as Stat does, and does no I/O.
func (p *Pool) Status() Status {
	st := p.Stat()
	s := Status{Taken: time.Now(), Learning: st.Learning()}
	for _, l := range Lanes() {
		s.Lanes = append(s.Lanes, st.Lane(l))
	}

	// The registry is copied under its lock (a lease leaves it before it can be reused); call
	// sites are resolved after, outside it.
	type held struct {
		ls   LeaseStatus
		site callSite
	}
	var all []held
	for _, srv := range p.servers {
		srv.holders.mu.Lock()
		srv.holders.eachLocked(func(l *lease) {
			ls, site := l.status(s.Taken)
			all = append(all, held{ls, site})
		})
		srv.holders.mu.Unlock()
	}
	s.HeldLeases = len(all)
	slices.SortFunc(all, func(a, b held) int { return cmp.Compare(b.ls.Age, a.ls.Age) })
	all = all[:min(len(all), StatusMaxLeases)]
	s.Leases = make([]LeaseStatus, 0, len(all))
	for _, h := range all {
		h.ls.CallSite = h.site.String()
		s.Leases = append(s.Leases, h.ls)
	}

	p.status.mu.Lock()
	s.Actions = newestFirst(p.status.actions[:], p.status.nActions)
	s.ActionsTotal = p.status.nActions
	s.Statements = newestFirst(p.status.statements[:], p.status.nStmts)
	p.status.mu.Unlock()
	return s
}

// status describes the registered lease as of now, but its call site, returned for the caller to
// resolve. Its fields are set before it is registered, or atomic. Caller must hold the registry's
// lock (srv.holders.mu): a lease leaves the registry before it can be reused.
func (l *lease) status(now time.Time) (LeaseStatus, callSite) {
	ls := LeaseStatus{Lane: l.rt.lane, Tag: l.rt.tag, PID: l.pid, Age: now.Sub(l.acquired.time()), Budget: l.budget,
		Action: l.action, Flagged: l.has(fFlagged)}
	switch l.kind {
	case kindTx:
		ls.Kind = "transaction"
	case kindHeld:
		ls.Kind = "held connection"
	default:
		ls.Kind = "rows"
	}
	if l.budget == 0 {
		ls.Action = 0
	}
	if v := l.violation.Load(); v != nil {
		ls.Violation = v.Action.String()
	} else if l.terminating() {
		ls.Violation = ActionTerminate.String()
	}
	return ls, l.callSite
}

// lockWaitsSQL lists the sessions of this database waiting for a lock, each with a session that
// blocks it (pg_blocking_pids), the longest waits first. It reads no query text: a statement's
// text may carry literal values.
const lockWaitsSQL = `select w.pid, coalesce(extract(epoch from now() - w.query_start), 0)::float8,
       b.pid, coalesce(b.state, ''), coalesce(extract(epoch from now() - b.xact_start), 0)::float8
  from pg_stat_activity w
 cross join lateral unnest(pg_blocking_pids(w.pid)) as bp(pid)
  join pg_stat_activity b on b.pid = bp.pid
 where w.wait_event_type = 'Lock' and w.datname = current_database() and w.pid <> pg_backend_pid()
 order by w.query_start, b.xact_start
 limit $1`

// LockWaits returns who blocks whom on the pool's primary server now: each session of its
// database waiting for a lock, with the sessions holding it, naming the pool's own Tx and Long
// leases. It runs one query over the guard session (the session that ends leases over budget,
// outside the lanes), at most once a second: a call within a second of the last query gets that
// answer. ctx bounds the wait for the guard session and the query, and for another call's query
// under way (the caller gets ctx's error rather than wait for that call's round trip).
func (p *Pool) LockWaits(ctx context.Context) ([]LockWait, error) {
	s := &p.status
	select {
	case s.lockTok <- struct{}{}:
	case <-ctx.Done():
		return nil, errors.Join(errors.New("pgxlanes: lock waits unknown: another LockWaits is under way"), ctx.Err())
	}
	defer func() { <-s.lockTok }()
	if !s.lockAt.IsZero() && time.Since(s.lockAt) < lockWaitsInterval {
		return slices.Clone(s.lockWaits), s.lockErr
	}
	srv := p.servers[0]
	type row struct {
		waiter, holder  int32
		waited, xactAge float64
		state           string
	}
	var rows []row
	err := srv.term.with(ctx, func(c *pgx.Conn) error {
		rs, err := c.Query(ctx, guardTag+lockWaitsSQL, StatusMaxLockWaits)
		if err != nil {
			return err
		}
		rows, err = pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.waiter, &x.waited, &x.holder, &x.state, &x.xactAge)
			return x, err
		})
		return err
	})
	now := time.Now()
	var out []LockWait
	if err != nil {
		err = errors.Join(errors.New("pgxlanes: lock waits unknown"), err)
	}
	for _, r := range rows {
		w := LockWait{Waiter: uint32(r.waiter), Waited: seconds(r.waited), Holder: uint32(r.holder),
			HolderState: r.state, HolderXactAge: seconds(r.xactAge)}
		if ls, ok := srv.holders.status(w.Waiter, now); ok {
			w.WaiterLease = &ls
		}
		if ls, ok := srv.holders.status(w.Holder, now); ok {
			w.HolderLease = &ls
		}
		out = append(out, w)
	}
	slices.SortStableFunc(out, func(a, b LockWait) int { return cmp.Compare(b.Waited, a.Waited) })
	if ctx.Err() == nil { // a viewer who left does not decide what the next one sees
		s.lockAt, s.lockWaits, s.lockErr = now, out, err
	}
	return slices.Clone(out), err
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
