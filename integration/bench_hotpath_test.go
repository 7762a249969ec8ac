package integration

import (
	"context"
	"fmt"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// The hot path's benchmarks (issue 22): what the pool itself costs a caller, pgxlanes beside
// pgxpool in the same run, each through benchPool. Compare with
//
//	go test -run '^$' -bench 'HotPath' -count 6 . | tee hot.txt
//	benchstat -col /Impl hot.txt

// hotImpls are the contenders: plain pgxpool, and pgxlanes on the lane named.
func hotImpls(lanes ...pgxlanes.Lane) []benchImpl {
	impls := []benchImpl{{"pgxpool", openPgxpool}}
	for _, l := range lanes {
		name := "pgxlanes"
		if len(lanes) > 1 {
			name += "-" + l.String()
		}
		impls = append(impls, benchImpl{name, openLanes(l)})
	}
	return impls
}

// BenchmarkHotPathAcquireRelease is Acquire and Release with no query, from 1, 8 and 64
// goroutines on 8 connections: the pool's own cost, and its allocations.
func BenchmarkHotPathAcquireRelease(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	ctx := context.Background()
	acq := func(p benchPool) error { return p.acquireRelease(ctx) }
	for _, clients := range []int{1, 8, 64} {
		for _, impl := range hotImpls(pgxlanes.Short, pgxlanes.Tx) {
			b.Run(fmt.Sprintf("Clients=%d/Impl=%s", clients, impl.name), func(b *testing.B) {
				p := openWarm(b, impl, dsn, acq)
				runClients(b, clients, func() error { return acq(p) })
			})
		}
	}
}

// BenchmarkHotPathAcquireReleasePaired measures what the goal is stated in: pgxlanes' acquire
// and release over pgxpool's, in nanoseconds. The pools (pgxpool, pgxlanes on Short, on Tx) run
// rounds of 16,384 acquire+release each, one after the other, taking turns to go first, so that
// the VM's drift (a third of pgxpool's own cost over a day) falls on all alike. It reports each
// pool's median wall time per call over its rounds, and for each lane the median over the rounds
// of its round's time minus pgxpool's in the same turn (<lane>-over-ns/op), with the lowest and
// highest. ns/op is wall time over b.N, rounded up to whole turns: read the other metrics.
func BenchmarkHotPathAcquireReleasePaired(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	ctx := context.Background()
	acq := func(p benchPool) error { return p.acquireRelease(ctx) }
	for _, clients := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("Clients=%d", clients), func(b *testing.B) {
			impls := hotImpls(pgxlanes.Short, pgxlanes.Tx)
			const round = 16384
			start := time.Now()
			wall := func() time.Duration { return time.Since(start) }
			per := pairedRounds(b, impls, dsn, clients, round, acq, wall)
			over := make([][]float64, len(per))
			for k := 1; k < len(per); k++ {
				for i := range per[0] {
					over[k] = append(over[k], per[k][i]-per[0][i])
				}
			}
			b.ReportMetric(medianF(per[0]), "pgxpool-ns/op")
			for k := 1; k < len(per); k++ {
				name := strings.TrimPrefix(impls[k].name, "pgxlanes-")
				b.ReportMetric(medianF(per[k]), name+"-ns/op")
				b.ReportMetric(medianF(over[k]), name+"-over-ns/op")
				b.ReportMetric(slices.Min(over[k]), name+"-over-min-ns/op")
				b.ReportMetric(slices.Max(over[k]), name+"-over-max-ns/op")
			}
		})
	}
}

// pairedRounds opens a pool of each of impls on dsn (warmed with run, in impls' order, before the
// timer starts) and runs rounds of round calls of run on each, by clients goroutines, the
// pools one after the other in turns until b.N calls are made, and returns each pool's clock time
// per call in each round (per[pool][round]). The turns go through every order of the pools in
// sequence, so that each pool comes first, last and right after each other pool equally often:
// paired with itself in a fixed order, pgxpool's second run measured 0.93-1.00 of its first
// (client CPU, 3 runs), and 0.98-1.03 taking turns; what one pool leaves behind after its round
// (pgxlanes' parking sweep, up to 100 ms later) falls on every other alike. The benchmark's timer
// stops when it returns.
//
// Each round runs with the profiler label pool=<impl name>, so that a CPU profile of the
// benchmark (-cpuprofile) tells the pools' CPU apart: go tool pprof -tagfocus='pool=^pgxlanes$',
// or -tags for each pool's total. What runs on no pool's goroutine (the scheduler, the
// collector's workers, timers) has no label.
func pairedRounds(b *testing.B, impls []benchImpl, dsn string, clients, round int, run func(benchPool) error, clock func() time.Duration) [][]float64 {
	pools := make([]benchPool, len(impls))
	labels := make([]pprof.LabelSet, len(impls))
	for k, impl := range impls {
		pools[k] = openWarm(b, impl, dsn, run)
		labels[k] = pprof.Labels("pool", impl.name)
	}
	per := make([][]float64, len(pools))
	orders := permutations(len(pools))
	b.ReportAllocs()
	b.ResetTimer()
	for done, r := 0, 0; done < b.N; done, r = done+len(pools)*round, r+1 {
		for _, k := range orders[r%len(orders)] {
			p := pools[k]
			var err error
			start := clock()
			pprof.Do(context.Background(), labels[k], func(context.Context) {
				err = runRound(clients, round, func() error { return run(p) })
			})
			if err != nil {
				b.Fatal(err)
			}
			per[k] = append(per[k], float64(clock()-start)/float64(round))
		}
	}
	b.StopTimer()
	return per
}

// permutations returns every order of 0..n-1 (n! of them: the benchmarks pair 2 or 3 pools).
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var all [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(slices.Clone(p[:i]), n-1), p[i:]...)
			all = append(all, q)
		}
	}
	return all
}

// cpuTime is the process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHotPathClientCPU reports the client's CPU time per statement (cpu-ns/op, from
// getrusage: this process only, the server excluded) for each kind of call, on 8 connections, by
// 8 clients (6 for a transaction: see hotKind.clients).
func BenchmarkHotPathClientCPU(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	kinds := hotKinds(context.Background())
	for _, kind := range kinds {
		clients := kind.clients(b, dsn)
		for _, impl := range hotImpls(pgxlanes.Short) {
			b.Run(fmt.Sprintf("Kind=%s/Impl=%s", kind.name, impl.name), func(b *testing.B) {
				p := openWarm(b, impl, dsn, kind.run)
				start := cpuTime()
				runClients(b, clients, func() error { return kind.run(p) })
				b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// hotKind is one kind of call whose client CPU the benchmarks measure, and pgxlanes' lane for it.
type hotKind struct {
	name string
	run  func(p benchPool) error
	lane pgxlanes.Lane
}

// clients is how many clients run a kind at once: 8, or fewer if pgxlanes' lane for the kind holds
// fewer of its 8 connections (the Tx lane holds 6 by default: the rest is Short's reserve). More
// clients than the lane's cap would queue in pgxlanes and not in pgxpool: that measures the
// reserve, not the cost of a statement. Both pools get the same number of clients.
func (k hotKind) clients(tb testing.TB, dsn string) int {
	cfg, err := pgxlanes.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = benchConns
	p, err := pgxlanes.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	return min(benchConns, p.Config().Lane(k.lane).MaxConns)
}

// hotKinds: QueryRow, Exec, a one-statement transaction, a batch of 10 and a held connection.
func hotKinds(ctx context.Context) []hotKind {
	return []hotKind{
		{"QueryRow", func(p benchPool) error {
			var n int
			return p.QueryRow(ctx, "select 1").Scan(&n)
		}, pgxlanes.Short},
		{"Exec", func(p benchPool) error {
			return execOnce(ctx, p, "select 1")
		}, pgxlanes.Short},
		{"Tx1", func(p benchPool) error {
			tx, err := p.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "select 1"); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
			return tx.Commit(ctx)
		}, pgxlanes.Tx},
		{"Batch10", func(p benchPool) error {
			var batch pgx.Batch
			for range 10 {
				batch.Queue("select 1")
			}
			return p.SendBatch(ctx, &batch).Close()
		}, pgxlanes.Short},
		{"Held", func(p benchPool) error { return heldExec(ctx, p, "select 1") }, pgxlanes.Short},
	}
}

// BenchmarkHotPathClientCPUPaired is BenchmarkHotPathClientCPU with the pools interleaved, so
// that the machine's drift hits them alike: rounds of 2,048 calls by 8 clients (6 for a
// transaction) of each pool, taking turns to go first, each round's CPU time from getrusage
// (whose granularity is the scheduler's tick: hence rounds of tens of milliseconds). The pools
// are pgxpool, pgxlanes and a second, identical pgxpool, the control: what a ratio of 1.00 looks
// like on this machine, and how far one strays. It reports the median CPU per call of each pool
// over its rounds, and the median over the rounds of pgxlanes' CPU over pgxpool's in the same
// turn (lanes/pgxpool-cpu) and of the control's (control/pgxpool-cpu), each with its lowest and
// highest. The median of a run's rounds is only as steady as there are rounds: docs/figures.sh
// runs this for 10 s (about 150 turns), not the default second (about 15). ns/op is wall time
// over b.N, which the rounds round up to whole turns: read the CPU metrics, not ns/op.
func BenchmarkHotPathClientCPUPaired(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	for _, kind := range hotKinds(context.Background()) {
		b.Run("Kind="+kind.name, func(b *testing.B) {
			clients := kind.clients(b, dsn)
			cpu := pairedRounds(b, controlled(hotImpls(pgxlanes.Short)), dsn, clients, 2048, kind.run, cpuTime)
			b.ReportMetric(medianF(cpu[0]), "pgxpool-cpu-ns/op")
			b.ReportMetric(medianF(cpu[1]), "lanes-cpu-ns/op")
			reportRatios(b, "lanes/pgxpool-cpu", cpu[1], cpu[0])
			reportRatios(b, "control/pgxpool-cpu", cpu[2], cpu[0])
		})
	}
}

// controlled returns impls (pgxpool first) with a second pgxpool after them: the control of a
// paired benchmark.
func controlled(impls []benchImpl) []benchImpl {
	return append(slices.Clip(impls), benchImpl{"control", impls[0].open})
}

// reportRatios reports, as unit, the median over the rounds of num[i]/den[i], and as unit-min and
// unit-max the lowest and highest (pairedRounds gives every pool the same rounds, at least one).
func reportRatios(b *testing.B, unit string, num, den []float64) {
	r := make([]float64, len(num))
	for i := range num {
		r[i] = num[i] / den[i]
	}
	b.ReportMetric(medianF(r), unit)
	b.ReportMetric(slices.Min(r), unit+"-min")
	b.ReportMetric(slices.Max(r), unit+"-max")
}

// runRound runs f n times in all from clients goroutines, and returns the first error.
func runRound(clients, n int, f func() error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := f(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// BenchmarkHotPathThroughput is SELECT 1 through QueryRow from 8 to 256 clients on pools of 8
// and 32: end-to-end throughput on loopback.
func BenchmarkHotPathThroughput(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	for _, size := range []int32{8, 32} {
		for _, clients := range []int{8, 64, 256} {
			for _, impl := range sizedImpls(size) {
				b.Run(fmt.Sprintf("Conns=%d/Clients=%d/Impl=%s", size, clients, impl.name), func(b *testing.B) {
					p := impl.open(b, dsn)
					b.Cleanup(p.Close)
					runClients(b, clients, func() error { return selectOne(p) })
				})
			}
		}
	}
}

// sizedImpls are the throughput benchmarks' contenders: pgxpool, and pgxlanes on Short, of n
// connections each.
func sizedImpls(n int32) []benchImpl {
	return []benchImpl{
		{"pgxpool", sized(n, openPgxpoolDSN)},
		{"pgxlanes", sized(n, openLanesDSN(pgxlanes.Short))},
	}
}

// BenchmarkHotPathThroughputPaired is BenchmarkHotPathThroughput with the pools interleaved,
// which the goal (pgxlanes' throughput within 0.97 of pgxpool's) needs: run one pool's runs after
// the other's, the VM's drift over a minute moved a point by 20 %. Rounds of 2,048 QueryRow
// calls of each pool (pgxpool, pgxlanes and a second pgxpool, the control, as in
// BenchmarkHotPathClientCPUPaired), taking turns to go first; it reports each pool's median wall
// time per call over its rounds, and the median over the rounds of pgxlanes' throughput over
// pgxpool's in the same turn (lanes/pgxpool-tput: pgxpool's time per call over pgxlanes') and
// the control's (control/pgxpool-tput), each with its lowest and highest. ns/op is wall time over
// b.N, rounded up to whole turns: read the other metrics.
func BenchmarkHotPathThroughputPaired(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	for _, size := range []int32{8, 32} {
		for _, clients := range []int{8, 64, 256} {
			b.Run(fmt.Sprintf("Conns=%d/Clients=%d", size, clients), func(b *testing.B) {
				start := time.Now()
				wall := func() time.Duration { return time.Since(start) }
				per := pairedRounds(b, controlled(sizedImpls(size)), dsn, clients, 2048, selectOne, wall)
				b.ReportMetric(medianF(per[0]), "pgxpool-ns/op")
				b.ReportMetric(medianF(per[1]), "lanes-ns/op")
				reportRatios(b, "lanes/pgxpool-tput", per[0], per[1])
				reportRatios(b, "control/pgxpool-tput", per[0], per[2])
			})
		}
	}
}

// BenchmarkHotPathWaiterHeap reports the heap each queued waiter costs (B/waiter): 10,000
// callers wait on a one-connection pool whose connection is held.
func BenchmarkHotPathWaiterHeap(b *testing.B) {
	dsn := pgserver.NewDatabase(b)
	const waiters = 10_000
	for _, impl := range []benchImpl{
		{"pgxpool", sized(1, openPgxpoolDSN)},
		{"pgxlanes", sized(1, openLanesWaiters(waiters))},
	} {
		b.Run("Impl="+impl.name, func(b *testing.B) {
			p := impl.open(b, dsn)
			b.Cleanup(p.Close)
			var perWaiter float64
			for b.Loop() {
				release, waiting, err := hold(context.Background(), p)
				if err != nil {
					b.Fatal(err)
				}
				before := heapInUse()
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				for range waiters {
					wg.Go(func() { _ = waitOn(ctx, p) })
				}
				for waiting() < waiters {
					runtime.Gosched()
				}
				perWaiter = float64(heapInUse()-before) / waiters
				cancel()
				wg.Wait()
				release()
			}
			b.ReportMetric(perWaiter, "B/waiter")
		})
	}
}

// waitOn acquires and releases a connection of p under ctx. pgxlanes' Acquire takes the Tx lane
// without an annotation: an annotated context per waiter would be counted as the pool's heap.
func waitOn(ctx context.Context, p benchPool) error {
	switch p := p.(type) {
	case lanesBench:
		c, err := p.Acquire(ctx)
		if err != nil {
			return err
		}
		c.Release()
		return nil
	}
	return p.acquireRelease(ctx)
}

// parkedIn counts the goroutines whose stack has fn in it.
func parkedIn(fn string) int {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), fn)
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// sized opens pgxpool or pgxlanes (on Short) with MaxConns = MinConns = n.
func sized(n int32, open func(testing.TB, string) benchPool) func(testing.TB, string) benchPool {
	return func(tb testing.TB, dsn string) benchPool {
		return open(tb, dsn+sep(dsn)+fmt.Sprintf("pool_max_conns=%d&pool_min_conns=%d", n, n))
	}
}

// openPgxpoolDSN is plain pgxpool sized by its DSN.
func openPgxpoolDSN(tb testing.TB, dsn string) benchPool {
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		tb.Fatal(err)
	}
	return pgxpoolBench{p}
}

// openLanesDSN is pgxlanes on lane l, sized and tuned by its DSN.
func openLanesDSN(l pgxlanes.Lane) func(testing.TB, string) benchPool {
	return func(tb testing.TB, dsn string) benchPool {
		p, err := pgxlanes.New(context.Background(), dsn)
		if err != nil {
			tb.Fatal(err)
		}
		return lanesBench{Pool: p, ctx: pgxlanes.WithLane(context.Background(), l)}
	}
}

func sep(dsn string) string {
	if strings.Contains(dsn, "?") {
		return "&"
	}
	return "?"
}

// openLanesWaiters is pgxlanes on Tx with room for n waiters and no acquire timeout.
func openLanesWaiters(n int) func(testing.TB, string) benchPool {
	return func(tb testing.TB, dsn string) benchPool {
		return openLanesDSN(pgxlanes.Tx)(tb, dsn+fmt.Sprintf("&lane_tx_max_waiters=%d&lane_tx_acquire_timeout=10m", n))
	}
}

// execOnce runs sql through the pool's Exec.
func execOnce(ctx context.Context, p benchPool, sql string) error {
	var err error
	switch p := p.(type) {
	case pgxpoolBench:
		_, err = p.Exec(ctx, sql)
	case lanesBench:
		_, err = p.Exec(ctx, sql)
	}
	return err
}

// heldExec acquires a connection, runs sql on it and releases it.
func heldExec(ctx context.Context, p benchPool, sql string) error {
	var err error
	switch p := p.(type) {
	case pgxpoolBench:
		var c *pgxpool.Conn
		if c, err = p.Acquire(ctx); err == nil {
			_, err = c.Exec(ctx, sql)
			c.Release()
		}
	case lanesBench:
		var c *pgxlanes.Conn
		if c, err = p.Acquire(p.ctx); err == nil {
			_, err = c.Exec(ctx, sql)
			c.Release()
		}
	}
	return err
}

// hold takes the pool's connection until release is called, and waiting reports the callers
// queued behind it.
func hold(ctx context.Context, p benchPool) (release func(), waiting func() int, err error) {
	switch p := p.(type) {
	case pgxpoolBench:
		c, err := p.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		// pgxpool has no waiters gauge: count the goroutines parked in its acquire.
		return c.Release, func() int { return parkedIn("pgxpool.(*Pool).Acquire") }, nil
	case lanesBench:
		c, err := p.Acquire(pgxlanes.WithBudget(p.ctx, pgxlanes.Off))
		if err != nil {
			return nil, nil, err
		}
		return c.Release, func() int { return parkedIn("pgxlanes.(*Pool).Acquire") }, nil
	}
	return nil, nil, fmt.Errorf("unknown pool %T", p)
}
