package pgxlanes

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// LaneStat is a snapshot of one lane: connections in use and borrowed, waiters and the oldest
// waiter's wait, reserve and cap, and cumulative acquire, wait, timeout, rejection and
// cancellation counts of the admission step.
type LaneStat = reserve.LaneStat

// Stat is a snapshot of the pool. It has the methods of *pgxpool.Stat, plus Lane for the lanes.
// The acquire figures are the lanes' (they include the wait for a lane slot); the connection
// figures are pgxpool's.
type Stat struct {
	s     *pgxpool.Stat
	lanes [numLanes]LaneStat
}

// Stat returns a snapshot of the pool's statistics.
func (p *Pool) Stat() *Stat {
	st := &Stat{s: p.pool.Stat()}
	for i, ls := range p.res.Stat().Lanes {
		st.lanes[i] = ls
	}
	return st
}

// Lane returns the snapshot of lane l.
func (s *Stat) Lane(l Lane) LaneStat {
	if int(l) >= numLanes {
		return LaneStat{}
	}
	return s.lanes[l]
}

func (s *Stat) sum(f func(LaneStat) int64) int64 {
	var n int64
	for _, l := range s.lanes {
		n += f(l)
	}
	return n
}

// AcquireCount is the number of successful acquires across lanes.
func (s *Stat) AcquireCount() int64 { return s.sum(func(l LaneStat) int64 { return l.Acquires }) }

// AcquireDuration is the total time successful acquires waited for a lane slot.
func (s *Stat) AcquireDuration() time.Duration {
	return time.Duration(s.sum(func(l LaneStat) int64 { return int64(l.AcquireWait) }))
}

// AcquiredConns is the number of connections currently acquired.
func (s *Stat) AcquiredConns() int32 { return s.s.AcquiredConns() }

// CanceledAcquireCount is the number of acquires that ended without a connection because the
// caller's ctx ended or the lane's acquire timeout ran out.
func (s *Stat) CanceledAcquireCount() int64 {
	return s.sum(func(l LaneStat) int64 { return l.Cancels + l.Timeouts })
}

// ConstructingConns is the number of connections being opened.
func (s *Stat) ConstructingConns() int32 { return s.s.ConstructingConns() }

// EmptyAcquireCount is the number of successful acquires that had to wait for a lane slot.
func (s *Stat) EmptyAcquireCount() int64 {
	return s.sum(func(l LaneStat) int64 { return l.EmptyAcquires })
}

// EmptyAcquireWaitTime is the total time acquires that had to wait spent waiting.
func (s *Stat) EmptyAcquireWaitTime() time.Duration { return s.AcquireDuration() }

// IdleConns is the number of idle connections.
func (s *Stat) IdleConns() int32 { return s.s.IdleConns() }

// MaxConns is the pool's total, shared by the lanes.
func (s *Stat) MaxConns() int32 { return s.s.MaxConns() }

// TotalConns is the number of open connections (constructing, acquired and idle).
func (s *Stat) TotalConns() int32 { return s.s.TotalConns() }

// NewConnsCount is the number of connections opened.
func (s *Stat) NewConnsCount() int64 { return s.s.NewConnsCount() }

// MaxLifetimeDestroyCount is the number of connections closed for exceeding MaxConnLifetime.
func (s *Stat) MaxLifetimeDestroyCount() int64 { return s.s.MaxLifetimeDestroyCount() }

// MaxIdleDestroyCount is the number of connections closed for exceeding MaxConnIdleTime.
func (s *Stat) MaxIdleDestroyCount() int64 { return s.s.MaxIdleDestroyCount() }
