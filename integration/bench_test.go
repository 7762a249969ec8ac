package integration

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// benchConns is the pool size of every implementation in the benchmarks.
const benchConns = 8

// benchPool is the tiny interface through which the benchmarks compare pgxlanes with pgxpool.
type benchPool interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	// acquireRelease takes a connection and gives it back, with no query.
	acquireRelease(ctx context.Context) error
	totalConns() int32
	Close()
}

type pgxpoolBench struct{ *pgxpool.Pool }

func (p pgxpoolBench) acquireRelease(ctx context.Context) error {
	c, err := p.Acquire(ctx)
	if err != nil {
		return err
	}
	c.Release()
	return nil
}

func (p pgxpoolBench) totalConns() int32 { return p.Stat().TotalConns() }

// lanesBench acquires on the lane its context names (annotated once, outside the timed loop).
type lanesBench struct {
	*pgxlanes.Pool
	ctx context.Context
}

func (p lanesBench) acquireRelease(context.Context) error {
	c, err := p.Acquire(p.ctx)
	if err != nil {
		return err
	}
	c.Release()
	return nil
}

func (p lanesBench) totalConns() int32 { return p.Stat().TotalConns() }

type benchImpl struct {
	name string
	open func(tb testing.TB, dsn string) benchPool
}

func openPgxpool(tb testing.TB, dsn string) benchPool {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = benchConns, benchConns
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return pgxpoolBench{p}
}

// openPgxpoolTimeouts is plain pgxpool with the session timeouts pgxlanes gives the Short lane
// (statement_timeout 5s, lock_timeout 1s in the startup packet). The server arms a timer for every
// statement when statement_timeout is set, so this isolates what the lanes themselves cost from
// what server-side timeouts cost.
func openPgxpoolTimeouts(tb testing.TB, dsn string) benchPool {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns, cfg.MinConns = benchConns, benchConns
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "5000"
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "1000"
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return pgxpoolBench{p}
}

func openLanes(lane pgxlanes.Lane) func(tb testing.TB, dsn string) benchPool {
	return func(tb testing.TB, dsn string) benchPool {
		cfg, err := pgxlanes.ParseConfig(dsn)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.MaxConns, cfg.MinConns = benchConns, benchConns
		p, err := pgxlanes.NewWithConfig(context.Background(), cfg)
		if err != nil {
			tb.Fatal(err)
		}
		return lanesBench{Pool: p, ctx: pgxlanes.WithLane(context.Background(), lane)}
	}
}

var benchImpls = []benchImpl{
	{"pgxpool", openPgxpool},
	{"pgxpool-timeouts", openPgxpoolTimeouts},
	{"pgxlanes", openLanes(pgxlanes.Short)},
}

// openWarm opens a pool, waits for all its connections and runs f a few times on each, so that
// neither connecting nor preparing statements is measured.
func openWarm(b *testing.B, impl benchImpl, dsn string, f func(benchPool) error) benchPool {
	b.Helper()
	p := impl.open(b, dsn)
	b.Cleanup(p.Close)
	deadline := time.Now().Add(30 * time.Second)
	for p.totalConns() < benchConns {
		if time.Now().After(deadline) {
			b.Fatalf("%s: only %d of %d connections open after 30s", impl.name, p.totalConns(), benchConns)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make(chan error, benchConns)
	for range benchConns {
		wg.Go(func() {
			for range 20 {
				if err := f(p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("%s: warm-up: %v", impl.name, err)
	}
	return p
}

// runClients runs f b.N times in all, from clients goroutines.
func runClients(b *testing.B, clients int, f func() error) {
	b.Helper()
	var next atomic.Int64
	n := int64(b.N)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	b.ReportAllocs()
	b.ResetTimer()
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= n {
				if err := f(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// selectOne is SELECT 1 through QueryRow().Scan, the call of the Select1 and throughput benchmarks.
func selectOne(p benchPool) error {
	var n int
	return p.QueryRow(context.Background(), "select 1").Scan(&n)
}

// BenchmarkSelect1 is a round trip of SELECT 1 through QueryRow().Scan: the whole cost of a
// short query, acquire and release included, with 1, 8 and 64 clients on 8 connections.
func BenchmarkSelect1(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	for _, clients := range []int{1, 8, 64} {
		for _, impl := range benchImpls {
			b.Run(fmt.Sprintf("Clients=%d/Impl=%s", clients, impl.name), func(b *testing.B) {
				p := openWarm(b, impl, dsn, selectOne)
				runClients(b, clients, func() error { return selectOne(p) })
			})
		}
	}
}

// BenchmarkAcquireRelease is Acquire then Release of a connection with no query, from one
// goroutine: the per-acquire overhead. Impl=pgxlanes acquires on the Short lane, whose timeouts are
// the session's, so no round trip is needed; Impl=pgxlanes-txlane is what a plain Acquire does, on
// the Tx lane, which sets the lane's timeouts on the session and resets them on release (two round
// trips).
func BenchmarkAcquireRelease(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	ctx := context.Background()
	acq := func(p benchPool) error { return p.acquireRelease(ctx) }
	for _, impl := range append(benchImpls, benchImpl{"pgxlanes-txlane", openLanes(pgxlanes.Tx)}) {
		b.Run("Impl="+impl.name, func(b *testing.B) {
			p := openWarm(b, impl, dsn, acq)
			runClients(b, 1, func() error { return acq(p) })
		})
	}
}

// BenchmarkTx is a transaction of one single-row UPDATE from one client, begun with Begin (BEGIN,
// UPDATE and COMMIT: three round trips) or in a batch with pgx.Batch.BeginTx (BEGIN and UPDATE in
// one round trip, then COMMIT). pgxlanes runs both on the Tx lane, with the lane's timeouts and
// backstops set in the BEGIN's round trip: with Begin inside the BEGIN query, in a batch as one
// more query of the batch.
func BenchmarkTx(b *testing.B) {
	dsn := newDB(b, benchConns)
	ctx := context.Background()
	var id atomic.Int64
	update := "update items set v = v + 1 where id = $1"
	kinds := []struct {
		name string
		run  func(p benchPool) error
	}{
		{"begin", func(p benchPool) error {
			return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, update, id.Add(1)%benchConns+1)
				return err
			})
		}},
		{"batch", func(p benchPool) error {
			bt := &pgx.Batch{}
			bt.BeginTx(pgx.TxOptions{})
			bt.Queue(update, id.Add(1)%benchConns+1)
			br := p.SendBatch(ctx, bt)
			tx := br.Tx()
			if err := br.Close(); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		}},
	}
	for _, kind := range kinds {
		for _, impl := range benchImpls {
			b.Run("Kind="+kind.name+"/Impl="+impl.name, func(b *testing.B) {
				p := openWarm(b, impl, dsn, kind.run)
				runClients(b, 1, func() error { return kind.run(p) })
			})
		}
	}
}

// BenchmarkTxPaired is BenchmarkTx/Kind=begin with three pools interleaved, one transaction each
// in turn, so that the machine's drift hits them alike: on a shared 2-core VM the spread between
// separate runs (±20-30 %) hides a difference of a few percent. The pools are pgxpool, pgxpool
// whose BEGIN carries the same SET LOCALs as pgxlanes' Tx lane (what the server's share costs),
// and pgxlanes. It reports each one's median and the ratios of the medians; ns/op is the mean of
// the three.
func BenchmarkTxPaired(b *testing.B) {
	dsn := newDB(b, benchConns)
	ctx := context.Background()
	lanes := openLanes(pgxlanes.Tx)(b, dsn)
	setLocal := "begin; set local statement_timeout = 30000; set local lock_timeout = 10000; set local idle_in_transaction_session_timeout = 63000"
	pp := openPgxpool(b, dsn).(pgxpoolBench)
	ps := openPgxpool(b, dsn).(pgxpoolBench)
	for _, p := range []benchPool{pp, ps, lanes} {
		b.Cleanup(p.Close)
	}
	begins := []func() (pgx.Tx, error){
		func() (pgx.Tx, error) { return pp.Begin(ctx) },
		func() (pgx.Tx, error) { return ps.BeginTx(ctx, pgx.TxOptions{BeginQuery: setLocal}) },
		func() (pgx.Tx, error) { return lanes.Begin(ctx) },
	}
	update := "update items set v = v + 1 where id = $1"
	run := func(k, i int) error {
		tx, err := begins[k]()
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, update, i%benchConns+1); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	for i := range 300 { // warm all three: connections open, statements prepared
		if err := run(i%3, i); err != nil {
			b.Fatal(err)
		}
	}
	var took [3][]time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := i % 3
		start := time.Now()
		if err := run(k, i); err != nil {
			b.Fatal(err)
		}
		took[k] = append(took[k], time.Since(start))
	}
	b.StopTimer()
	if len(took[2]) == 0 {
		return
	}
	var p50 [3]float64
	for k := range took {
		slices.Sort(took[k])
		p50[k] = float64(took[k][len(took[k])/2])
	}
	b.ReportMetric(p50[0]/1e3, "pgxpool-p50-µs")
	b.ReportMetric(p50[2]/1e3, "lanes-p50-µs")
	b.ReportMetric(p50[1]/p50[0], "setlocal/pgxpool-p50")
	b.ReportMetric(p50[2]/p50[0], "lanes/pgxpool-p50")
	b.ReportMetric(p50[2]/p50[1], "lanes/setlocal-p50")
}
