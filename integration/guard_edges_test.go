package integration

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// violationsTo returns a Config hook that sends every violation to the returned channel.
func violationsTo(ch chan pgxlanes.Violation) func(*pgxlanes.Config) {
	return func(c *pgxlanes.Config) {
		c.OnViolation = func(v pgxlanes.Violation) {
			select {
			case ch <- v:
			default:
			}
		}
	}
}

func waitAction(t *testing.T, ch chan pgxlanes.Violation, a pgxlanes.Action, within time.Duration) pgxlanes.Violation {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case v := <-ch:
			if v.Action == a && !v.Warning {
				return v
			}
		case <-deadline:
			t.Fatalf("no %v violation within %v", a, within)
		}
	}
}

// TestHijackAfterGuardCancel: Conn.Hijack after the guard cancelled the held connection hands
// the caller a connection without the guard's backstop socket deadline, after the settle that
// release observes: it stays usable past cancelledAt + CancelGrace.
func TestHijackAfterGuardCancel(t *testing.T) {
	ctx := context.Background()
	ch := make(chan pgxlanes.Violation, 16)
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=2&lane_tx_budget=1s&lane_tx_over_budget=cancel", func(c *pgxlanes.Config) {
		c.CancelGrace = 300 * time.Millisecond
		violationsTo(ch)(c)
	})
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitAction(t, ch, pgxlanes.ActionCancel, 3*time.Second)
	// Still held (the terminate step is at 2 s): the caller takes the connection out of the pool.
	conn := c.Hijack()
	defer conn.Close(ctx)
	time.Sleep(500 * time.Millisecond) // past cancelledAt + CancelGrace
	if _, err := conn.Exec(ctx, "select 1"); err != nil {
		t.Fatalf("hijacked connection unusable: %v (the guard's socket deadline survived Hijack)", err)
	}
}

// TestHijackAfterGuardTerminate: the guard terminates a held connection on its own goroutine;
// the owner's later Hijack, which the documentation allows (it panics only after Release or
// Hijack), hands over the dead connection instead of panicking.
func TestHijackAfterGuardTerminate(t *testing.T) {
	ctx := context.Background()
	ch := make(chan pgxlanes.Violation, 16)
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=2&lane_tx_budget=300ms&lane_tx_over_budget=terminate", violationsTo(ch))
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitAction(t, ch, pgxlanes.ActionTerminate, 5*time.Second)
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Hijack of a connection the guard terminated panicked: %v", r)
		}
	}()
	conn := c.Hijack()
	_ = conn.Close(ctx)
}

// TestAcquireAllIdleGetsLaneTimeouts: AcquireAllIdle's connections are prepared like Acquire's:
// a Tx-lane connection runs under Tx's timeouts, not Short's session defaults.
func TestAcquireAllIdleGetsLaneTimeouts(t *testing.T) {
	ctx := context.Background()
	p := newLanes(t, newDB(t, 10), "pool_max_conns=4")
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want string
	if err := c.QueryRow(ctx, "show statement_timeout").Scan(&want); err != nil {
		t.Fatal(err)
	}
	c.Release()
	conns := p.AcquireAllIdle(ctx)
	if len(conns) == 0 {
		t.Fatal("no idle connection")
	}
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var got string
	if err := conns[0].QueryRow(ctx, "show statement_timeout").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if conns[0].Lane() != pgxlanes.Tx || got != want {
		t.Fatalf("AcquireAllIdle %s connection has statement_timeout %s; Acquire's has %s", conns[0].Lane(), got, want)
	}
}

// TestHugeBudgets: budgets are multiplied (ladder steps, backstop) with saturation and range
// checks: WithBudget of a year must not push idle_in_transaction_session_timeout past
// PostgreSQL's INT_MAX ms (Begin would fail), and WithBudget(MaxInt64) must not overflow into an
// immediate flag.
func TestHugeBudgets(t *testing.T) {
	ctx := context.Background()
	ch := make(chan pgxlanes.Violation, 16)
	p, _ := newGuardedPool(t, newDB(t, 10), "pool_max_conns=4", violationsTo(ch))
	t.Run("BeginYearBudget", func(t *testing.T) {
		tx, err := p.Begin(pgxlanes.WithBudget(ctx, 365*24*time.Hour))
		if err != nil {
			t.Fatalf("Begin with a one-year budget: %v", err)
		}
		_ = tx.Rollback(ctx)
	})
	t.Run("FlagMaxBudget", func(t *testing.T) {
		c, err := p.Acquire(pgxlanes.WithBudget(pgxlanes.WithLane(ctx, pgxlanes.Long), math.MaxInt64))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		select {
		case v := <-ch:
			t.Fatalf("lease with the largest budget flagged after %v: %+v", v.Elapsed, v)
		case <-time.After(300 * time.Millisecond):
		}
	})
}
