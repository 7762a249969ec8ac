package integration

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestCommitRacesTheGuard: transactions whose Commit races the guard's action at their budget,
// 1,000 per action. Commit must tell the truth, checked against the rows in the table: nil only
// for a transaction that committed, a *BudgetError only for one that did not, and
// ErrCommitOutcomeUnknown (either way) only when the session was lost after the COMMIT was sent.
// A caller told "failed" retries and applies its work twice.
func TestCommitRacesTheGuard(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, action := range []string{"cancel", "terminate"} {
		t.Run(action, func(t *testing.T) {
			const runs, workers = 1000, 8
			const budget = 30 * time.Millisecond
			bg := context.Background()
			dsn := newDB(t, 1)
			admin, err := pgx.Connect(bg, dsn)
			require.NoError(t, err)
			defer admin.Close(bg)
			_, err = admin.Exec(bg, "create table done (id int primary key)")
			require.NoError(t, err)
			p := newLanes(t, dsn, "pool_max_conns=12&lane_short_reserved=2&lane_long_reserved=1&lane_long_max_conns=1&lane_tx_reserved=9&lane_tx_max_conns=9&lane_tx_acquire_timeout=10s&lane_tx_over_budget="+action)

			type outcome struct {
				id  int
				err error
			}
			results := make(chan outcome, runs)
			ids := make(chan int, runs)
			for i := range runs {
				ids <- i
			}
			close(ids)
			var wg sync.WaitGroup
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for id := range ids {
						ctx := pgxlanes.WithBudget(bg, budget)
						tx, err := p.Begin(ctx)
						if err != nil {
							results <- outcome{id, err}
							continue
						}
						start := time.Now()
						if _, err := tx.Exec(ctx, "insert into done values ($1)", id); err != nil {
							_ = tx.Rollback(ctx)
							results <- outcome{id, err}
							continue
						}
						// Commit around the budget: a little before, at, or a little after.
						time.Sleep(time.Until(start.Add(budget - 4*time.Millisecond + rand.N(8*time.Millisecond))))
						err = tx.Commit(ctx)
						_ = tx.Rollback(ctx)
						results <- outcome{id, err}
					}
				}()
			}
			wg.Wait()
			close(results)

			rows, err := admin.Query(bg, "select id from done")
			require.NoError(t, err)
			committed := map[int]bool{}
			for _, id := range must(pgx.CollectRows(rows, pgx.RowTo[int32])) {
				committed[int(id)] = true
			}
			var ok, failed, unknown, unknownCommitted, lies int
			for r := range results {
				switch {
				case r.err == nil:
					ok++
					if !committed[r.id] {
						lies++
						t.Errorf("transaction %d: Commit returned nil, and the row is not there", r.id)
					}
				case errors.Is(r.err, pgxlanes.ErrCommitOutcomeUnknown):
					unknown++
					assert.NotErrorIs(t, r.err, pgxlanes.ErrBudgetExceeded, "an unknown outcome is not a budget failure to retry")
					assert.False(t, pgconn.SafeToRetry(r.err))
					if committed[r.id] {
						unknownCommitted++
					}
				default:
					failed++
					if committed[r.id] {
						lies++
						t.Errorf("transaction %d: Commit failed (%v), and the row is there: a retry would apply it twice", r.id, r.err)
					}
					assert.ErrorIs(t, r.err, pgxlanes.ErrBudgetExceeded, "transaction %d", r.id)
				}
			}
			t.Logf("%s, %d races: %d committed and said so, %d failed and did not commit, %d unknown (%d of them committed), %d lies",
				action, runs, ok, failed, unknown, unknownCommitted, lies)
			assert.Equal(t, runs, ok+failed+unknown)
			assert.Zero(t, lies)
			if action == "cancel" {
				assert.Zero(t, unknown, "the guard never interrupts a COMMIT: its outcome is always known")
			}
			assert.Greater(t, ok, 0, "some commits won the race")
			assert.Greater(t, failed, 0, "some lost it: the race was run")
			lanesIdle(t, p, "after the races")
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestCommitOfAbortedTransaction: a statement failed inside the transaction, so the server
// answers its COMMIT with ROLLBACK. pgx reports that as pgx.ErrTxCommitRollback, and pgxpool
// returns it as it is: the outcome is known, nothing committed. pgxlanes must return the same
// error, not one of unknown outcome, through Begin and through a held connection's Begin.
func TestCommitOfAbortedTransaction(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	lanes := newLanes(t, dsn, "")
	held, err := lanes.Acquire(bg)
	require.NoError(t, err)
	defer held.Release()
	for _, c := range []struct {
		name string
		db   interface {
			Begin(context.Context) (pgx.Tx, error)
		}
	}{
		{"pgxpool", newPgxpool(t, dsn, "")},
		{"pgxlanes", lanes},
		{"pgxlanes held", held},
	} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := c.db.Begin(bg)
			require.NoError(t, err)
			_, err = tx.Exec(bg, "select 1/0")
			require.Error(t, err)
			err = tx.Commit(bg)
			assert.Equal(t, pgx.ErrTxCommitRollback, err, "pgxpool returns pgx.ErrTxCommitRollback as it is")
			assert.NotErrorIs(t, err, pgxlanes.ErrCommitOutcomeUnknown)
		})
	}
	var n int
	require.NoError(t, held.QueryRow(bg, "select 1").Scan(&n), "the held connection is usable after the rolled-back transaction")
}
