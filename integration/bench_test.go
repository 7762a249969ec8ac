package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/integration/harness"
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

// BenchmarkSelect1 is a round trip of SELECT 1 through QueryRow().Scan: the whole cost of a
// short query, acquire and release included, with 1, 8 and 64 clients on 8 connections.
func BenchmarkSelect1(b *testing.B) {
	dsn := harness.NewDatabase(b)
	ctx := context.Background()
	selectOne := func(p benchPool) error {
		var n int
		return p.QueryRow(ctx, "select 1").Scan(&n)
	}
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
	dsn := harness.NewDatabase(b)
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
