package integration

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/race"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

// prioObserver records every acquire's wait and outcome by priority, and the holds.
type prioObserver struct {
	mu      sync.Mutex
	waits   map[pgxlanes.Priority][]time.Duration // successful acquires
	errs    map[pgxlanes.Priority]int
	holds   latencies
	maxHold atomic.Int64
}

func newPrioObserver() *prioObserver {
	return &prioObserver{waits: map[pgxlanes.Priority][]time.Duration{}, errs: map[pgxlanes.Priority]int{}}
}

func (o *prioObserver) ObserveAcquire(e pgxlanes.AcquireEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if e.Err != nil {
		o.errs[e.Priority]++
		return
	}
	o.waits[e.Priority] = append(o.waits[e.Priority], e.Wait)
}

func (o *prioObserver) ObserveRelease(e pgxlanes.ReleaseEvent) {
	o.holds.add(e.Hold)
	for {
		cur := o.maxHold.Load()
		if int64(e.Hold) <= cur || o.maxHold.CompareAndSwap(cur, int64(e.Hold)) {
			return
		}
	}
}

// stats returns the successful waits of priority p, their maximum and the failures.
func (o *prioObserver) stats(p pgxlanes.Priority) (n int, worst time.Duration, failed int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	w := o.waits[p]
	if len(w) > 0 {
		worst = slices.Max(w)
	}
	return len(w), worst, o.errs[p]
}

// loop runs f in clients goroutines until stop, pausing pause between calls, and returns the
// latencies of the calls that succeeded and the number that failed.
func loop(ctx context.Context, clients int, stop time.Time, pause time.Duration, f func(ctx context.Context, rng *rand.Rand) error) (*latencies, *atomic.Int64, *sync.WaitGroup) {
	lat, failed := &latencies{}, &atomic.Int64{}
	wg := &sync.WaitGroup{}
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for time.Now().Before(stop) && ctx.Err() == nil {
				start := time.Now()
				if err := f(ctx, rng); err != nil {
					failed.Add(1)
				} else {
					lat.add(time.Since(start))
				}
				if pause > 0 {
					time.Sleep(pause)
				}
			}
		})
	}
	return lat, failed, wg
}

// medianRange returns the median of v and its range.
func medianRange(v []float64) (med, lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}

// TestPriorityHighLookupsUnderLowLoad: 64 low-priority clients keep Short (8 connections)
// saturated with 5 ms statements, while 2 high-priority clients run primary-key lookups. The
// lookups' p99 is compared with the same lookups on an idle pool, on pgxlanes without its
// headroom (lane_short_priority_headroom=0: priorities order the queue only), and on a plain
// pgxpool of 8, where the lookups queue FIFO behind the load. Each of 5 runs measures the four
// side by side; the ratios are logged as medians with their range.
//
// With the default headroom the background holds at most 7 of Short's 8 connections, so a
// high-priority lookup finds the eighth free unless the other high-priority client holds it:
// its wait is a fraction of a hold. Without the headroom it waits for the next release among
// Short's 8 holders, up to one hold time; on pgxpool behind about 56 queued statements, 7 hold
// times. A fifth measurement runs the same load with the lookups on a pgxpool of their own:
// what the load's CPU costs the lookups whatever the pool, the best any shared pool can do. The
// asserts are generous (timing on a shared machine): the waits against the hold p99 measured in
// the same run (a busy machine stretches both), and the p99s against pgxpool's.
func TestPriorityHighLookupsUnderLowLoad(t *testing.T) {
	dsn := newDB(t, 1000)
	const (
		runs     = 5
		lowLoad  = 64
		lowStmt  = "select pg_sleep(0.005)"
		duration = time.Second
	)
	lookup := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) func(ctx context.Context, rng *rand.Rand) error {
		return func(ctx context.Context, rng *rand.Rand) error {
			return q.QueryRow(ctx, "select v from items where id = $1", 1+rng.IntN(1000)).Scan(new(int))
		}
	}
	// underLoad runs the high lookups on lanes while the low load saturates Short, and returns
	// their latencies, their acquire waits and the holds in Short meanwhile.
	underLoad := func(ctx context.Context, lanes *pgxlanes.Pool) (loaded, waits, holds *latencies, lowFailed, failed int64) {
		obs := newPrioObserver()
		remove := lanes.AddObserver(obs)
		defer remove()
		stop := time.Now().Add(duration + 300*time.Millisecond)
		low := pgxlanes.WithPriority(ctx, pgxlanes.PriorityLow)
		_, lowF, lowWG := loop(low, lowLoad, stop, 0, func(ctx context.Context, _ *rand.Rand) error {
			_, err := lanes.Exec(ctx, lowStmt)
			return err
		})
		time.Sleep(300 * time.Millisecond) // the load fills Short
		obs.mu.Lock()
		delete(obs.waits, pgxlanes.PriorityHigh) // from here on: the waits and holds under load
		obs.holds.mu.Lock()
		obs.holds.d = nil
		obs.holds.mu.Unlock()
		obs.mu.Unlock()
		high := pgxlanes.WithPriority(ctx, pgxlanes.PriorityHigh)
		loaded, f, wg := loop(high, 2, stop, 2*time.Millisecond, lookup(lanes))
		wg.Wait()
		lowWG.Wait()
		lanesIdle(t, lanes, "after the load")
		obs.mu.Lock()
		waits = &latencies{d: obs.waits[pgxlanes.PriorityHigh]}
		obs.mu.Unlock()
		return loaded, waits, &obs.holds, lowF.Load(), f.Load()
	}
	type figures struct{ p99, vsIdle, wait99, waitVsHold []float64 }
	var idleP99, plainP99, plainVsIdle, dedicatedP99, lanesVsDedicated []float64
	var with, without figures
	for run := range runs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)

		// Idle: the high lookups alone.
		lanes := newLanes(t, dsn, "pool_max_conns=8")
		high := pgxlanes.WithPriority(ctx, pgxlanes.PriorityHigh)
		idle, idleFailed, wg := loop(high, 2, time.Now().Add(duration), 2*time.Millisecond, lookup(lanes))
		wg.Wait()
		i99, _ := idle.quantile(0.99)
		require.Zero(t, idleFailed.Load(), "idle lookups failed")

		// Loaded: pgxlanes with its default headroom, then without.
		for _, c := range []struct {
			f      *figures
			lanes  *pgxlanes.Pool
			params string
		}{{&with, lanes, ""}, {&without, newLanes(t, dsn, "pool_max_conns=8&lane_short_priority_headroom=0"), "headroom 0"}} {
			loaded, waits, holds, lowFailed, failed := underLoad(ctx, c.lanes)
			l99, ln := loaded.quantile(0.99)
			w99, _ := waits.quantile(0.99)
			h99, _ := holds.quantile(0.99)
			t.Logf("run %d %-10s: high lookups p99 %s under low load against %s idle (%d lookups, %d failed), wait p99 %s, hold p99 %s; low statements failed %d",
				run+1, c.params, fmtDur(l99), fmtDur(i99), ln, failed, fmtDur(w99), fmtDur(h99), lowFailed)
			require.Positive(t, ln, "no high lookup completed under load")
			c.f.p99 = append(c.f.p99, ms(l99))
			c.f.vsIdle = append(c.f.vsIdle, float64(l99)/float64(max(i99, time.Microsecond)))
			c.f.wait99 = append(c.f.wait99, ms(w99))
			c.f.waitVsHold = append(c.f.waitVsHold, float64(w99)/float64(max(h99, time.Microsecond)))
		}

		// pgxpoolUnderLoad runs the low load on load and the high lookups on look, both plain
		// pgxpools, and returns the lookups' latencies.
		pgxpoolUnderLoad := func(load, look *pgxpool.Pool) *latencies {
			stop := time.Now().Add(duration + 300*time.Millisecond)
			_, _, lowWG := loop(ctx, lowLoad, stop, 0, func(ctx context.Context, _ *rand.Rand) error {
				_, err := load.Exec(ctx, lowStmt)
				return err
			})
			time.Sleep(300 * time.Millisecond)
			loaded, _, wg := loop(ctx, 2, stop, 2*time.Millisecond, lookup(look))
			wg.Wait()
			lowWG.Wait()
			return loaded
		}

		// The machine's share: the same load on a pool of 8, and the lookups on a pgxpool of
		// their own (2 connections), which no queue can delay. What is left between this and
		// idle is the CPU the load takes from the client and the server, not any pool's doing.
		load, own := newPgxpool(t, dsn, "pool_max_conns=8"), newPgxpool(t, dsn, "pool_max_conns=2")
		d99, dn := pgxpoolUnderLoad(load, own).quantile(0.99)
		load.Close()
		own.Close()
		t.Logf("run %d dedicated : lookups p99 %s on a pool of their own under the same load (%d lookups)", run+1, fmtDur(d99), dn)
		require.Positive(t, dn, "no lookup completed on the dedicated pool")
		dedicatedP99 = append(dedicatedP99, ms(d99))
		lanesVsDedicated = append(lanesVsDedicated, with.p99[run]/max(ms(d99), 0.001))

		// Loaded, plain pgxpool of the same size: FIFO.
		plain := newPgxpool(t, dsn, "pool_max_conns=8")
		plainLoaded := pgxpoolUnderLoad(plain, plain)
		plain.Close()
		cancel()
		p99, pn := plainLoaded.quantile(0.99)
		t.Logf("run %d pgxpool   : lookups p99 %s under load (%d lookups)", run+1, fmtDur(p99), pn)
		require.Positive(t, pn, "no lookup completed on pgxpool")
		idleP99, plainP99 = append(idleP99, ms(i99)), append(plainP99, ms(p99))
		plainVsIdle = append(plainVsIdle, float64(p99)/float64(max(i99, time.Microsecond)))
	}
	for _, f := range []struct {
		name string
		v    []float64
	}{
		{"priority.idle_p99_ms", idleP99},
		{"priority.high_under_low_load_p99_ms", with.p99}, {"priority.high_vs_idle", with.vsIdle},
		{"priority.high_wait_p99_ms", with.wait99}, {"priority.high_wait_vs_hold_p99", with.waitVsHold},
		{"priority.no_headroom_p99_ms", without.p99}, {"priority.no_headroom_vs_idle", without.vsIdle},
		{"priority.no_headroom_wait_vs_hold_p99", without.waitVsHold},
		{"priority.pgxpool_under_load_p99_ms", plainP99}, {"priority.pgxpool_vs_idle", plainVsIdle},
		{"priority.dedicated_pool_p99_ms", dedicatedP99}, {"priority.high_vs_dedicated_pool", lanesVsDedicated},
	} {
		m, lo, hi := medianRange(f.v)
		t.Logf("%s: median %.2f (range %.2f–%.2f) of %d runs", f.name, m, lo, hi, runs)
		figure(t, f.name, m)
	}
	mWait, _, _ := medianRange(with.waitVsHold)
	mNoWait, _, _ := medianRange(without.waitVsHold)
	mPrio, _, _ := medianRange(with.p99)
	mPlain, _, _ := medianRange(plainP99)
	// Generous: quiet, the waits are about 0.05 holds with the headroom and 0.3–0.7 without; at
	// load 17 with -race 0.06 and 2.4 (the machine stretches waits more than holds).
	assert.Less(t, mNoWait, 3.0, "without headroom: high-priority acquire wait p99 against the hold p99 (median of runs): about one hold, not FIFO's seven")
	assert.Less(t, mWait, 0.5, "with the headroom: high-priority acquire wait p99 against the hold p99 (median of runs): a fraction of a hold")
	assert.Less(t, mWait, mNoWait, "the headroom shortens the high-priority waits")
	assert.Less(t, mPrio, mPlain/2, "high lookups under load: pgxlanes with priorities against FIFO pgxpool")
	mDed, _, _ := medianRange(lanesVsDedicated)
	// Generous: quiet and without -race, 1.1×. With -race every call of pgxlanes' own code is
	// instrumented, which the dedicated pgxpool's shorter path is not, and the dedicated pool's
	// p99 (1–3 ms) is the noisy side of the ratio: the medians read 1.77–2.88 on the code before
	// this bound was set and 2.00–3.82 after, the high lookups' p99 the same in both (3.4–4.6 ms),
	// and the high lookups' acquire wait stays a tenth of a hold (asserted above).
	dedBound := 3.0
	if race.Enabled {
		dedBound = 6.0
	}
	assert.Less(t, mDed, dedBound, "high lookups under load: pgxlanes against a pool of their own (generous: quiet, 1.1×)")
}

// TestPriorityAgeingBoundsLowWaits: 16 high-priority clients keep Short (8 connections) saturated
// with 20 ms statements, so that a high-priority caller always waits, and 4 low-priority clients
// run the same statements. With lane_short_priority_age=100ms every low-priority caller is served
// within the ageing bound plus one hold time (docs/design.md: PriorityAge + ⌈(k+1)/m⌉·h, with
// k < 8 = m here), and none times out. With ageing far beyond the acquire timeout the same low
// callers starve until their timeout: the bound is ageing's doing.
func TestPriorityAgeingBoundsLowWaits(t *testing.T) {
	dsn := newDB(t, 10)
	const (
		age      = 100 * time.Millisecond
		duration = 2 * time.Second
	)
	run := func(priorityAge string) (*prioObserver, pgxlanes.LaneStat) {
		lanes := newLanes(t, dsn, "pool_max_conns=8&lane_short_acquire_timeout=1s&lane_short_priority_age="+priorityAge)
		obs := newPrioObserver()
		defer lanes.AddObserver(obs)()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stop := time.Now().Add(duration)
		stmt := func(ctx context.Context, _ *rand.Rand) error {
			_, err := lanes.Exec(ctx, "select pg_sleep(0.02)")
			return err
		}
		_, _, highWG := loop(pgxlanes.WithPriority(ctx, pgxlanes.PriorityHigh), 16, stop, 0, stmt)
		time.Sleep(200 * time.Millisecond)
		_, _, lowWG := loop(pgxlanes.WithPriority(ctx, pgxlanes.PriorityLow), 4, stop, 0, stmt)
		highWG.Wait()
		lowWG.Wait()
		st := lanes.Stat().Lane(pgxlanes.Short)
		lanesIdle(t, lanes, "after the load")
		return obs, st
	}

	obs, st := run(age.String())
	n, worst, failed := obs.stats(pgxlanes.PriorityLow)
	hn, hworst, hfailed := obs.stats(pgxlanes.PriorityHigh)
	hold := time.Duration(obs.maxHold.Load())
	bound := age + hold
	t.Logf("ageing %v: %d low-priority acquires, worst wait %s, %d failed; %d high, worst %s, %d failed; longest hold %s, bound %s; aged grants %d",
		age, n, fmtDur(worst), failed, hn, fmtDur(hworst), hfailed, fmtDur(hold), fmtDur(bound), st.AgedGrants)
	figure(t, "priority.low_worst_wait_ms", ms(worst))
	figure(t, "priority.low_bound_ms", ms(bound))
	require.Positive(t, n, "no low-priority acquire")
	assert.Zero(t, failed, "a low-priority caller timed out: starved")
	assert.Positive(t, st.AgedGrants, "the high load never let ageing act: the test did not saturate Short")
	assert.GreaterOrEqual(t, worst, age/2, "low callers were served without waiting for ageing: the high load did not saturate Short")
	// The scheduler's bound is age + one hold; the margin is for the goroutine and the
	// server's scheduling on a shared machine.
	assert.LessOrEqual(t, worst, bound+100*time.Millisecond, "worst low-priority wait against ageing bound + one hold")

	obs, _ = run("1h")
	n, _, failed = obs.stats(pgxlanes.PriorityLow)
	t.Logf("no ageing (1h): %d low-priority acquires, %d timed out", n, failed)
	assert.Positive(t, failed, "without ageing, low callers should starve until their timeout")
}

// TestTagShareAdmitsOtherTag: tag "bulk" opens 50 transactions that each hold 500 ms, more than
// Tx can run; then tag "checkout" begins one. With lane_tx_max_tag_share=0.5 checkout gets the
// first connection Tx frees, ahead of bulk's queue: no bulk transaction is admitted while it
// waits, and it waits at most one hold time; without the share, it waits behind bulk's queue; in
// dry run, it waits the same but the share logs and counts what it would have refused.
func TestTagShareAdmitsOtherTag(t *testing.T) {
	dsn := newDB(t, 10)
	const hold = 500 * time.Millisecond
	run := func(params string) (time.Duration, int64, pgxlanes.LaneStat, *logBuffer) {
		p, logs := newGuardedPool(t, dsn, "pool_max_conns=8"+params, nil)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Open Tx's connections first, so that the holds start together and the first release
		// comes one hold time after they do.
		var warm []pgx.Tx
		for range p.Stat().Lane(pgxlanes.Tx).MaxConns {
			tx, err := p.Begin(ctx)
			require.NoError(t, err)
			warm = append(warm, tx)
		}
		for _, tx := range warm {
			require.NoError(t, tx.Rollback(ctx))
		}
		obs := &overtakes{}
		defer p.AddObserver(obs)()
		bulk := pgxlanes.WithTag(ctx, "bulk")
		var wg sync.WaitGroup
		var bulkErrs atomic.Int64
		for range 50 {
			wg.Go(func() {
				err := pgx.BeginFunc(bulk, p, func(tx pgx.Tx) error {
					time.Sleep(hold)
					return nil
				})
				if err != nil {
					bulkErrs.Add(1)
				}
			})
		}
		require.Eventually(t, func() bool { return p.Stat().Lane(pgxlanes.Tx).Waiting >= 40 }, 10*time.Second, time.Millisecond)
		start := time.Now()
		obs.waiting.Store(true) // until checkout's acquire is reported
		tx, err := p.Begin(pgxlanes.WithTag(ctx, "checkout"))
		wait := time.Since(start)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		wg.Wait()
		assert.Zero(t, bulkErrs.Load(), "bulk transactions failed")
		st := p.Stat().Lane(pgxlanes.Tx)
		lanesIdle(t, p, "after the load")
		return wait, obs.bulk.Load(), st, logs
	}

	wait, overtaken, st, logs := run("&lane_tx_max_tag_share=0.5")
	t.Logf("share 0.5: checkout admitted after %s (Tx cap %d, hold %s), %d bulk transactions admitted meanwhile; %d tag-share refusals",
		fmtDur(wait), st.MaxConns, hold, overtaken, st.TagShareRefusals)
	figure(t, "tag_share.checkout_wait_ms", ms(wait))
	// Checkout takes the first slot Tx frees after it queued (one pass-over of bulk's first
	// waiter); the slots freed in the same instant go to bulk, and may be reported before
	// checkout's own acquire is.
	assert.Less(t, overtaken, int64(st.MaxConns), "bulk transactions admitted while checkout waited: more than one release's worth")
	assert.Less(t, wait, 2*hold, "checkout admitted within one hold time (with a margin for a shared machine)")
	assert.Positive(t, st.TagShareRefusals)
	assert.True(t, logged(t, logs, "pgxlanes: caller held back by the tag share", "bulk"), "log line naming the held-back tag")

	wait, overtaken, st, _ = run("")
	t.Logf("no share: checkout admitted after %s, %d bulk transactions admitted meanwhile; %d refusals", fmtDur(wait), overtaken, st.TagShareRefusals)
	figure(t, "tag_share.checkout_wait_no_share_ms", ms(wait))
	assert.Greater(t, overtaken, int64(30), "without the share checkout waits behind bulk's queue")
	assert.Greater(t, wait, 3*hold, "without the share checkout waits behind bulk's queue")
	assert.Zero(t, st.TagShareRefusals)

	wait, overtaken, st, logs = run("&lane_tx_max_tag_share=0.5&lane_tx_tag_share_dry_run=true")
	t.Logf("dry run: checkout admitted after %s, %d bulk transactions admitted meanwhile; %d would-be refusals", fmtDur(wait), overtaken, st.TagShareRefusals)
	assert.Greater(t, overtaken, int64(30), "dry run changes nothing")
	assert.Positive(t, st.TagShareRefusals, "dry run counts")
	assert.True(t, logged(t, logs, "pgxlanes: dry run: the tag share would have held this caller back", "bulk"), "dry-run log line")
}

// overtakes counts the bulk transactions admitted while waiting is set.
type overtakes struct {
	waiting atomic.Bool
	bulk    atomic.Int64
}

func (o *overtakes) ObserveAcquire(e pgxlanes.AcquireEvent) {
	switch {
	case e.Err == nil && e.Tag == "checkout":
		o.waiting.Store(false)
	case e.Err == nil && e.Tag == "bulk" && o.waiting.Load():
		o.bulk.Add(1)
	}
}
func (o *overtakes) ObserveRelease(pgxlanes.ReleaseEvent) {}

// logged reports whether logs hold a line with message msg and tag tag.
func logged(t *testing.T, logs *logBuffer, msg, tag string) bool {
	for _, r := range logs.records(t) {
		if m, _ := r["msg"].(string); strings.HasPrefix(m, msg) && r["tag"] == tag {
			return true
		}
	}
	return false
}

// TestPriorityThroughStdlib: WithPriority on a database/sql call's context reaches the pool, as
// the other annotations do.
func TestPriorityThroughStdlib(t *testing.T) {
	dsn := newDB(t, 10)
	lanes := newLanes(t, dsn, "pool_max_conns=4")
	obs := newPrioObserver()
	defer lanes.AddObserver(obs)()
	db := stdlib.OpenDBFromPool(lanes)
	defer db.Close()
	ctx := pgxlanes.WithPriority(context.Background(), pgxlanes.PriorityCritical)
	require.NoError(t, db.QueryRowContext(ctx, "select v from items where id = 1").Scan(new(int)))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	n, _, _ := obs.stats(pgxlanes.PriorityCritical)
	assert.Equal(t, 2, n, "the query's and the transaction's acquires carry the priority")
	n, _, _ = obs.stats(pgxlanes.PriorityNormal)
	assert.Zero(t, n)
}

// TestPriorityLowTakesTheHeadroomOnceAged: with the default settings (Short: acquire timeout 1s,
// PriorityAge 500ms, PriorityHeadroom 1), a PriorityLow call that finds Short down to its last
// connection waits until it has aged, and then takes that connection, though nothing else
// happens in the lane meanwhile: it does not time out beside a free connection.
func TestPriorityLowTakesTheHeadroomOnceAged(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	p := newLanes(t, dsn, "pool_max_conns=4")
	short := pgxlanes.WithLane(bg, pgxlanes.Short)
	st := p.Stat().Lane(pgxlanes.Short)
	require.GreaterOrEqual(t, st.MaxConns, 2)
	for range st.MaxConns - 1 {
		c, err := p.Acquire(short)
		require.NoError(t, err)
		defer c.Release()
	}
	start := time.Now()
	_, err := p.Exec(pgxlanes.WithPriority(short, pgxlanes.PriorityLow), "select 1")
	waited := time.Since(start)
	t.Logf("Short cap %d, %d held; the low call returned after %v: %v", st.MaxConns, st.MaxConns-1, waited.Round(time.Millisecond), err)
	require.NoError(t, err, "a low-priority call timed out with a Short connection free")
	assert.GreaterOrEqual(t, waited, 400*time.Millisecond, "the low call took the headroom before it aged")
}
