package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// TestStressRealPool runs random calls with random cancellations on every lane against the server
// and checks the invariants: never more connections than the pool, no slot leaked at the end, and
// the short lane never waits behind transactions. PGXLANES_STRESS sets its length (default 3s).
func TestStressRealPool(t *testing.T) {
	d := 3 * time.Second
	if v := os.Getenv("PGXLANES_STRESS"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	p := newLanes(t, newDB(t, 100), "pool_max_conns=6&lane_short_acquire_timeout=2s&lane_tx_acquire_timeout=50ms&lane_long_acquire_timeout=50ms")
	stop := time.Now().Add(d)
	var ops, violations atomic.Int64
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
				switch rng.IntN(4) {
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
				}
				cancel()
				ops.Add(1)
				st := p.Stat()
				total := 0
				for _, l := range pgxlanes.Lanes() {
					ls := st.Lane(l)
					total += ls.InUse
					if ls.InUse > ls.MaxConns {
						violations.Add(1)
					}
				}
				if total > 6 || st.Lane(pgxlanes.Tx).InUse+st.Lane(pgxlanes.Long).InUse > 6-st.Lane(pgxlanes.Short).Reserved {
					violations.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if violations.Load() != 0 {
		t.Fatalf("%d invariant violations", violations.Load())
	}
	lanesIdle(t, p, "after stress")
	t.Logf("%s: %d operations", d, ops.Load())
	if ops.Load() < 100 {
		t.Fatalf("only %d operations", ops.Load())
	}
}
