package pgxlanestest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Target is where HoldLocks opens its transactions:
//   - a *pgxlanes.Pool: the service's own pool. The transactions go to its Tx lane, under that
//     lane's timeouts and budget, as the service's own long transactions would;
//   - a DSN string: another client of the database (another service, a batch job). The
//     transactions take none of the pool's connections, only its rows. DSN(tb, pool) gives the
//     DSN of a pool's database.
type Target interface {
	*pgxlanes.Pool | string
}

// pollInterval is how often the helpers look at the server or the pool while they set up.
const pollInterval = 5 * time.Millisecond

// endTimeout bounds the rollback of a holder's transaction and the closing of its connection.
const endTimeout = 5 * time.Second

// Holders are the transactions of a HoldLocks. Their methods are safe for concurrent use.
type Holders struct {
	tb     testing.TB
	cancel context.CancelFunc
	wg     sync.WaitGroup
	h      []holder
	once   sync.Once
}

// holder states
const (
	holderStarting int32 = iota // connecting, or waiting for a connection of the pool
	holderBegun                 // in its transaction, locking (perhaps waiting for the locks)
	holderLocked                // holding its locks
	holderEnded
)

type holder struct {
	state atomic.Int32
	pid   atomic.Uint32
	// err is why the holder ended before its time, if it did; written before state becomes
	// holderEnded.
	err   error
	ended time.Duration // how long after the start it ended
}

// HoldLocks starts n transactions on db that each lock the rows of table matching where (an SQL
// condition, with $1, $2, ... taken from args; "" for every row) with SELECT ... FOR UPDATE, and
// hold them until d has passed, Stop is called or the test ends, then roll back. The first
// transaction gets the locks and the others wait for them in the server, each on a connection of
// its own: a storm of long transactions on a hot row. To lock different rows, call HoldLocks once
// for each.
//
//	// 6 transactions sit on account 1 for at most 5 s: the pool's Tx lane is full.
//	pgxlanestest.HoldLocks(t, pool, 6, 5*time.Second, "accounts", "id = $1", 1)
//
// It returns once every transaction holds the locks or waits for them in the server, so that
// what the test does next runs under the storm. table is an identifier, schema-qualified or not
// ("accounts", "app.accounts"), quoted as given.
//
// With a pool, the transactions are the pool's: they go to the Tx lane, and n may not exceed the
// lane's MaxConns. The lane's lock_timeout (10 s by default) and budget apply to them: a
// transaction that waits for the locks longer than the lock timeout, or that the budget cancels,
// ends early, and Stop logs it. With a DSN, each transaction has a connection of its own and no
// timeout but d.
//
// HoldLocks fails tb if a parameter is wrong, if the rows are not there, or if a transaction
// cannot begin (a Tx lane that cannot give n connections within 10 s).
func HoldLocks[DB Target](tb testing.TB, db DB, n int, d time.Duration, table, where string, args ...any) *Holders {
	tb.Helper()
	h, err := holdLocks(db, n, d, table, where, args)
	if err != nil {
		tb.Fatalf("pgxlanestest: HoldLocks: %v", err)
	}
	h.tb = tb
	tb.Cleanup(h.Stop)
	return h
}

// beginFunc begins a holder's transaction; end rolls it back and gives its connection back.
type beginFunc func(ctx context.Context) (tx pgx.Tx, end func(), err error)

func holdLocks(db any, n int, d time.Duration, table, where string, args []any) (*Holders, error) {
	switch {
	case n < 1:
		return nil, fmt.Errorf("n = %d: want at least 1 transaction", n)
	case d <= 0:
		return nil, fmt.Errorf("d = %v: want a positive duration", d)
	}
	sql, err := lockSQL(table, where)
	if err != nil {
		return nil, err
	}

	var begin beginFunc
	var monitor *pgx.ConnConfig // for watching the transactions wait
	switch db := db.(type) {
	case *pgxlanes.Pool:
		if db == nil {
			return nil, errors.New("db: the pool is nil")
		}
		if max := db.Stat().Lane(pgxlanes.Tx).MaxConns; n > max {
			return nil, fmt.Errorf("n = %d exceeds the pool's Tx lane, which holds at most %d connections "+
				"(pool_max_conns, lane_tx_max_conns)", n, max)
		}
		begin = poolBegin(db)
		monitor = db.Config().ConnConfig.Copy()
	case string:
		cfg, err := pgx.ParseConfig(db)
		if err != nil {
			return nil, errors.New("db: not a valid DSN") // the parse error may quote the password
		}
		begin = connBegin(cfg)
		monitor = cfg.Copy()
	}
	monitor.Tracer = nil // the user's tracer sees the user's statements only
	if monitor.RuntimeParams == nil {
		monitor.RuntimeParams = map[string]string{}
	}
	monitor.RuntimeParams["application_name"] = "pgxlanestest monitor"

	ctx, cancel := context.WithTimeout(context.Background(), d)
	h := &Holders{cancel: cancel, h: make([]holder, n)}
	start := time.Now()
	for i := range h.h {
		h.wg.Add(1)
		go h.run(ctx, &h.h[i], start, begin, sql, args)
	}
	if err := h.waitInPlace(ctx, monitor); err != nil {
		h.stop()
		return nil, err
	}
	return h, nil
}

// lockSQL is the holders' statement.
func lockSQL(table, where string) (string, error) {
	if strings.TrimSpace(table) == "" {
		return "", errors.New("table is empty")
	}
	parts := strings.Split(table, ".")
	for _, p := range parts {
		if p == "" {
			return "", fmt.Errorf("table %q is not a name or schema.name", table)
		}
	}
	sql := "select 1 from " + pgx.Identifier(parts).Sanitize()
	if strings.TrimSpace(where) != "" {
		sql += " where " + where
	}
	return sql + " for update", nil
}

// beginPatience is how long a holder retries a Begin that failed with ErrAcquireTimeout: a lane
// whose acquire timeout is shorter than opening a connection is no reason to fail.
const beginPatience = 10 * time.Second

func poolBegin(p *pgxlanes.Pool) beginFunc {
	return func(ctx context.Context) (pgx.Tx, func(), error) {
		ctx = pgxlanes.WithTag(ctx, "pgxlanestest.HoldLocks")
		start := time.Now()
		tx, err := p.Begin(ctx)
		for errors.Is(err, pgxlanes.ErrAcquireTimeout) && time.Since(start) < beginPatience {
			tx, err = p.Begin(ctx)
		}
		if err != nil {
			return nil, nil, err
		}
		return tx, func() {
			ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
			defer cancel()
			_ = tx.Rollback(ctx) // a transaction the guard ended fails its Rollback; its slot is free anyway
		}, nil
	}
}

func connBegin(cfg *pgx.ConnConfig) beginFunc {
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = "pgxlanestest HoldLocks"
	return func(ctx context.Context) (pgx.Tx, func(), error) {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		tx, err := conn.Begin(ctx)
		end := func() {
			ctx, cancel := context.WithTimeout(context.Background(), endTimeout)
			defer cancel()
			conn.Close(ctx) // the server rolls back
		}
		if err != nil {
			end()
			return nil, nil, err
		}
		return tx, end, nil
	}
}

// run is one holder: begin, lock, wait for the end, roll back.
func (h *Holders) run(ctx context.Context, hd *holder, start time.Time, begin beginFunc, sql string, args []any) {
	defer h.wg.Done()
	var err error
	defer func() {
		if ctx.Err() != nil {
			err = nil // the planned end
		}
		hd.err = err
		hd.ended = time.Since(start)
		hd.state.Store(holderEnded)
	}()
	tx, end, err := begin(ctx)
	if err != nil {
		return
	}
	defer end()
	hd.pid.Store(tx.Conn().PgConn().PID())
	hd.state.Store(holderBegun)
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return
	}
	if tag.RowsAffected() == 0 {
		err = errors.New("no row matches: there is nothing to lock")
		return
	}
	hd.state.Store(holderLocked)
	<-ctx.Done()
}

// waitInPlace polls until every holder holds its locks, waits for them in the server, or has
// ended, and returns the error of a holder that failed meanwhile.
func (h *Holders) waitInPlace(ctx context.Context, monitor *pgx.ConnConfig) error {
	conn, err := pgx.ConnectConfig(ctx, monitor)
	if err != nil {
		if ctx.Err() != nil {
			return nil // d has passed: nothing to wait for
		}
		return fmt.Errorf("watch the transactions: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var waiting []uint32 // pids of holders in their transaction, not yet holding
		placed := 0
		for i := range h.h {
			hd := &h.h[i]
			switch hd.state.Load() {
			case holderEnded:
				if hd.err != nil {
					return fmt.Errorf("transaction %d of %d: %w", i+1, len(h.h), hd.err)
				}
				placed++
			case holderLocked:
				placed++
			case holderBegun:
				waiting = append(waiting, hd.pid.Load())
			}
		}
		if len(waiting) > 0 {
			var blocked int
			err := conn.QueryRow(ctx, `select count(*) from pg_stat_activity
				where pid = any($1) and wait_event_type = 'Lock'`, waiting).Scan(&blocked)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("watch the transactions: %w", err)
			}
			placed += blocked
		}
		if placed == len(h.h) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pollInterval):
		}
	}
}

// Locked returns how many of the transactions hold their locks now.
func (h *Holders) Locked() int {
	n := 0
	for i := range h.h {
		if h.h[i].state.Load() == holderLocked {
			n++
		}
	}
	return n
}

// Stop ends every transaction now, rolling it back, and returns when all are gone. It logs those
// that ended early and why (a lock timeout, the budget). It is safe to call more than once; the
// test's cleanup calls it.
func (h *Holders) Stop() {
	h.once.Do(func() {
		h.stop()
		for i := range h.h {
			if hd := &h.h[i]; hd.err != nil {
				h.tb.Logf("pgxlanestest: HoldLocks: transaction %d of %d ended early, after %s: %v",
					i+1, len(h.h), hd.ended.Round(time.Millisecond), hd.err)
			}
		}
	})
}

func (h *Holders) stop() {
	h.cancel()
	h.wg.Wait()
}
