package integration

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestMisuseCatalogue: each misuse of the API against a real server gets a clear error or a
// documented no-op, never a panic, except the panics docs/migration.md documents (Conn and
// Hijack after release). After each case the pool is idle and still serves.
// TestReleasedConnNeverReachesTheConnection covers every method of a released Conn, and
// TestHugeBudgets budgets of a year and of MaxInt64.
func TestMisuseCatalogue(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 10)
	p := newLanes(t, dsn, "pool_max_conns=4")

	for _, tc := range []struct {
		name string
		f    func(t *testing.T)
	}{
		{"double Release", func(t *testing.T) {
			c, err := p.Acquire(bg)
			require.NoError(t, err)
			c.Release()
			c.Release() // documented no-op
		}},
		{"use after Release", func(t *testing.T) {
			c, err := p.Acquire(bg)
			require.NoError(t, err)
			c.Release()
			_, err = c.Exec(bg, "select 1")
			require.ErrorIs(t, err, pgxlanes.ErrReleased)
			require.ErrorIs(t, c.QueryRow(bg, "select 1").Scan(new(int)), pgxlanes.ErrReleased)
		}},
		{"Conn and Hijack after Release panic with a message", func(t *testing.T) {
			c, err := p.Acquire(bg)
			require.NoError(t, err)
			c.Release()
			for name, f := range map[string]func(){"Conn": func() { c.Conn() }, "Hijack": func() { c.Hijack() }} {
				msg := panicMessage(f)
				assert.Contains(t, msg, "pgxlanes", "%s after Release panics with a message", name)
			}
		}},
		{"Commit after Rollback", func(t *testing.T) {
			tx, err := p.Begin(bg)
			require.NoError(t, err)
			require.NoError(t, tx.Rollback(bg))
			require.ErrorIs(t, tx.Commit(bg), pgx.ErrTxClosed)
			require.ErrorIs(t, tx.Rollback(bg), pgx.ErrTxClosed)
			_, err = tx.Exec(bg, "select 1")
			require.ErrorIs(t, err, pgx.ErrTxClosed)
		}},
		{"Rollback after Commit", func(t *testing.T) {
			tx, err := p.Begin(bg)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(bg))
			require.ErrorIs(t, tx.Rollback(bg), pgx.ErrTxClosed) // what pgx.BeginFunc's deferred Rollback ignores
			require.ErrorIs(t, tx.Commit(bg), pgx.ErrTxClosed)
		}},
		{"rows used after Close", func(t *testing.T) {
			rows, err := p.Query(bg, "select g from generate_series(1, 3) g")
			require.NoError(t, err)
			rows.Close()
			rows.Close()
			assert.False(t, rows.Next())
			assert.NoError(t, rows.Err())
		}},
		{"batch results closed twice", func(t *testing.T) {
			br := p.SendBatch(bg, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "select 1"}}})
			require.NoError(t, br.Close())
			assert.NoError(t, br.Close())
			_, err := br.Exec()
			assert.Error(t, err)
		}},
		{"negative budget removes an earlier WithBudget", func(t *testing.T) {
			ctx := pgxlanes.WithBudget(pgxlanes.WithBudget(bg, time.Millisecond), -5*time.Second)
			assert.Zero(t, pgxlanes.AnnotationsFrom(ctx).Budget)
			tx, err := p.Begin(ctx)
			require.NoError(t, err)
			time.Sleep(50 * time.Millisecond) // far past the removed 1 ms budget
			require.NoError(t, tx.Commit(bg), "the lane's budget applies, not the removed one")
		}},
		{"huge and minimal budgets", func(t *testing.T) {
			for _, d := range []time.Duration{math.MaxInt64, math.MinInt64, pgxlanes.Off, time.Nanosecond} {
				tx, err := p.Begin(pgxlanes.WithBudget(bg, d))
				if d == time.Nanosecond && err != nil {
					// The guard may cancel the BEGIN itself: Begin then says why.
					require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
					continue
				}
				require.NoError(t, err, "budget %d", d)
				_, err = tx.Exec(bg, "select 1")
				if d == time.Nanosecond {
					// Over its budget at once: the guard cancels it, and its calls say so.
					if err == nil {
						require.Eventually(t, func() bool {
							_, err = tx.Exec(bg, "select 1")
							return err != nil
						}, 5*time.Second, 5*time.Millisecond)
					}
					require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
					require.NoError(t, tx.Rollback(bg))
					continue
				}
				require.NoError(t, err, "budget %d", d)
				require.NoError(t, tx.Commit(bg))
			}
		}},
		{"invalid lanes", func(t *testing.T) {
			for _, l := range []pgxlanes.Lane{3, 255, pgxlanes.Lane(math.MaxUint8)} {
				ctx := pgxlanes.WithLane(bg, l)
				_, err := p.Exec(ctx, "select 1")
				require.ErrorContains(t, err, "unknown lane")
				_, err = p.Begin(ctx)
				require.ErrorContains(t, err, "unknown lane")
				_, err = p.Acquire(ctx)
				require.ErrorContains(t, err, "unknown lane")
				require.ErrorContains(t, p.QueryRow(ctx, "select 1").Scan(new(int)), "unknown lane")
				assert.Empty(t, p.AcquireAllIdle(ctx))
				assert.Nil(t, p.Config().Lane(l))
				assert.NotPanics(t, func() { _ = p.Stat().Lane(l) })
			}
			_, err := pgxlanes.ParseLane("bulk")
			require.ErrorContains(t, err, `unknown lane "bulk"`)
		}},
		{"nil and partial configs", func(t *testing.T) {
			for i, c := range []*pgxlanes.Config{nil, {}, {Config: &pgxpool.Config{}}} {
				_, err := pgxlanes.NewWithConfig(bg, c)
				require.ErrorContains(t, err, "pgxlanes: Config must", "config %d", i)
			}
			cfg, err := pgxlanes.ParseConfig(dsn)
			require.NoError(t, err)
			for _, tc := range []struct {
				mod  func(*pgxlanes.Config)
				want string
			}{
				{func(c *pgxlanes.Config) { c.MaxConns = 0 }, "MaxConns (pool_max_conns)"},
				{func(c *pgxlanes.Config) { c.MaxConns = -3 }, "MaxConns (pool_max_conns)"},
				{func(c *pgxlanes.Config) { c.Tx.Reserved = -5 }, "lane_tx_reserved"},
				{func(c *pgxlanes.Config) { c.Short.AcquireTimeout = -time.Hour }, "lane_short_acquire_timeout"},
				{func(c *pgxlanes.Config) { c.Long.OverBudget = pgxlanes.Action(9) }, "lane_long_over_budget"},
				{func(c *pgxlanes.Config) { c.CancelGrace = -time.Second }, "CancelGrace"},
				{func(c *pgxlanes.Config) { c.Short.Reserved = 100 }, "pool_max_conns"},
			} {
				c := cfg.Copy()
				tc.mod(c)
				_, err := pgxlanes.NewWithConfig(bg, c)
				require.ErrorContains(t, err, tc.want)
			}
		}},
		{"use after Close", func(t *testing.T) {
			q := newLanes(t, dsn, "pool_max_conns=2")
			held, err := q.Acquire(bg)
			require.NoError(t, err)
			closed := make(chan struct{})
			go func() { q.Close(); close(closed) }()
			held.Release() // released after Close was called: Close returns
			<-closed
			q.Close() // a second Close is a no-op
			_, err = q.Exec(bg, "select 1")
			require.ErrorIs(t, err, pgxlanes.ErrClosed)
			_, err = q.Query(bg, "select 1")
			require.ErrorIs(t, err, pgxlanes.ErrClosed)
			require.ErrorIs(t, q.QueryRow(bg, "select 1").Scan(new(int)), pgxlanes.ErrClosed)
			_, err = q.Begin(bg)
			require.ErrorIs(t, err, pgxlanes.ErrClosed)
			_, err = q.Acquire(bg)
			require.ErrorIs(t, err, pgxlanes.ErrClosed)
			require.ErrorIs(t, q.Ping(bg), pgxlanes.ErrClosed)
			require.ErrorIs(t, q.SendBatch(bg, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: "select 1"}}}).Close(), pgxlanes.ErrClosed)
			_, err = q.CopyFrom(bg, pgx.Identifier{"items"}, []string{"id", "v"}, pgx.CopyFromRows([][]any{{1000, 1}}))
			require.ErrorIs(t, err, pgxlanes.ErrClosed)
			require.ErrorIs(t, q.AcquireFunc(bg, func(*pgxlanes.Conn) error { return nil }), pgxlanes.ErrClosed)
			assert.Empty(t, q.AcquireAllIdle(bg))
			held.Release()
			_, err = held.Exec(bg, "select 1")
			require.ErrorIs(t, err, pgxlanes.ErrReleased)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.NotPanics(t, func() { tc.f(t) })
			lanesIdle(t, p, tc.name)
			require.NoError(t, p.QueryRow(bg, "select 1").Scan(new(int)), "the pool serves after the misuse")
		})
	}
}

// panicMessage runs f and returns what it panicked with, "" if it did not.
func panicMessage(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}
