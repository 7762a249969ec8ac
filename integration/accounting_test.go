package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestSlotHeldExactlyAsLongAsTheConnection: the lane slot follows the connection: open rows hold
// it, closing or draining them releases it, Scan releases a row's, and panics release too.
func TestSlotHeldExactlyAsLongAsTheConnection(t *testing.T) {
	ctx := context.Background()
	p := newLanes(t, newDB(t, 10), "pool_max_conns=4")
	inUse := func(l pgxlanes.Lane) int { return p.Stat().Lane(l).InUse }

	rows, err := p.Query(ctx, "select id from items order by id")
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	if inUse(pgxlanes.Short) != 1 || p.Stat().AcquiredConns() != 1 {
		t.Fatalf("open rows: short in use %d, acquired %d", inUse(pgxlanes.Short), p.Stat().AcquiredConns())
	}
	rows.Close()
	rows.Close()
	lanesIdle(t, p, "Rows.Close")

	rows, err = p.Query(ctx, "select id from items")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lanesIdle(t, p, "rows drained")

	row := p.QueryRow(ctx, "select 1")
	if inUse(pgxlanes.Short) != 1 {
		t.Fatal("QueryRow before Scan does not hold its slot")
	}
	_ = row.Scan(new(int))
	lanesIdle(t, p, "Row.Scan")

	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		_ = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "update items set v = -1 where id = 1"); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	lanesIdle(t, p, "panic in BeginFunc")
	var v int
	if err := p.QueryRow(ctx, "select v from items where id = 1").Scan(&v); err != nil || v != 1 {
		t.Fatalf("the panicking transaction was not rolled back: v=%d %v", v, err)
	}

	func() {
		defer func() { _ = recover() }()
		_ = p.AcquireFunc(ctx, func(c *pgxlanes.Conn) error { panic("boom") })
	}()
	lanesIdle(t, p, "panic in AcquireFunc")

	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pc := c.Hijack()
	lanesIdle(t, p, "Hijack")
	if err := pc.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	_ = pc.Close(ctx)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("second Hijack did not panic")
			}
		}()
		c.Hijack()
	}()
	c.Release() // after Hijack: a no-op
	lanesIdle(t, p, "Release after Hijack")
}

// TestCloseWakesWaiters: Close with callers queued wakes them with ErrClosed; the call returns once
// the held connections are back.
func TestCloseWakesWaiters(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	p, err := pgxlanes.New(ctx, withParams(newDB(t, 10), "pool_max_conns=2"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := p.Begin(ctx) // the Tx lane's whole capacity (2 - short reserve 1)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := p.Begin(ctx)
			errc <- err
		}()
	}
	pgserver.Eventually(t, 5*time.Second, "3 waiters queued", func() bool { return p.Stat().Lane(pgxlanes.Tx).Waiting == 3 })
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	for range 3 {
		if err := <-errc; !errors.Is(err, pgxlanes.ErrClosed) {
			t.Fatalf("waiter: %v, want ErrClosed", err)
		}
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a transaction still held a connection")
	case <-time.After(50 * time.Millisecond):
	}
	_ = tx.Rollback(ctx)
	<-closed
	if _, err := p.Exec(ctx, "select 1"); !errors.Is(err, pgxlanes.ErrClosed) {
		t.Fatalf("Exec after Close: %v", err)
	}
}

// TestCancellationPathsLeakNothing: cancelled and timed-out acquires, queries and transactions
// leave no slot held and no goroutine behind.
func TestCancellationPathsLeakNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	p, err := pgxlanes.New(ctx, withParams(newDB(t, 10), "pool_max_conns=3&lane_tx_acquire_timeout=30ms"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Open a connection first: the 30ms acquire timeout also bounds a dial, which a loaded
	// machine can take longer than.
	if err := p.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 4 {
			case 0: // caller cancels while queued
				c, cancel := context.WithCancel(ctx)
				time.AfterFunc(time.Duration(i)*time.Millisecond, cancel)
				if tx, err := p.Begin(c); err == nil {
					_ = tx.Rollback(ctx)
				}
			case 1: // lane acquire timeout
				if tx, err := p.Begin(ctx); err == nil {
					_ = tx.Rollback(ctx)
				}
			case 2: // caller cancels a running query
				c, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
				_, _ = p.Exec(c, "select pg_sleep(1)")
				cancel()
			case 3: // rows abandoned by a cancelled context
				c, cancel := context.WithCancel(ctx)
				rows, err := p.Query(c, "select g from generate_series(1, 100000) g")
				if err == nil {
					rows.Next()
					cancel()
					for rows.Next() {
					}
					rows.Close()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	_ = held.Rollback(ctx)
	lanesIdle(t, p, "after cancellations")
	p.Close()
}

// TestStressRealPool runs random calls with random cancellations on every lane against the server:
// queries, rows read in part or left open (leaked: the guard's budget reclaims them), transactions
// that commit or roll back, held connections, acquire timeouts, budget kills, and Close at the
// end. A monitor checks the invariants all the time, not only between calls:
//   - never more server sessions than pool_max_conns plus the guard session (pg_stat_activity,
//     by application_name);
//   - no lane over its cap, the lanes together never over the pool;
//   - never a reserve taken by another lane's unbounded work: the unbounded lanes together stay
//     out of Short's reserve, and their slots beyond their own reserves fit in the shared slots;
//   - counts balanced: every successful acquire the observer saw ended in one release, the
//     lanes' Acquires equal the observer's, and every lane is back to 0 at quiescence.
//
// PGXLANES_STRESS sets its length (default 3s).
func TestStressRealPool(t *testing.T) {
	d := 3 * time.Second
	if v := os.Getenv("PGXLANES_STRESS"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	leak := goleak.IgnoreCurrent()
	ctx := context.Background()
	const size = 6
	dsn := newDB(t, 100)
	p := newLanes(t, dsn, "pool_max_conns=6&application_name=pgxlanes_stress&lane_short_acquire_timeout=2s&lane_tx_acquire_timeout=50ms&lane_long_acquire_timeout=50ms")
	var obs countingObserver
	p.AddObserver(&obs)
	stop := time.Now().Add(d)
	var ops atomic.Int64
	var mon stressMonitor
	monDone := make(chan struct{})
	go func() {
		defer close(monDone)
		mon.run(t, p, dsn, size, stop)
	}()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for time.Now().Before(stop) {
				c, cancel := context.WithCancel(ctx)
				if rng.IntN(4) == 0 {
					time.AfterFunc(time.Duration(rng.IntN(30))*time.Millisecond, cancel)
				}
				lane := pgxlanes.Lane(rng.IntN(3))
				lc := pgxlanes.WithLane(c, lane)
				switch rng.IntN(7) {
				case 0:
					_ = p.QueryRow(lc, "select v from items where id = $1", 1+rng.IntN(100)).Scan(new(int))
				case 1:
					_ = pgx.BeginFunc(lc, p, func(tx pgx.Tx) error {
						_, err := tx.Exec(lc, "select pg_sleep($1::float8)", float64(rng.IntN(20))/1000)
						return err
					})
				case 2:
					if rows, err := p.Query(lc, "select g from generate_series(1, 50) g"); err == nil {
						for i := 0; rows.Next() && i < rng.IntN(60); i++ {
						}
						rows.Close()
					}
				case 3:
					if conn, err := p.Acquire(lc); err == nil {
						_, _ = conn.Exec(lc, "select 1")
						conn.Release()
					}
				case 4: // rollback
					if tx, err := p.Begin(lc); err == nil {
						_, _ = tx.Exec(lc, "update items set v = v where id = $1", 1+rng.IntN(100))
						_ = tx.Rollback(ctx)
					}
				case 5: // budget kill: the guard cancels the statement at 30ms
					if tx, err := p.Begin(pgxlanes.WithBudget(lc, 30*time.Millisecond)); err == nil {
						_, _ = tx.Exec(lc, "select pg_sleep(0.2)")
						_ = tx.Rollback(ctx)
					}
				case 6: // leaked rows, now and then: never closed; the guard ends them at twice their
					// budget (Short and Tx cancel, then terminate; Long only flags, so not on Long)
					if rng.IntN(20) == 0 {
						ll := pgxlanes.Lane(rng.IntN(2))
						if rows, err := p.Query(pgxlanes.WithBudget(pgxlanes.WithLane(ctx, ll), 50*time.Millisecond), "select 1"); err == nil {
							_ = rows // leaked on purpose
						}
					}
				}
				cancel()
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	<-monDone
	lanesIdle(t, p, "after stress")
	mon.report(t)
	st := p.Stat()
	var acquires int64
	for _, l := range pgxlanes.Lanes() {
		acquires += st.Lane(l).Acquires
	}
	assert.Equal(t, obs.acquired.Load(), acquires, "the lanes' Acquires equal the successful acquires observed")
	assert.Equal(t, obs.acquired.Load(), obs.released.Load(), "every successful acquire ended in one release")
	p.Close()
	goleak.VerifyNone(t, leak)
	t.Logf("%s: %d operations, %d acquires", d, ops.Load(), acquires)
	if ops.Load() < 100 {
		t.Fatalf("only %d operations", ops.Load())
	}
}

// countingObserver counts successful acquires and releases.
type countingObserver struct{ acquired, released atomic.Int64 }

func (o *countingObserver) ObserveAcquire(e pgxlanes.AcquireEvent) {
	if e.Err == nil {
		o.acquired.Add(1)
	}
}
func (o *countingObserver) ObserveRelease(pgxlanes.ReleaseEvent) { o.released.Add(1) }

// stressMonitor checks the pool's invariants while the stress runs.
type stressMonitor struct {
	samples, sessionSamples int
	violations              []string
	maxSessions, maxGuards  int
}

func (m *stressMonitor) fail(format string, args ...any) {
	if len(m.violations) < 20 {
		m.violations = append(m.violations, fmt.Sprintf(format, args...))
	}
}

// run samples the lanes every millisecond and the server's sessions every 20 ms until stop.
func (m *stressMonitor) run(t *testing.T, p *pgxlanes.Pool, dsn string, size int, stop time.Time) {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		m.fail("monitor: %v", err)
		return
	}
	defer admin.Close(ctx)
	var db string
	if err := admin.QueryRow(ctx, "select current_database()").Scan(&db); err != nil {
		m.fail("monitor: %v", err)
		return
	}
	over := 0 // consecutive session samples over the bound
	for i := 0; time.Now().Before(stop); i++ {
		st := p.Stat()
		m.samples++
		var total int
		ls := map[pgxlanes.Lane]pgxlanes.LaneStat{}
		for _, l := range pgxlanes.Lanes() {
			s := st.Lane(l)
			ls[l] = s
			total += s.InUse
			if s.InUse > s.MaxConns {
				m.fail("%s in use %d over its cap %d", l, s.InUse, s.MaxConns)
			}
		}
		short, tx, long := ls[pgxlanes.Short], ls[pgxlanes.Tx], ls[pgxlanes.Long]
		shared := size - short.Reserved - tx.Reserved - long.Reserved
		switch {
		case total > size:
			m.fail("the lanes hold %d slots of %d", total, size)
		case tx.InUse+long.InUse > size-short.Reserved:
			m.fail("unbounded work in Short's reserve: tx %d + long %d > %d", tx.InUse, long.InUse, size-short.Reserved)
		case max(0, tx.InUse-tx.Reserved)+max(0, long.InUse-long.Reserved) > shared:
			m.fail("an unbounded lane in another's reserve: tx %d/%d, long %d/%d, shared %d", tx.InUse, tx.Reserved, long.InUse, long.Reserved, shared)
		}
		if i%20 == 0 {
			var sessions, guards int
			if err := admin.QueryRow(ctx, `select count(*) filter (where application_name = 'pgxlanes_stress'),
				count(*) filter (where application_name = 'pgxlanes guard')
				from pg_stat_activity where datname = $1`, db).Scan(&sessions, &guards); err != nil {
				m.fail("monitor: %v", err)
				return
			}
			m.sessionSamples++
			m.maxSessions, m.maxGuards = max(m.maxSessions, sessions), max(m.maxGuards, guards)
			// A backend whose client closed its connection exits a moment later, and may still be
			// listed while the pool opens the next: over the bound in three samples running (40 ms)
			// is a violation, once is not.
			if sessions > size || guards > 1 {
				if over++; over == 3 {
					m.fail("%d pool sessions and %d guard sessions on the server for 40 ms (pool_max_conns %d)", sessions, guards, size)
				}
			} else {
				over = 0
			}
		}
		time.Sleep(time.Millisecond)
	}
}

func (m *stressMonitor) report(t *testing.T) {
	t.Helper()
	t.Logf("monitor: %d samples of the lanes, %d of the server's sessions; at most %d pool sessions and %d guard sessions",
		m.samples, m.sessionSamples, m.maxSessions, m.maxGuards)
	assert.Empty(t, m.violations, "invariant violations")
	assert.Greater(t, m.sessionSamples, 10, "the monitor must sample to mean anything")
}
