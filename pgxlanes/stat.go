package pgxlanes

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// LaneStat is a snapshot of one lane: its configuration, what it holds and who waits now, and
// cumulative counts of acquire outcomes and budget actions. The counts are the pool's one source
// of truth: the metrics packages export them as they are.
type LaneStat struct {
	Lane Lane

	Reserved   int // connections no other lane's unbounded work may take
	MaxConns   int // the most the lane may hold at once (for Tx and Long: at most its reserve plus the shared ones)
	MaxWaiters int // the queue's bound; 0 means unbounded

	InUse    int // slots held now, including a slot whose connection is being opened or cleaned
	Borrowed int // of InUse, those beyond the lane's reserve
	Cleaning int // of InUse, connections being cleaned after an interrupted request
	Waiting  int // callers queued now
	// OldestWait is how long the first queued caller has waited; 0 when nobody waits.
	OldestWait time.Duration
	// FleetWaiting and FleetHeld are Long's, with a fleet-wide cap: callers waiting for a fleet
	// slot (they hold a lane slot, not a connection) and fleet slots this pool holds.
	FleetWaiting int
	FleetHeld    int
	// AgedGrants counts the connections granted by ageing to a caller that had waited the lane's
	// PriorityAge, ahead of a caller of higher priority. TagShareRefusals counts the grants that
	// passed over a Tx caller whose tag held its MaxTagShare while another tag waited (with
	// TagShareDryRun: that would have).
	AgedGrants       int64
	TagShareRefusals int64

	Acquires      int64         // successful acquires
	EmptyAcquires int64         // successful acquires that had to queue for a slot
	AcquireWait   time.Duration // total wait of successful acquires, from the call to a ready connection
	Timeouts      int64         // acquires that failed with ErrAcquireTimeout
	Rejections    int64         // acquires refused with ErrLaneFull
	Canceled      int64         // acquires abandoned because the caller's ctx ended
	Errors        int64         // acquires that failed otherwise: pool closed, a connection that could not be opened

	BudgetWarnings          int64 // leases past half their budget (cancel and terminate lanes)
	BudgetFlags             int64 // leases over budget, flagged
	BudgetCancels           int64 // leases over budget, cancelled
	BudgetTerminates        int64 // leases over budget, terminated (verified)
	BudgetTerminateFailures int64 // terminates that failed (the pool closed its socket instead)

	// HoldP99 is the 99th percentile of the lane's hold times (a lease's acquire to its end) over
	// the last one to two minutes, as the upper bound of a bucket about 19 % wide; 0 when no lease
	// ended. AdvisedTimeout is the timeout the design notes advise for that work, 3 × HoldP99:
	// compare it with the lane's Budget (and Short's StatementTimeout). A configured timeout below
	// HoldP99 fires on legitimate work; one far above AdvisedTimeout protects nothing.
	HoldP99        time.Duration
	AdvisedTimeout time.Duration
}

// laneCounts are a lane's cumulative counts, kept with atomics.
type laneCounts struct {
	acquires, empty, wait, timeouts, rejections, canceled, errors atomic.Int64
	warnings, flags, cancels, terminates, termFails               atomic.Int64
	cleaning                                                      atomic.Int64
}

// acquired counts one acquire's outcome.
func (c *laneCounts) acquired(wait time.Duration, waited bool, err error) {
	switch {
	case err == nil:
		c.acquires.Add(1)
		if wait != 0 { // most acquires: their lease starts when they did (acquire.go)
			c.wait.Add(int64(wait))
		}
		if waited {
			c.empty.Add(1)
		}
	case errors.Is(err, ErrAcquireTimeout):
		c.timeouts.Add(1)
	case errors.Is(err, ErrLaneFull):
		c.rejections.Add(1)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		c.canceled.Add(1)
	default:
		c.errors.Add(1)
	}
}

// violated counts one budget action.
func (c *laneCounts) violated(v Violation) {
	switch {
	case v.Warning:
		c.warnings.Add(1)
	case v.Action == ActionFlag:
		c.flags.Add(1)
	case v.Action == ActionCancel:
		c.cancels.Add(1)
	case v.Err != nil:
		c.termFails.Add(1)
	default:
		c.terminates.Add(1)
	}
}

// Stat is a snapshot of the pool. It has the methods of *pgxpool.Stat, plus Lane for the lanes
// and Learning for the statements learned as slow. The acquire figures are the lanes' (they
// include the wait for a lane slot); the connection figures are pgxpool's.
type Stat struct {
	s      []*pgxpool.Stat // one per server, the primary first
	parked int32           // connections parked between leases (park.go): idle, to pgxlanes
	lanes  [numLanes]LaneStat
	learn  LearningStat
}

// LearningStat describes what the pool learned about unannotated statements sent to Short.
type LearningStat struct {
	Threshold  time.Duration // LaneConfig.SlowThreshold; 0 when learning is off
	Demoted    int           // statements currently admitted to Long's capacity
	Demotions  int64         // statements learned as slow, in all
	Promotions int64         // demoted statements learned as fast again, in all
	Tracked    int           // statements the pool keeps figures for (bounded)
	Proven     int           // of Tracked, statements with a fast run on record, not demoted
	// Probation is the number of Short slots that statements with no fast run on record may hold
	// at once (Short's cap less its reserve, at least 1), ProbationPerStatement the number one
	// such statement may hold (half of Short's reserve, at least 1); ProbationInUse those held now.
	Probation             int
	ProbationPerStatement int
	ProbationInUse        int
}

// Stat returns a snapshot of the pool's statistics.
func (p *Pool) Stat() *Stat {
	st := &Stat{}
	// One snapshot of each server's reserve, taken under its lock, so that the lanes' figures
	// agree with each other: a slot moving from one lane to another is never counted twice.
	snaps := make(map[*server]reserve.Stat, len(p.servers))
	for _, srv := range p.servers {
		ps, parked := srv.park.stat(srv.pool)
		st.s, st.parked = append(st.s, ps), st.parked+parked
		snaps[srv] = srv.res.Stat()
	}
	for i := range numLanes {
		lr := &p.lanes[i]
		rs := snaps[lr.srv].Lanes[lr.idx]
		c := &p.lanes[i].counts
		st.lanes[i] = LaneStat{Lane: Lane(i), Reserved: rs.Reserved, MaxConns: rs.MaxConns, MaxWaiters: rs.MaxWaiters,
			InUse: rs.InUse, Borrowed: rs.Borrowed, Cleaning: int(c.cleaning.Load()), Waiting: rs.Waiting, OldestWait: rs.OldestWait,
			AgedGrants: rs.AgedGrants, TagShareRefusals: rs.TagShareRefusals,
			Acquires: c.acquires.Load(), EmptyAcquires: c.empty.Load(), AcquireWait: time.Duration(c.wait.Load()),
			Timeouts: c.timeouts.Load(), Rejections: c.rejections.Load(), Canceled: c.canceled.Load(), Errors: c.errors.Load(),
			BudgetWarnings: c.warnings.Load(), BudgetFlags: c.flags.Load(), BudgetCancels: c.cancels.Load(),
			BudgetTerminates: c.terminates.Load(), BudgetTerminateFailures: c.termFails.Load()}
	}
	now := monoNow()
	for i := range numLanes {
		p99, _ := p.holds.p99(Lane(i), now)
		st.lanes[i].HoldP99, st.lanes[i].AdvisedTimeout = p99, advisedTimeout(p99)
	}
	if p.fleet != nil {
		st.lanes[Long].FleetWaiting = int(p.fleet.waiting.Load())
		st.lanes[Long].FleetHeld = int(p.fleet.held.Load())
	}
	if p.learn != nil {
		ls := p.learn.Stat()
		st.learn = LearningStat{Threshold: p.config.Short.SlowThreshold, Demoted: ls.Demoted,
			Demotions: int64(ls.Demotions), Promotions: int64(ls.Promotions), Tracked: ls.Tracked, Proven: ls.Proven,
			Probation: p.prob.n, ProbationPerStatement: p.prob.perStmt, ProbationInUse: p.prob.inUse()}
	}
	return st
}

// Lane returns the snapshot of lane l.
func (s *Stat) Lane(l Lane) LaneStat {
	if int(l) >= numLanes {
		return LaneStat{Lane: l}
	}
	return s.lanes[l]
}

// Learning returns what the pool learned about slow statements.
func (s *Stat) Learning() LearningStat { return s.learn }

func (s *Stat) sum(f func(*LaneStat) int64) int64 {
	var n int64
	for i := range s.lanes {
		n += f(&s.lanes[i])
	}
	return n
}

// AcquireCount is the number of successful acquires across lanes.
func (s *Stat) AcquireCount() int64 { return s.sum(func(l *LaneStat) int64 { return l.Acquires }) }

// AcquireDuration is the total time successful acquires waited for a connection.
func (s *Stat) AcquireDuration() time.Duration {
	return time.Duration(s.sum(func(l *LaneStat) int64 { return int64(l.AcquireWait) }))
}

// AcquiredConns is the number of connections currently acquired (by leases: a connection parked
// between two leases is idle).
func (s *Stat) AcquiredConns() int32 { return sum32(s.s, (*pgxpool.Stat).AcquiredConns) - s.parked }

// CanceledAcquireCount is the number of acquires that ended without a connection because the
// caller's ctx ended or the lane's acquire timeout ran out.
func (s *Stat) CanceledAcquireCount() int64 {
	return s.sum(func(l *LaneStat) int64 { return l.Canceled + l.Timeouts })
}

// ConstructingConns is the number of connections being opened.
func (s *Stat) ConstructingConns() int32 { return sum32(s.s, (*pgxpool.Stat).ConstructingConns) }

// EmptyAcquireCount is the number of successful acquires that had to wait for a lane slot.
func (s *Stat) EmptyAcquireCount() int64 {
	return s.sum(func(l *LaneStat) int64 { return l.EmptyAcquires })
}

// EmptyAcquireWaitTime is the total time acquires spent waiting, as AcquireDuration.
func (s *Stat) EmptyAcquireWaitTime() time.Duration { return s.AcquireDuration() }

// IdleConns is the number of idle connections.
func (s *Stat) IdleConns() int32 { return sum32(s.s, (*pgxpool.Stat).IdleConns) + s.parked }

// MaxConns is the pool's total, shared by the lanes (with Long on another server, both pools').
func (s *Stat) MaxConns() int32 { return sum32(s.s, (*pgxpool.Stat).MaxConns) }

// TotalConns is the number of open connections (constructing, acquired and idle).
func (s *Stat) TotalConns() int32 { return sum32(s.s, (*pgxpool.Stat).TotalConns) }

// NewConnsCount is the number of connections opened.
func (s *Stat) NewConnsCount() int64 { return sum64(s.s, (*pgxpool.Stat).NewConnsCount) }

// MaxLifetimeDestroyCount is the number of connections closed for exceeding MaxConnLifetime.
func (s *Stat) MaxLifetimeDestroyCount() int64 {
	return sum64(s.s, (*pgxpool.Stat).MaxLifetimeDestroyCount)
}

// MaxIdleDestroyCount is the number of connections closed for exceeding MaxConnIdleTime.
func (s *Stat) MaxIdleDestroyCount() int64 { return sum64(s.s, (*pgxpool.Stat).MaxIdleDestroyCount) }

// counted counts a budget action in the lane's figures. It runs on the guard's goroutine before
// the owner can see the action's error, so Stat shows every violation its caller has been told of.
func (p *Pool) counted(v Violation) {
	if int(v.Lane) < numLanes {
		p.lanes[v.Lane].counts.violated(v)
	}
}

// violated reports a counted budget action; it runs on the reporter's goroutine (report.go).
func (p *Pool) violated(v Violation) {
	p.status.violation(v)
	p.obs.violation(v)
}

// sum32 and sum64 add up a pgxpool figure over the pool's servers.
func sum32(s []*pgxpool.Stat, f func(*pgxpool.Stat) int32) int32 {
	var n int32
	for _, x := range s {
		n += f(x)
	}
	return n
}

func sum64(s []*pgxpool.Stat, f func(*pgxpool.Stat) int64) int64 {
	var n int64
	for _, x := range s {
		n += f(x)
	}
	return n
}
