package pgxlanes

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// fleet caps how many Long calls run at once across every pool of the same fleet on the server
// (LaneConfig.FleetMaxConns and FleetName): all replicas of a service. It is coordinated through
// PostgreSQL itself, with no service of its own: slot i of the fleet is the advisory lock
// (key, i), key derived from the fleet's name, and a Long lease takes one before it gets its
// connection (docs/scale-out.md lists the keys).
//
// The locks are held by two sessions of the pool's own, the fleet's sides, not by the leases'
// connections, so that a caller waiting for a slot ties up no pool connection, and a lease's
// connection carries no lock of the fleet's when it goes back. A slot is taken as an exclusive
// lock on one side (so that nobody else holds it in any mode), turned into a shared lock there,
// and mirrored as a shared lock on the other side. Either side alone keeps the slot taken: when
// one side's session is lost (terminated, partitioned, closed by a firewall), the server frees
// that side's locks but the other side's keep every other pool out, and the lost side retakes
// them on a fresh session without any race. Only when both sides are lost (a server restart,
// which also ends the leases' own sessions) are the locks gone: the fleet then starts a new epoch,
// in which it admits no new lease until it again holds a slot for every lease still running;
// until then those leases count against the cap.
//
// A slot is tried at growing intervals; the wait counts against the lane's acquire timeout and
// shows in LaneStat.FleetWaiting. A slot is given back without the owner waiting for it. No
// caller waits on the guard session (terminate.go): the sides are the fleet's alone.
//
// Behind a transaction pooler, a session-level lock would outlive the transaction that took it
// on a server session other clients share, so the fleet cap is refused there (see resolve).
type fleet struct {
	term *terminator
	name string
	key  int32 // the advisory lock's first key, from the name
	max  int32

	sides [2]*fleetSide

	mu sync.Mutex
	// running counts the leases admitted and not ended; slots maps each slot the pool holds to
	// the sides that hold it (bit i for side i). A slot is in held only while locked on those
	// sides: it is added after the lock is taken and removed before the unlock is sent. owed
	// (running > len(slots)) means slots were lost with both sides: no admission until retaken.
	// epoch counts the times both sides were lost. All guarded by mu.
	running int
	slots   map[int32]uint8
	epoch   uint64
	closed  bool

	kick    chan struct{} // wakes the keeper
	stop    chan struct{}
	wg      sync.WaitGroup
	ctx     context.Context // ends when the fleet closes
	cancel  context.CancelFunc
	waiting atomic.Int64
	held    atomic.Int64 // len(slots), for Stat
}

// fleetSide is one of the fleet's two sessions. It is used by one statement at a time: sem is
// taken with the caller's context, never a sync.Mutex across I/O.
type fleetSide struct {
	i    int
	sem  chan struct{} // a token in it means the side is free
	conn *pgx.Conn     // used and replaced only by the holder of sem
}

// defaultFleetName is the fleet's name when LaneConfig.FleetName is not set.
func defaultFleetName(cc *pgx.ConnConfig) string {
	name := cc.Database + "/" + cc.User
	if app := cc.RuntimeParams["application_name"]; app != "" {
		name += "/" + app
	}
	return name
}

// fleetKey is the first key of the advisory locks of fleet name.
func fleetKey(name string) int32 {
	h := fnv.New32a()
	fmt.Fprintf(h, "pgxlanes long fleet:%s", name)
	return int32(h.Sum32())
}

func newFleet(term *terminator, name string, max int) *fleet {
	f := &fleet{term: term, name: name, key: fleetKey(name), max: int32(max), slots: map[int32]uint8{},
		kick: make(chan struct{}, 1), stop: make(chan struct{})}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	for i := range f.sides {
		f.sides[i] = &fleetSide{i: i, sem: make(chan struct{}, 1)}
		f.sides[i].sem <- struct{}{}
	}
	f.wg.Add(1)
	go f.keeper()
	f.wake() // open the sides now, before the pool's connections compete for the server's slots
	return f
}

// errNoFleetSlot is the cause of an acquire timeout spent waiting for a fleet slot.
var errNoFleetSlot = errors.New("pgxlanes: every fleet slot of the long lane is taken")

// errFleetOwed is the cause of an acquire timeout spent waiting while the fleet retakes the slots
// of leases admitted before both its sessions were lost.
var errFleetOwed = errors.New("pgxlanes: the fleet is retaking the slots of running leases after losing its sessions")

// errFleetClosed: the fleet closed with the pool; acquire returns ErrClosed for it.
var errFleetClosed = errors.New("pgxlanes: fleet closed with the pool")

// acquire takes a fleet slot, waiting until deadline (zero for none) or until ctx ends. The slot
// number it returns is only a token: release gives back a slot, not necessarily that one.
func (f *fleet) acquire(ctx context.Context, deadline time.Time) (int32, error) {
	f.waiting.Add(1)
	defer f.waiting.Add(-1)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		slot, err := f.try(ctx)
		if err == nil && slot >= 0 {
			return slot, nil
		}
		if errors.Is(err, errFleetClosed) {
			return -1, ErrClosed
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, errFleetOwed) {
			// The sessions are not available: keep trying until the deadline, as for a slot
			// that is busy.
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
		case <-f.ctx.Done(): // the pool closed: its Close wakes every waiter
			t.Stop()
			return -1, ErrClosed
		case <-t.C:
		}
	}
}

// try takes a free slot for a new lease if there is one; -1 if none.
func (f *fleet) try(ctx context.Context) (int32, error) {
	f.mu.Lock()
	if f.running > len(f.slots) {
		f.mu.Unlock()
		f.wake()
		return -1, errFleetOwed
	}
	f.mu.Unlock()
	return f.take(ctx, true)
}

// take locks a slot no session holds and records it as the pool's; for a new lease (admit), it
// also counts the lease, unless a loss meanwhile left running leases without their slots, in
// which case the slot goes to them. It tries side 0, then side 1 if side 0 cannot be reached.
func (f *fleet) take(ctx context.Context, admit bool) (int32, error) {
	var err error
	for _, s := range f.sides {
		var slot int32
		if slot, err = f.takeOn(ctx, s, admit); err == nil || ctx.Err() != nil {
			return slot, err
		}
	}
	return -1, err
}

func (f *fleet) takeOn(ctx context.Context, s *fleetSide, admit bool) (int32, error) {
	slot := int32(-1)
	err := f.with(ctx, s, func(ctx context.Context, c *pgx.Conn) error {
		f.mu.Lock()
		skip := slices.Collect(maps.Keys(f.slots))
		f.mu.Unlock()
		// CASE, not AND: PostgreSQL may evaluate the conditions of an AND in any order, and a
		// try on a slot of the pool's own would succeed (the lock is re-entrant) and stay taken.
		// The exclusive try succeeds only if no session holds the slot in any mode; the slot is
		// then held shared, in the same statement, and the exclusive lock let go.
		err := c.QueryRow(ctx, guardTag+`select s, pg_advisory_lock_shared($1::int, s) is null, pg_advisory_unlock($1::int, s)
			from (select s from generate_series(0, $2::int - 1) s
			       where case when s = any(coalesce($3::int[], '{}')) then false else pg_try_advisory_lock($1::int, s) end
			       limit 1) t`,
			f.key, f.max, skip).Scan(&slot, nil, nil)
		if errors.Is(err, pgx.ErrNoRows) {
			slot = -1
			return nil
		}
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.slots[slot] |= 1 << s.i
		f.held.Store(int64(len(f.slots)))
		if admit {
			if f.running >= len(f.slots) {
				admit = false // a lease admitted before a loss gets it
				slot = -1
			} else {
				f.running++
			}
		}
		f.mu.Unlock()
		return nil
	})
	if err != nil {
		return -1, err
	}
	f.wake() // the keeper mirrors the slot on the other side
	return slot, nil
}

// with runs fn on side s, opening its session if needed, once the side is free or until ctx
// ends; fn's ctx ends with ctx or when the fleet closes. A session found broken, or that fn left
// in an unknown state as ctx ended, is dropped (lost) and its locks counted as gone.
func (f *fleet) with(ctx context.Context, s *fleetSide, fn func(context.Context, *pgx.Conn) error) error {
	select {
	case <-s.sem:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { s.sem <- struct{}{} }()
	// The side's I/O ends when the fleet closes too, not only with ctx: close waits for each
	// side's sem, and must not wait for a caller's round trip on a stalled link until the
	// caller's ctx ends.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(f.ctx, cancel)()
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return errFleetClosed
	}
	if s.conn == nil || s.conn.IsClosed() {
		if s.conn != nil {
			f.lost(s)
		}
		c, err := f.term.connect(ctx, "pgxlanes fleet")
		if err != nil {
			return fmt.Errorf("opening a fleet session: %w", err)
		}
		s.conn = c
	}
	err := fn(ctx, s.conn)
	// A statement that failed as ctx ended may have run in part: a user's context watcher handler
	// (CancelRequestContextWatcherHandler) cancels it on the server and keeps the session, and a
	// session-level advisory lock outlives the statement that took it. What the side holds is then
	// unknown, so it is dropped as lost, as pgconn's default handler would have closed it.
	if err != nil && (brokenConn(s.conn, err) || ctx.Err() != nil) {
		f.lost(s)
	}
	return err
}

// lost drops side s's session: the server has freed or will free its locks. Caller holds s.sem.
func (f *fleet) lost(s *fleetSide) {
	c := s.conn
	s.conn = nil
	f.mu.Lock()
	both := len(f.slots) > 0
	for slot, bits := range f.slots {
		if bits &^= 1 << s.i; bits == 0 {
			delete(f.slots, slot)
		} else {
			f.slots[slot] = bits
			both = false
		}
	}
	if both {
		f.epoch++ // every lock is gone: running leases are owed slots
	}
	f.held.Store(int64(len(f.slots)))
	f.mu.Unlock()
	if c != nil {
		closeConn(c)
	}
	f.wake()
}

// release ends a lease's hold on a slot, in the background: the owner does not wait for the
// sessions' I/O. If a loss left leases without their slots, the lease's end pays that debt
// instead and no slot is given back.
func (f *fleet) release(int32) {
	f.mu.Lock()
	f.running--
	if f.closed || len(f.slots) <= f.running {
		f.mu.Unlock()
		return
	}
	var slot int32
	var bits uint8
	for slot, bits = range f.slots {
		break
	}
	delete(f.slots, slot) // off the list before its unlocks are sent
	f.held.Store(int64(len(f.slots)))
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		ctx, cancel := context.WithTimeout(f.ctx, terminateTimeout)
		defer cancel()
		for _, s := range f.sides {
			if bits&(1<<s.i) != 0 {
				_ = f.with(ctx, s, func(ctx context.Context, c *pgx.Conn) error {
					_, err := c.Exec(ctx, guardTag+"select pg_advisory_unlock_shared($1::int, $2::int)", f.key, slot)
					return err
				})
			}
		}
	}()
}

// keeperInterval is how often the keeper checks the sides while the pool holds slots.
const keeperInterval = 250 * time.Millisecond

func (f *fleet) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// keeper opens the sides, mirrors each slot held on one side onto the other, retakes the slots
// owed after a loss, and checks the sides while slots are held, so that a lost side is noticed
// and repaired before the other may go too.
func (f *fleet) keeper() {
	defer f.wg.Done()
	t := time.NewTimer(keeperInterval)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-f.kick:
		case <-t.C:
		}
		f.keep()
		t.Reset(keeperInterval)
	}
}

// keep does one round of the keeper's work.
func (f *fleet) keep() {
	ctx, cancel := context.WithTimeout(f.ctx, terminateTimeout)
	defer cancel()
	f.mu.Lock()
	busy := f.running > 0 || len(f.slots) > 0
	f.mu.Unlock()
	for _, s := range f.sides {
		// Open a side that is not open; check one that is, while slots are held.
		_ = f.with(ctx, s, func(ctx context.Context, c *pgx.Conn) error {
			if !busy {
				return nil
			}
			return c.Ping(ctx)
		})
	}
	// Mirror the slots held on one side only.
	for _, s := range f.sides {
		f.mu.Lock()
		var missing []int32
		for slot, bits := range f.slots {
			if bits&(1<<s.i) == 0 {
				missing = append(missing, slot)
			}
		}
		f.mu.Unlock()
		if len(missing) == 0 {
			continue
		}
		_ = f.with(ctx, s, func(ctx context.Context, c *pgx.Conn) error {
			for _, slot := range missing {
				var ok bool
				if err := c.QueryRow(ctx, guardTag+"select pg_try_advisory_lock_shared($1::int, $2::int)", f.key, slot).Scan(&ok); err != nil {
					return err
				}
				f.mu.Lock()
				if bits, held := f.slots[slot]; held && ok {
					f.slots[slot] = bits | 1<<s.i
				} else if ok {
					// Given back meanwhile: let go of it here too.
					f.mu.Unlock()
					if _, err := c.Exec(ctx, guardTag+"select pg_advisory_unlock_shared($1::int, $2::int)", f.key, slot); err != nil {
						return err
					}
					continue
				}
				f.mu.Unlock()
			}
			return nil
		})
	}
	// Retake the slots owed after both sides were lost.
	for {
		f.mu.Lock()
		owed := f.running > len(f.slots) && !f.closed
		f.mu.Unlock()
		if !owed {
			return
		}
		slot, err := f.take(ctx, false)
		if err != nil || slot < 0 {
			return // none free yet: the next round tries again
		}
	}
}

// close stops the keeper and waits for the unlocks under way, then closes the sides: the server
// frees whatever they held.
func (f *fleet) close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	f.mu.Unlock()
	close(f.stop)
	f.cancel()
	f.wg.Wait()
	for _, s := range f.sides {
		<-s.sem
		if s.conn != nil {
			closeConn(s.conn)
			s.conn = nil
		}
		s.sem <- struct{}{}
	}
}
