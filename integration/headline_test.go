package integration

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// db is what the headline workload needs of a pool; *pgxpool.Pool and *pgxlanes.Pool both have it.
type db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// headline runs the workload of the headline test on p: txHolders transactions that lock a row
// each and sit for hold, over and over, and 8 clients doing primary-key lookups on other rows.
// It returns the lookups' latencies.
func headline(t *testing.T, p db, txHolders int, hold, duration time.Duration) *latencies {
	t.Helper()
	return headlineLoad(t, txHolders, hold, duration,
		func(ctx context.Context, id int) error {
			return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
				if err := tx.QueryRow(ctx, "select v from items where id = $1 for update", id).Scan(new(int)); err != nil {
					return err
				}
				time.Sleep(hold) // application work while the row stays locked
				return nil
			})
		},
		func(ctx context.Context, id int) error {
			return p.QueryRow(ctx, "select v from items where id = $1", id).Scan(new(int))
		})
}

// headlineLoad is the headline's workload over any client: txHolders goroutines call lockRow (a
// transaction that locks row i+1 and holds it) over and over, and 8 goroutines call lookup on rows
// 100 to 999, measured.
func headlineLoad(t *testing.T, txHolders int, hold, duration time.Duration,
	lockRow, lookup func(ctx context.Context, id int) error) *latencies {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), duration+hold+10*time.Second)
	defer cancel()
	stop := time.Now().Add(duration)
	var wg sync.WaitGroup
	for i := range txHolders {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if err := lockRow(ctx, i+1); err != nil {
					time.Sleep(10 * time.Millisecond) // a lane's acquire timeout: try again
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // let the transactions fill the pool
	lat := &latencies{}
	var failed atomic.Int64
	for c := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for time.Now().Before(stop) {
				start := time.Now()
				if err := lookup(ctx, 100+rng.IntN(900)); err != nil {
					failed.Add(1)
					continue
				}
				lat.add(time.Since(start))
				time.Sleep(5 * time.Millisecond) // a steady stream, not a CPU hog
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Logf("%d lookups failed", n)
	}
	return lat
}

// TestHeadlineShortQueriesNotBlockedByTransactions: a pool of 8 whose transaction capacity is
// held by transactions that lock rows and sit for seconds. With pgxlanes the short lookups keep a
// p99 under 50 ms and no acquire wait above 100 ms; with plain pgxpool on the same workload they
// wait for seconds. The difference is the point, so both are asserted.
func TestHeadlineShortQueriesNotBlockedByTransactions(t *testing.T) {
	dsn := newDB(t, 1000)
	const txHolders = 10
	hold, duration := 1500*time.Millisecond, 3*time.Second

	lanes := newLanes(t, dsn, "pool_max_conns=8")
	obs := &waitObserver{}
	lanes.AddObserver(obs)
	lanesLat := headline(t, lanes, txHolders, hold, duration)

	plain := newPgxpool(t, dsn, "pool_max_conns=8")
	plainLat := headline(t, plain, txHolders, hold, duration)

	lp99, ln := lanesLat.quantile(0.99)
	pp99, pn := plainLat.quantile(0.99)
	maxWait := obs.waits[pgxlanes.Short].max()
	txWaits, _ := obs.waits[pgxlanes.Tx].quantile(0.5)
	t.Logf("pgxlanes: %d lookups, p99 %s, max %s, max short acquire wait %s (tx median wait %s)",
		ln, fmtDur(lp99), fmtDur(lanesLat.max()), fmtDur(maxWait), fmtDur(txWaits))
	t.Logf("pgxpool:  %d lookups, p99 %s, max %s; ratio p99 pgxpool/pgxlanes = %.0f×", pn, fmtDur(pp99), fmtDur(plainLat.max()),
		float64(pp99)/float64(max(lp99, time.Microsecond)))
	figure(t, "headline.pgxlanes_p99_ms", ms(lp99))
	figure(t, "headline.pgxpool_p99_ms", ms(pp99))
	figure(t, "headline.ratio", float64(pp99)/float64(max(lp99, time.Microsecond)))

	if ln < 100 {
		t.Fatalf("pgxlanes completed only %d lookups", ln)
	}
	if lp99 > 50*time.Millisecond {
		t.Errorf("pgxlanes short p99 %s, want < 50ms", lp99)
	}
	if maxWait > 100*time.Millisecond {
		t.Errorf("pgxlanes max short acquire wait %s, want < 100ms", maxWait)
	}
	if pp99 < 500*time.Millisecond {
		t.Errorf("plain pgxpool short p99 %s: the workload did not reproduce head-of-line blocking", pp99)
	}
	if pp99 < 10*lp99 {
		t.Errorf("pgxpool p99 %s is not ≥ 10× pgxlanes p99 %s", pp99, lp99)
	}
}
