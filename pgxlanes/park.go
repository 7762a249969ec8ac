package pgxlanes

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/internal/wire"
)

// Parking: a connection whose lease ends fit for reuse stays acquired from pgxpool for a moment,
// on a stack of its server's, and the next lease of any lane on that server takes it from there.
// Two leases in a row then cost no pgxpool Release and Acquire between them: those read the clock
// six times (puddle's acquire twice, the idle time, the release, and the lifetime at both), most
// of pgxpool's own cost.
//
// pgxpool must not be able to tell. A parked connection goes back to pgxpool within two periods
// of parkPeriod (a sweep releases what was parked before its last look), so that pgxpool's
// idle-time and health checks see the connection as they would have, within that; one that has
// outlived MaxConnLifetime, or was acquired, or its dial begun, before a Reset, is released
// instead of parked, and pgxpool closes it; Stat counts parked connections as idle; Close, Reset and AcquireAllIdle
// release them all first. And a lease that must wait inside pgxpool (none is parked: it dials, or
// waits for a release) is never left waiting behind a parked connection: while one waits, ending
// leases release to pgxpool (inflight).
//
// What pgxpool would call at each release and acquire cannot be skipped: parking is off where any
// of it is set (parkingAllowed): AfterRelease, PrepareConn or BeforeAcquire, ShouldPing, a tracer
// of acquires or releases; and with MinIdleConns (pgxpool would dial to make up for parked
// connections it counts as acquired), or a MaxConnIdleTime or HealthCheckPeriod short enough for
// the delay to show.
type parking struct {
	mu       sync.Mutex
	conns    []parked
	inflight int    // acquires inside pgxpool.Acquire
	epoch    uint32 // Reset's count: a connection acquired before the last Reset is not parked
	gen      uint32 // the sweep's count of periods
	armed    bool   // the sweep's timer is set
	off      bool   // parking is not allowed, or the pool is closed
	timer    *time.Timer
}

type parked struct {
	pc    *pgxpool.Conn
	w     *wire.Conn // pc's, kept from its lease: no walk from pc to it at a take or a release
	at    mono       // when it was parked
	epoch uint32     // the parking epoch when the connection was acquired from pgxpool
	gen   uint32     // the period it was parked in
}

// parkPeriod is the sweep's period: a connection stays parked for one to two periods at most.
// A variable for the tests only.
var parkPeriod = 50 * time.Millisecond

// parkingAllowed reports whether nothing that pgxpool calls or counts at a release and the next
// acquire would miss them, for the configuration pgxpool is given, before pgxlanes wraps it.
func parkingAllowed(pc *pgxpool.Config) bool {
	//lint:ignore SA1019 pgxpool still calls a BeforeAcquire the user set, at every acquire
	if pc.AfterRelease != nil || pc.PrepareConn != nil || pc.BeforeAcquire != nil || pc.ShouldPing != nil {
		return false
	}
	if pc.MinIdleConns > 0 {
		return false
	}
	if pc.MaxConnIdleTime > 0 && pc.MaxConnIdleTime < 20*parkPeriod || pc.HealthCheckPeriod > 0 && pc.HealthCheckPeriod < 20*parkPeriod {
		return false
	}
	// A tracer of acquires too, though pgxlanes calls it itself around each lease's acquire: it
	// is handed the pgxpool, whose Stat would count parked connections as acquired and miss the
	// leases served from the stack (otelpgx's reads none, others do).
	switch pc.ConnConfig.Tracer.(type) {
	case pgxpool.AcquireTracer, pgxpool.ReleaseTracer:
		return false
	}
	return true
}

// take returns a parked connection and the epoch it was acquired in, or nil: the caller then
// acquires from pgxpool, with epoch, and calls acquired when that is done. expired reports
// whether a parked connection (given by its wire) has outlived MaxConnLifetime: such a one goes
// back to pgxpool, which closes it, as pgxpool's Acquire does.
func (k *parking) take(expired func(*wire.Conn) bool) (*pgxpool.Conn, uint32) {
	k.mu.Lock()
	for n := len(k.conns); n > 0; n = len(k.conns) {
		c := k.conns[n-1]
		k.conns[n-1] = parked{}
		k.conns = k.conns[:n-1]
		if expired(c.w) {
			releaseLocked(c)
			continue
		}
		k.mu.Unlock()
		return c.pc, c.epoch
	}
	k.inflight++
	epoch := k.epoch
	k.mu.Unlock()
	return nil, epoch
}

// acquired ends an acquire from pgxpool begun by take.
func (k *parking) acquired() {
	k.mu.Lock()
	k.inflight--
	k.mu.Unlock()
}

// put parks pc, whose wire is w, acquired from pgxpool in epoch, and reports whether it did; if
// not, the caller releases it to pgxpool.
func (k *parking) put(pc *pgxpool.Conn, w *wire.Conn, epoch uint32, now mono) bool {
	k.mu.Lock()
	if k.off || k.inflight > 0 || epoch != k.epoch {
		k.mu.Unlock()
		return false
	}
	k.conns = append(k.conns, parked{pc: pc, w: w, at: now, epoch: epoch, gen: k.gen})
	if !k.armed {
		k.armed = true
		if k.timer == nil {
			k.timer = time.AfterFunc(parkPeriod, k.sweep)
		} else {
			k.timer.Reset(parkPeriod)
		}
	}
	k.mu.Unlock()
	return true
}

// sweep releases to pgxpool the connections parked before its last look, and looks again a
// period later while any is parked.
func (k *parking) sweep() {
	k.mu.Lock()
	if !k.armed {
		k.mu.Unlock()
		return
	}
	// The stack's periods grow from the bottom (the oldest) up: parks push the current one, and
	// takes pop from the top.
	n := 0
	for n < len(k.conns) && k.conns[n].gen != k.gen {
		n++
	}
	for _, c := range k.conns[:n] {
		releaseLocked(c)
	}
	rest := copy(k.conns, k.conns[n:])
	clear(k.conns[rest:])
	k.conns = k.conns[:rest]
	k.gen++
	if len(k.conns) > 0 {
		k.timer.Reset(parkPeriod)
	} else {
		k.armed = false
	}
	k.mu.Unlock()
}

// releaseLocked gives a parked connection back to pgxpool, under the parking's mutex, so that
// no one sees it neither parked nor idle in pgxpool: not Stat, nor an acquire that finds the
// stack empty and would have pgxpool dial for want of an idle connection. pgxpool's Release does
// not block (a connection it closes is closed by a goroutine of puddle's) and calls nothing of
// the user's here (parkingAllowed). pgxpool counts a connection's idle time from its release,
// which ShouldPing's default rule (ping one idle over a second) reads: the time it was parked is
// recorded on it, and shouldPing adds it (pingctx.go).
func releaseLocked(c parked) {
	if c.w != nil {
		c.w.ParkedFor = int64(monoNow() - c.at)
	}
	c.pc.Release()
}

// flush releases every parked connection to pgxpool. With reset, connections acquired before
// are not parked again; with close, none is parked any more.
func (k *parking) flush(reset, close bool) {
	k.mu.Lock()
	all := k.conns
	k.conns = nil
	if reset {
		k.epoch++
	}
	if close {
		k.off = true
	}
	if k.armed {
		k.armed = false
		k.timer.Stop()
	}
	for _, c := range all {
		releaseLocked(c)
	}
	k.mu.Unlock()
}

// acquireCounted is pgxpool's Acquire for a caller that take counted as inside it: the count
// comes down however Acquire ends (a hook of the user's that panics in a dial included).
func (s *server) acquireCounted(ctx context.Context) (*pgxpool.Conn, error) {
	defer s.park.acquired()
	return s.pool.Acquire(ctx)
}

// expired reports whether the connection whose wire is w has outlived the server's
// MaxConnLifetime at now.
func (s *server) expired(w *wire.Conn, now mono) bool {
	return s.lifetime > 0 && w != nil && time.Duration(int64(now)-w.Born) >= s.lifetime
}

// current is the parking epoch: that of a connection acquired from pgxpool now.
func (k *parking) current() uint32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.epoch
}

// stat returns pgxpool's Stat and how many connections are parked, at one moment.
func (k *parking) stat(pool *pgxpool.Pool) (*pgxpool.Stat, int32) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return pool.Stat(), int32(len(k.conns))
}
