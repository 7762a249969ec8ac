package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

const tableName = "pgxlanes_starvation_demo"

// The statements of the workload. Long transactions lock rows 1..long-workers, one each; lookups
// read the other rows, so they never wait on a row lock, only on a connection.
const (
	lookupSQL     = "select val from " + tableName + " where id = $1"
	lookupWorkSQL = "select t.val from " + tableName + " t, pg_sleep($2::float8) where t.id = $1"
	lockSQL       = "select val from " + tableName + " where id = $1 for update"
)

func createTable(ctx context.Context, conn *pgx.Conn, rows int) error {
	_, err := conn.Exec(ctx, "drop table if exists "+tableName+"; create table "+tableName+
		" (id int primary key, val text not null)")
	if err == nil {
		_, err = conn.Exec(ctx, "insert into "+tableName+" select i, md5(i::text) from generate_series(1, $1::int) i", rows)
	}
	if err == nil {
		// Vacuumed now, so that autovacuum does not visit the new table in the middle of a run.
		_, err = conn.Exec(ctx, "vacuum analyze "+tableName)
	}
	if err != nil {
		return fmt.Errorf("creating the demo table: %w", err)
	}
	return nil
}

// demo runs the contenders one after another.
type demo struct {
	cfg   *config
	dsn   string
	admin *pgx.Conn
	logf  func(string, ...any)
}

// phaseSpec is one phase of the short traffic.
type phaseSpec struct {
	ph    phase
	dur   time.Duration
	rate  float64
	work  time.Duration
	start func() // called when the phase begins
}

func (d *demo) runContender(ctx context.Context, spec contenderSpec) (*contenderResult, error) {
	cfg := d.cfg
	rec := newRecorder()
	sess0, sessOK := sessionsCount(ctx, d.admin)
	ps, err := spec.build(ctx, d.dsn, cfg, rec)
	if err != nil {
		return nil, err
	}
	closed := false
	closePools := func() {
		if !closed {
			closed = true
			ps.close()
		}
	}
	defer closePools()
	if err := waitConns(ctx, ps, int32(cfg.conns)); err != nil {
		return nil, err
	}
	if err := warm(ctx, ps, cfg.longWorkers+1); err != nil {
		return nil, err
	}

	var g *gate
	var planned time.Duration // from the start to the end of the last phase
	if spec.load {
		g = newGate(cfg.longWorkers)
		planned = cfg.ramp
	}
	var longs sync.WaitGroup
	var st *storm
	var runCtx context.Context // set before the phases start
	var cancelRun, stopLongs context.CancelFunc
	var phases []phaseSpec
	if spec.tx {
		phases = append(phases, phaseSpec{ph: phaseSteady, dur: cfg.steady, rate: cfg.rate})
		if spec.load {
			phases = append(phases, phaseSpec{ph: phaseTransition, dur: cfg.transition, rate: cfg.rate,
				start: func() { g.set(cfg.burstLongWorkers) }})
		}
		phases = append(phases, phaseSpec{ph: phaseBurst, dur: cfg.burst, rate: cfg.burstRate, work: cfg.burstWork})
	}
	if spec.slow {
		phases = append(phases, phaseSpec{ph: phaseLearn, dur: cfg.learn, rate: cfg.rate, start: func() {
			// The long transactions are gone: the waiting ones withdraw, the ones holding their row
			// are cut short and roll back (a few milliseconds), so the slow phase starts at once
			// instead of after a drain of up to a hold.
			if g != nil {
				g.close()
				stopLongs()
				longs.Wait()
			}
			st = d.startStorm(runCtx, ps.short, rec)
		}})
	}
	if spec.slow || spec.tx {
		// The idle baseline's slow phase is the lookups alone: nothing to learn, so no learning period.
		phases = append(phases, phaseSpec{ph: phaseSlow, dur: cfg.slow, rate: cfg.rate})
	}
	for _, p := range phases {
		planned += p.dur
	}

	d.logf("== %s: %s", spec.name, spec.about)
	start := time.Now()
	rec.start = start
	// Every wait of the run is bounded by its deadline: by the end of the last phase plus a
	// lookup's timeout plus the longest hold or slow statement, every lookup has met its own
	// deadline, every transaction begun before the end has committed and every slow statement
	// running at the end has completed. A contender that has not wound down by then (a bug, or
	// another session locking the demo's rows) ends with an error instead of hanging.
	windDown := cfg.timeout + max(maxHold(cfg), cfg.slowSleep)
	runCtx, cancelRun = context.WithDeadline(ctx, start.Add(planned+windDown))
	progressDone := d.progress(runCtx, spec.name, rec, nil)
	probeDone := probe(runCtx, d.admin, rec)
	var cut atomic.Int32 // long workers stopped by the run's end, not by the gate
	// stop ends the run; no goroutine of the run outlives it, whatever the way out.
	stop := sync.OnceFunc(func() {
		cancelRun()
		longs.Wait()
		if st != nil {
			st.stop()
			st.wait()
		}
		<-progressDone
		<-probeDone
	})
	defer stop()

	if spec.load {
		g.set(cfg.longWorkers)
		var holdCtx context.Context
		holdCtx, stopLongs = context.WithCancel(runCtx)
		defer stopLongs()
		for i := range cfg.longWorkers {
			longs.Add(1)
			go func() {
				defer longs.Done()
				delay := time.Duration(int64(cfg.ramp) * int64(i) / int64(cfg.longWorkers))
				d.longWorker(runCtx, holdCtx, ps.long, g, i, delay, rec)
				if runCtx.Err() != nil {
					cut.Add(1)
				}
			}()
		}
		if !sleepCtx(ctx, cfg.ramp) {
			return nil, ctx.Err()
		}
	}

	shorts := d.shortTraffic(runCtx, ps.short, phases, rec)
	if g != nil {
		g.close() // running transactions finish; waiting ones withdraw
	}
	if st != nil {
		st.stop() // running slow statements finish; waiting ones withdraw
	}
	shorts.Wait()
	longs.Wait()
	if st != nil {
		st.wait()
	}
	elapsed := time.Since(start)
	runErr := runCtx.Err()
	stop()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if runErr != nil {
		return nil, fmt.Errorf("the run did not wind down within %v of its last phase (long workers cut off: %d): %w",
			windDown, cut.Load(), runErr)
	}

	newConns := ps.newConns()
	var learning *learningResult
	if ps.learning != nil {
		learning = ps.learning()
	}
	closePools()
	res := rec.result(spec.name, spec.about, spec.load, elapsed)
	res.Sessions.NewConns = newConns
	res.Learning = learning
	if sessOK {
		if n, ok := sessionsAfter(ctx, d.admin, sess0); ok {
			res.Sessions.Server = &n
		}
	}
	d.logf("   %s done in %.1fs", spec.name, elapsed.Seconds())
	return res, nil
}

// maxHold is the longest a long transaction holds its row: long-hold × (1 + long-jitter).
func maxHold(cfg *config) time.Duration {
	return time.Duration(float64(cfg.longHold) * (1 + cfg.longJitter))
}

// waitConns waits until the pools have opened want connections (MinConns), so that no contender
// pays for opening connections while it is measured.
func waitConns(ctx context.Context, ps *pools, want int32) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for ps.openConns() < want {
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return fmt.Errorf("opening %d connections: only %d after 30s", want, ps.openConns())
		}
	}
	return nil
}

// shortTraffic issues lookups open-loop: lookup k of a phase is scheduled at phase start + k/rate,
// runs in its own goroutine, and its latency counts from the scheduled time, so a lookup that
// waits for a connection is slow, not late. It returns once every lookup is issued; the WaitGroup
// tells when they have all finished. Keys come from a generator seeded alike for every contender.
func (d *demo) shortTraffic(ctx context.Context, q querier, phases []phaseSpec, rec *recorder) *sync.WaitGroup {
	cfg := d.cfg
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(cfg.seed, 0x5eed))
	hot := cfg.longWorkers // rows 1..hot are locked by long transactions
	phaseStart := time.Now()
	for _, ps := range phases {
		if ps.start != nil {
			ps.start()
		}
		rec.setPhase(ps.ph, phaseStart, ps.dur, ps.rate, ps.work)
		base := phaseContext(ctx, ps.ph)
		interval := time.Duration(float64(time.Second) / ps.rate)
		n := int(ps.dur / interval)
		for k := range n {
			at := phaseStart.Add(time.Duration(k) * interval)
			if !sleepUntil(ctx, at) {
				return &wg
			}
			id := hot + 1 + rng.IntN(cfg.rows-hot)
			rec.issued()
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithDeadline(base, at.Add(cfg.timeout))
				var val string
				var err error
				if ps.work > 0 {
					err = q.QueryRow(cctx, lookupWorkSQL, id, ps.work.Seconds()).Scan(&val)
				} else {
					err = q.QueryRow(cctx, lookupSQL, id).Scan(&val)
				}
				cancel()
				rec.short(ps.ph, at, time.Since(at), classify(err), err)
			}()
		}
		phaseStart = phaseStart.Add(ps.dur)
	}
	sleepUntil(ctx, phaseStart)
	return &wg
}

// longWorker runs long transactions back to back while the gate lets it: lock its own row, hold
// it for the application work, commit. Hold times come from a generator seeded by the worker's
// index, so every contender gets the same sequence. When hold ends (derived from ctx), a
// transaction holding its row is cut short and rolled back, not counted as failed; its
// statements run under ctx, so one waiting on the server is not cut short.
func (d *demo) longWorker(ctx, hold context.Context, q querier, g *gate, idx int, delay time.Duration, rec *recorder) {
	cfg := d.cfg
	if !sleepCtx(ctx, delay) {
		return
	}
	rng := rand.New(rand.NewPCG(cfg.seed, uint64(idx)))
	row := idx + 1
	tagged := phaseContext(ctx, phaseLong)
	for iter := 0; ; iter++ {
		actx, cancel, ok := g.enter(tagged, idx)
		if !ok {
			return
		}
		holdFor := time.Duration(float64(cfg.longHold) * (1 + cfg.longJitter*(2*rng.Float64()-1)))
		if iter == 0 {
			// The first transaction is as if caught midway: a uniform part of a hold. So the workers
			// do not commit in lockstep, and the pool is in its steady state from the start.
			holdFor = time.Duration(float64(holdFor) * rng.Float64())
		}
		tx, err := q.Begin(actx)
		withdrawn := actx.Err() != nil
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !withdrawn { // a withdrawn waiter is the gate's doing, not a failure
				rec.longFailed(classify(err), err)
				sleepCtx(ctx, 10*time.Millisecond)
			}
			continue
		}
		// The transaction runs to completion whatever the gate says; only the run's end stops it.
		var val string
		err = tx.QueryRow(ctx, lockSQL, row).Scan(&val)
		locked := time.Now()
		if err == nil && sleepCtx(hold, holdFor) {
			err = tx.Commit(ctx)
		} else if err == nil {
			err = hold.Err()
		}
		if err != nil {
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = tx.Rollback(rctx)
			rcancel()
			if hold.Err() != nil {
				return
			}
			rec.longFailed(classify(err), err)
			continue
		}
		var held time.Duration
		if iter > 0 {
			held = time.Since(locked)
		}
		rec.longCommitted(time.Now(), held)
	}
}

// progress prints a line per second on stderr until ctx ends; the channel closes when it stops.
// line renders the line from the recorder's figures and the p99 of the last second ("-" if none);
// nil is the main phases' line.
func (d *demo) progress(ctx context.Context, name string, rec *recorder, line func(p progressLine, recent string) string) <-chan struct{} {
	if line == nil {
		line = func(p progressLine, recent string) string {
			return fmt.Sprintf("%-10s lookups: %5d sent %5d done %4d failed %5d waiting, p99 of last 1s %s | long tx: %d committed | slow: %d done",
				p.phase, p.sent, p.done, p.failed, p.sent-p.done-p.failed, recent, p.long, p.slow)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p := rec.progress()
				recent := "-"
				if p.recent > 0 {
					recent = fmtDur(p.recentP99)
				}
				d.logf("   %-16s %4.0fs %s", name, time.Since(rec.start).Seconds(), line(p, recent))
			}
		}
	}()
	return done
}

// sessionsCount reads pg_stat_database.sessions (PostgreSQL 14+) of the demo's database.
func sessionsCount(ctx context.Context, admin *pgx.Conn) (int64, bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	err := admin.QueryRow(ctx, "select sessions from pg_stat_database where datname = current_database()").Scan(&n)
	return n, err == nil
}

// sessionsAfter waits for the closed pools' server sessions to end (they report their statistics
// as they exit) and returns the sessions established since before.
func sessionsAfter(ctx context.Context, admin *pgx.Conn, before int64) (int64, bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	deadline := time.Now().Add(3 * time.Second)
	for {
		var backends int64
		err := admin.QueryRow(ctx, "select count(*) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()").Scan(&backends)
		if err != nil {
			return 0, false
		}
		if backends == 0 || time.Now().After(deadline) {
			break
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	n, ok := sessionsCount(ctx, admin)
	return n - before, ok
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func sleepUntil(ctx context.Context, t time.Time) bool { return sleepCtx(ctx, time.Until(t)) }
