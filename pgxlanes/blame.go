package pgxlanes

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// blameInterval rate-limits the lock-holder lookup: it reads pg_locks, which briefly takes the
// lock manager's partition locks.
const blameInterval = time.Second

// holders is the registry of the pool's unbounded-lane leases: the transactions and held
// connections that may sit on row locks. A lease is kept by its slot's index (bySlot, an array
// of one entry per slot up to liveMax, so that registering costs one store under the lock, no
// map), or by its backend PID past that (byPID). Short leases are only noted by their PID in
// their slot's entry of the server's live table (liveEntry.pid), so that the Short hot path pays
// two atomic stores for it, on a cache line it owns while it holds the slot, and the lookups name
// them as the pool's own (server.holdsShort).
type holders struct {
	mu     sync.Mutex
	bySlot []*lease          // guarded by mu; made at addServer
	byPID  map[uint32]*lease // guarded by mu: leases whose slot index is past bySlot
	last   atomic.Int64      // unix nanos of the last lookup
	lookup sync.WaitGroup
}

func (h *holders) add(l *lease) {
	h.mu.Lock()
	if i := l.slot.Index(); i < len(h.bySlot) {
		h.bySlot[i] = l
	} else {
		if h.byPID == nil {
			h.byPID = make(map[uint32]*lease)
		}
		h.byPID[l.pid] = l
	}
	h.mu.Unlock()
}

func (h *holders) remove(l *lease) {
	h.mu.Lock()
	if i := l.slot.Index(); i < len(h.bySlot) {
		if h.bySlot[i] == l {
			h.bySlot[i] = nil
		}
	} else if h.byPID[l.pid] == l {
		delete(h.byPID, l.pid)
	}
	h.mu.Unlock()
}

// eachLocked calls f for every registered lease. Caller must hold h.mu.
func (h *holders) eachLocked(f func(*lease)) {
	for _, l := range h.bySlot {
		if l != nil {
			f(l)
		}
	}
	for _, l := range h.byPID {
		f(l)
	}
}

// byPIDLocked returns the registered lease of backend pid, or nil. Caller must hold h.mu. It
// scans the slots' array: lookups are rare (a lock timeout's report, the status page's lock
// waits), registering is not.
func (h *holders) byPIDLocked(pid uint32) *lease {
	if pid == 0 {
		return nil
	}
	for _, l := range h.bySlot {
		if l != nil && l.pid == pid {
			return l
		}
	}
	return h.byPID[pid]
}

// status describes the registered lease of backend pid, if any, as of now. It reads the lease
// under the registry's lock: a lease leaves the registry before it can be reused.
func (h *holders) status(pid uint32, now time.Time) (LeaseStatus, bool) {
	h.mu.Lock()
	l := h.byPIDLocked(pid)
	if l == nil {
		h.mu.Unlock()
		return LeaseStatus{}, false
	}
	ls, site := l.status(now)
	h.mu.Unlock()
	ls.CallSite = site.String()
	return ls, true
}

// lockHolderSQL lists the oldest transactions of this database, other than the one that timed out,
// that hold row-level or stronger table locks: the likely holders of the lock it waited for. The
// waiter itself is no longer waiting when its lock timeout is reported, so pg_blocking_pids cannot
// be asked after the fact.
const lockHolderSQL = `select a.pid, coalesce(a.state, ''), extract(epoch from now() - a.xact_start)::float8,
       string_agg(distinct l.relation::regclass::text, ',')
  from pg_locks l join pg_stat_activity a on a.pid = l.pid
 where l.locktype = 'relation' and l.granted and l.mode <> 'AccessShareLock'
   and a.pid <> pg_backend_pid() and a.pid <> $1 and a.datname = current_database() and a.xact_start is not null
 group by a.pid, a.state, a.xact_start
 order by a.xact_start
 limit 5`

// blameLockTimeout logs the likely holders of the lock a statement of l gave up on, naming the
// pool's own leases by lane, tag and call site. It runs at most once per blameInterval, in the
// background, over the guard connection.
func (p *Pool) blameLockTimeout(l *lease) {
	srv := l.srv
	now := time.Now().UnixNano()
	last := srv.holders.last.Load()
	if now-last < int64(blameInterval) || !srv.holders.last.CompareAndSwap(last, now) {
		return
	}
	waiter, lane, tag := l.pid, l.rt.lane, l.rt.tag
	srv.holders.lookup.Add(1)
	go func() {
		defer srv.holders.lookup.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		type holder struct {
			pid    uint32
			state  string
			age    float64
			tables string
		}
		var hs []holder
		qerr := srv.term.with(ctx, func(c *pgx.Conn) error {
			rows, err := c.Query(ctx, guardTag+lockHolderSQL, int32(waiter))
			if err != nil {
				return err
			}
			for rows.Next() {
				var h holder
				var pid int32
				if err := rows.Scan(&pid, &h.state, &h.age, &h.tables); err != nil {
					return err
				}
				h.pid = uint32(pid)
				hs = append(hs, h)
			}
			return rows.Err()
		})
		attrs := []slog.Attr{slog.String("lane", lane.String()), slog.String("tag", tag), slog.Uint64("pid", uint64(waiter))}
		if qerr != nil {
			attrs = append(attrs, slog.String("error", qerr.Error()))
			p.obs.logger.LogAttrs(ctx, slog.LevelWarn, "pgxlanes: lock timeout; holders unknown", attrs...)
			return
		}
		for i, h := range hs {
			g := []any{slog.Uint64("pid", uint64(h.pid)), slog.String("state", h.state),
				slog.Duration("xact_age", time.Duration(h.age*float64(time.Second))), slog.String("tables", h.tables)}
			if m, ok := srv.holders.status(h.pid, time.Now()); ok {
				g = append(g, slog.String("lane", m.Lane.String()), slog.String("tag", m.Tag),
					slog.Duration("held", m.Age))
				if m.CallSite != "" {
					g = append(g, slog.String("call_site", m.CallSite))
				}
			} else if srv.holdsShort(h.pid) {
				g = append(g, slog.String("lane", Short.String()))
			} else {
				g = append(g, slog.String("lane", "not this pool"))
			}
			attrs = append(attrs, slog.Group("holder"+string(rune('1'+i)), g...))
		}
		p.obs.logger.LogAttrs(ctx, slog.LevelWarn, "pgxlanes: lock timeout; likely holders", attrs...)
	}()
}
