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

// holders is the registry of the pool's unbounded-lane leases by backend PID: the transactions
// and held connections that may sit on row locks. Short leases are only noted by their PID in
// their slot's entry of the server's live table (liveEntry.pid), so that the Short hot path pays
// two atomic stores for it, on a cache line it owns while it holds the slot, and the lookups name
// them as the pool's own (server.holdsShort).
type holders struct {
	mu     sync.Mutex
	byPID  map[uint32]*lease // guarded by mu
	last   atomic.Int64      // unix nanos of the last lookup
	lookup sync.WaitGroup
}

func (h *holders) add(l *lease) {
	h.mu.Lock()
	if h.byPID == nil {
		h.byPID = make(map[uint32]*lease)
	}
	h.byPID[l.pid] = l
	h.mu.Unlock()
}

func (h *holders) remove(l *lease) {
	h.mu.Lock()
	if h.byPID[l.pid] == l {
		delete(h.byPID, l.pid)
	}
	h.mu.Unlock()
}

// status describes the registered lease of backend pid, if any, as of now. It reads the lease
// under the registry's lock: a lease leaves the registry before it can be reused.
func (h *holders) status(pid uint32, now time.Time) (LeaseStatus, bool) {
	h.mu.Lock()
	l := h.byPID[pid]
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
