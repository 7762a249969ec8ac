package pgxlanes

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// fleet caps how many Long calls run at once across every pool that shares the database and the
// setting (LaneConfig.FleetMaxConns): all replicas of a service. It is coordinated through
// PostgreSQL itself, with no service of its own: slot i of the fleet is the session-level
// advisory lock (key, i), and a Long lease takes one before it gets its connection.
//
// The locks are held by the pool's guard session, not by the lease's connection, so that a
// caller waiting for a fleet slot ties up no pool connection, and so that a lease's connection
// carries no lock of the fleet's when it goes back. A replica that crashes loses its guard session
// and the server frees its slots. A slot is taken with pg_try_advisory_lock, polled at growing
// intervals; the wait counts against the lane's acquire timeout and shows in LaneStat.FleetWaiting.
// A slot is given back without the owner waiting for it.
//
// Behind a transaction pooler, a session-level lock would outlive the transaction that took it
// on a server session other clients share, so the fleet cap is refused there (see resolve).
type fleet struct {
	term *terminator
	key  int32 // the advisory lock's first key: of the lane, the database and the cap
	max  int32

	// Advisory locks are re-entrant within a session, and every lease of the pool takes its slot
	// through the same guard session: mine lists the slots the pool's leases hold, which a try
	// must skip. A slot given back is off the list at once, before its unlock runs; if it is
	// taken again meanwhile, the lock's count goes to 2 and the pending unlock leaves it held.
	mu   sync.Mutex
	mine []int32 // guarded by mu

	waiting atomic.Int64
	held    atomic.Int64
}

func newFleet(term *terminator, database string, max int) *fleet {
	// The key names the database and the cap, so that pools sharing both share the slots, and
	// a service with another cap on the same database does not take this one's.
	h := fnv.New32a()
	fmt.Fprintf(h, "pgxlanes long fleet:%s:%d", database, max)
	return &fleet{term: term, key: int32(h.Sum32()), max: int32(max)}
}

// errNoFleetSlot is the cause of an acquire timeout spent waiting for a fleet slot.
var errNoFleetSlot = errors.New("pgxlanes: every fleet slot of the long lane is taken")

// acquire takes a fleet slot, waiting until deadline (zero for none) or until ctx ends.
func (f *fleet) acquire(ctx context.Context, deadline time.Time) (int32, error) {
	f.waiting.Add(1)
	defer f.waiting.Add(-1)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		slot, err := f.try(ctx)
		if err == nil && slot >= 0 {
			f.held.Add(1)
			return slot, nil
		}
		if err != nil && ctx.Err() == nil {
			// The guard session is not available: keep trying until the deadline, as for a
			// slot that is busy.
			err = fmt.Errorf("pgxlanes: fleet slot: %w", err)
		}
		if !deadline.IsZero() && time.Until(deadline) < wait {
			if err == nil {
				err = errNoFleetSlot
			}
			return -1, fmt.Errorf("%w (%w)", ErrAcquireTimeout, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return -1, ctx.Err()
		case <-t.C:
		}
	}
}

// try takes a free slot if there is one; -1 if none.
func (f *fleet) try(ctx context.Context) (int32, error) {
	slot := int32(-1)
	err := f.term.with(ctx, func(c *pgx.Conn) error {
		// The guard session serializes the pool's tries, so mine cannot change under one.
		f.mu.Lock()
		mine := slices.Clone(f.mine)
		f.mu.Unlock()
		// CASE, not AND: PostgreSQL may evaluate the conditions of an AND in any order, and a
		// try on a slot of mine would succeed (the lock is re-entrant) and stay taken.
		err := c.QueryRow(ctx, guardTag+`select s from generate_series(0, $2::int - 1) s
			where case when s = any(coalesce($3::int[], '{}')) then false else pg_try_advisory_lock($1::int, s) end
			limit 1`,
			f.key, f.max, mine).Scan(&slot)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err == nil {
			f.mu.Lock()
			f.mine = append(f.mine, slot)
			f.mu.Unlock()
		}
		return err
	})
	return slot, err
}

// release gives slot back, in the background: the owner does not wait for the guard's I/O. If
// the guard session is gone, the server has freed the lock already.
func (f *fleet) release(slot int32) {
	f.mu.Lock()
	f.mine = slices.DeleteFunc(f.mine, func(s int32) bool { return s == slot })
	f.mu.Unlock()
	f.held.Add(-1)
	f.term.wg.Add(1)
	go func() {
		defer f.term.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), terminateTimeout)
		defer cancel()
		_ = f.term.with(ctx, func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, guardTag+"select pg_advisory_unlock($1::int, $2::int)", f.key, slot)
			return err
		})
	}()
}
