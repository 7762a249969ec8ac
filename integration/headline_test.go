package integration

import (
	"context"
	"math/rand/v2"
	"sync"
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
	ctx, cancel := context.WithTimeout(context.Background(), duration+hold+10*time.Second)
	defer cancel()
	stop := time.Now().Add(duration)
	var wg sync.WaitGroup
	for i := range txHolders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				err := pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
					var v int
					if err := tx.QueryRow(ctx, "select v from items where id = $1 for update", i+1).Scan(&v); err != nil {
						return err
					}
					time.Sleep(hold) // application work while the row stays locked
					return nil
				})
				if err != nil {
					time.Sleep(10 * time.Millisecond) // a lane's acquire timeout: try again
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // let the transactions fill the pool
	lat := &latencies{}
	var failed int
	var mu sync.Mutex
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			for time.Now().Before(stop) {
				start := time.Now()
				var v int
				err := p.QueryRow(ctx, "select v from items where id = $1", 100+rng.IntN(900)).Scan(&v)
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
					continue
				}
				lat.add(time.Since(start))
				time.Sleep(5 * time.Millisecond) // a steady stream, not a CPU hog
			}
		}()
	}
	wg.Wait()
	if failed > 0 {
		t.Logf("%d lookups failed", failed)
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
