package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// The bank of the retry tests: a few hot accounts and a ledger of transfers keyed by an
// idempotency key, the pattern README's "Retrying transactions" shows.
const bankSchema = `
create table accounts (id int primary key, balance bigint not null);
create table transfers (key text primary key, src int not null, dst int not null, amount bigint not null);
`

const initialBalance = 1_000_000

// newBank returns the DSN of a fresh database with n accounts.
func newBank(t testing.TB, n int) string {
	t.Helper()
	dsn := pgserver.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, bankSchema)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `insert into accounts select g, $2 from generate_series(1, $1::int) g`, n, initialBalance)
	require.NoError(t, err)
	return dsn
}

// transferSpec is one transfer a caller asks for.
type transferSpec struct {
	key      string
	src, dst int
	amount   int64
	// lockOrder: "src-first" locks src then dst; "dst-first" the reverse (deadlock-prone when
	// callers mix them); "read" reads src's balance first (SERIALIZABLE conflicts).
	lockOrder string
}

var errInsufficient = errors.New("insufficient funds")

// transfer is the transaction: it records the transfer under its idempotency key, once (a second
// call with the same key changes nothing and succeeds), and moves the money.
func transfer(ctx context.Context, tx pgx.Tx, s transferSpec) error {
	tag, err := tx.Exec(ctx, `insert into transfers (key, src, dst, amount) values ($1, $2, $3, $4) on conflict (key) do nothing`,
		s.key, s.src, s.dst, s.amount)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return nil // applied already, by an earlier call whose outcome its caller did not learn
	}
	move := func(id int, delta int64) error {
		_, err := tx.Exec(ctx, `update accounts set balance = balance + $2 where id = $1`, id, delta)
		return err
	}
	switch s.lockOrder {
	case "read":
		var bal int64
		if err := tx.QueryRow(ctx, `select balance from accounts where id = $1`, s.src).Scan(&bal); err != nil {
			return err
		}
		if bal < s.amount {
			return errInsufficient
		}
		if err := move(s.src, -s.amount); err != nil {
			return err
		}
		return move(s.dst, s.amount)
	case "dst-first":
		if err := move(s.dst, s.amount); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `select pg_sleep(0.002)`); err != nil {
			return err
		}
		return move(s.src, -s.amount)
	default:
		if err := move(s.src, -s.amount); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `select pg_sleep(0.002)`); err != nil {
			return err
		}
		return move(s.dst, s.amount)
	}
}

// bankResult is what the callers got.
type bankResult struct {
	spec transferSpec
	err  error
	took time.Duration
}

// runTransfers runs the transfers of specs with `workers` callers, released together, through
// RetryTx with opts on db.
func runTransfers(t *testing.T, db pgxlanes.Beginner, iso pgx.TxIsoLevel, opts pgxlanes.RetryOptions, workers int, specs []transferSpec) ([]bankResult, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results := make([]bankResult, len(specs))
	var next atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			<-start
			for {
				i := int(next.Add(1) - 1)
				if i >= len(specs) {
					return
				}
				t0 := time.Now()
				err := opts.RetryTx(ctx, db, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
					return transfer(ctx, tx, specs[i])
				})
				results[i] = bankResult{spec: specs[i], err: err, took: time.Since(t0)}
			}
		})
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	return results, time.Since(t0)
}

// checkBank checks the bank after the transfers: the money is conserved, every caller told
// success has its transfer applied exactly once, every other caller has none applied, and each
// account's balance is what the ledger says. Every error is allowed only if it is a non-retryable
// one (errInsufficient) or the retryable one after the cap; it returns the counts.
func checkBank(t *testing.T, dsn string, accounts int, opts pgxlanes.RetryOptions, results []bankResult) (ok, gaveUp, failed int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)

	var total int64
	require.NoError(t, conn.QueryRow(ctx, `select sum(balance) from accounts`).Scan(&total))
	assert.Equal(t, int64(accounts*initialBalance), total, "money conserved")

	applied := map[string]int{}
	rows, err := conn.Query(ctx, `select key from transfers`)
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, k := range keys {
		applied[k]++
	}
	maxAttempts := opts.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = pgxlanes.DefaultRetryMaxAttempts
	}
	lost, doubled, phantom := 0, 0, 0
	for _, r := range results {
		n := applied[r.spec.key]
		switch {
		case r.err == nil:
			ok++
			if n == 0 {
				lost++
			}
		case errors.Is(r.err, errInsufficient):
			failed++
		case errors.Is(r.err, pgxlanes.ErrRetryGaveUp):
			gaveUp++
			var re *pgxlanes.RetryError
			require.ErrorAs(t, r.err, &re)
			if re.Reason == pgxlanes.RetryReasonMaxAttempts {
				assert.Equal(t, maxAttempts, re.Attempts, "gave up at the cap on attempts")
			} else {
				assert.Equal(t, pgxlanes.RetryReasonMaxElapsed, re.Reason, "gave up at a documented cap")
			}
			var pe *pgconn.PgError
			require.ErrorAs(t, r.err, &pe, "the retryable error is wrapped")
			codes := opts.RetryCodes
			if codes == nil {
				codes = pgxlanes.DefaultRetryCodes()
			}
			assert.Contains(t, codes, pe.Code)
		default:
			t.Errorf("transfer %s: an error that is neither non-retryable nor the retryable one after the cap: %v", r.spec.key, r.err)
		}
		if r.err != nil && n != 0 {
			phantom++
		}
		if n > 1 {
			doubled++
		}
	}
	assert.Zero(t, lost, "transfers reported done that are not in the ledger")
	assert.Zero(t, doubled, "transfers applied twice")
	assert.Zero(t, phantom, "transfers reported failed that are in the ledger")

	// Each balance is what the ledger says: no update applied without its ledger row, or twice.
	rows, err = conn.Query(ctx, `
		select a.id, a.balance, $1::bigint
			- coalesce((select sum(amount) from transfers where src = a.id), 0)
			+ coalesce((select sum(amount) from transfers where dst = a.id), 0)
		from accounts a order by a.id`, initialBalance)
	require.NoError(t, err)
	for rows.Next() {
		var id int
		var bal, want int64
		require.NoError(t, rows.Scan(&id, &bal, &want))
		assert.Equal(t, want, bal, "account %d's balance against the ledger", id)
	}
	require.NoError(t, rows.Err())
	return ok, gaveUp, failed
}

// retryCounts counts a pool's retry events.
type retryCounts struct {
	mu       sync.Mutex
	attempts int
	retries  map[string]int // by code
	gaveUp   int
	unknown  int
}

func (c *retryCounts) ObserveAcquire(pgxlanes.AcquireEvent) {}
func (c *retryCounts) ObserveRelease(pgxlanes.ReleaseEvent) {}
func (c *retryCounts) ObserveRetry(e pgxlanes.RetryEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts++
	switch e.Outcome {
	case pgxlanes.RetryWillRetry:
		if c.retries == nil {
			c.retries = map[string]int{}
		}
		c.retries[e.Code]++
	case pgxlanes.RetryGaveUp:
		c.gaveUp++
	case pgxlanes.RetryCommitUnknown:
		c.unknown++
	}
}

// hotSpecs returns n transfers among `accounts` accounts, each with a key of its own; with
// mixed, half lock dst first.
func hotSpecs(n, accounts int, order string, seed uint64) []transferSpec {
	rng := rand.New(rand.NewPCG(seed, 7))
	specs := make([]transferSpec, n)
	for i := range specs {
		src := 1 + rng.IntN(accounts)
		dst := 1 + (src+rng.IntN(accounts-1))%accounts
		o := order
		if order == "mixed" {
			o = []string{"src-first", "dst-first"}[i%2]
		}
		specs[i] = transferSpec{key: "t-" + strconv.Itoa(i), src: src, dst: dst, amount: 1 + rng.Int64N(100), lockOrder: o}
	}
	return specs
}

// TestRetrySerializableTransfers: concurrent SERIALIZABLE transfers between 4 hot accounts, where
// 40001 is frequent, through RetryTx on pgxlanes and on plain pgxpool.
func TestRetrySerializableTransfers(t *testing.T) {
	for _, which := range []string{"pgxlanes", "pgxpool"} {
		t.Run(which, func(t *testing.T) {
			dsn := newBank(t, 4)
			counts := &retryCounts{}
			var db pgxlanes.Beginner
			var lanes *pgxlanes.Pool
			if which == "pgxlanes" {
				lanes = newLanes(t, dsn, "pool_max_conns=16")
				lanes.AddObserver(counts)
				db = lanes
			} else {
				db = newPgxpool(t, dsn, "pool_max_conns=16")
			}
			opts := pgxlanes.RetryOptions{MaxAttempts: 20}
			specs := hotSpecs(160, 4, "read", 1)
			results, took := runTransfers(t, db, pgx.Serializable, opts, 8, specs)
			ok, gaveUp, failed := checkBank(t, dsn, 4, opts, results)
			t.Logf("%s: %d transfers in %v: %d done, %d gave up after the cap, %d non-retryable", which, len(specs), took.Round(time.Millisecond), ok, gaveUp, failed)
			assert.Greater(t, ok, len(specs)/2, "most transfers go through")
			if which == "pgxlanes" {
				t.Logf("attempts %d, retries %v, gave up %d", counts.attempts, counts.retries, counts.gaveUp)
				assert.Positive(t, counts.retries["40001"], "40001 happened and was retried: the test exercises the retries")
				assert.Equal(t, counts.gaveUp, gaveUp)
				assert.Equal(t, len(specs)+sumMap(counts.retries), counts.attempts, "one event per attempt")
				assert.Equal(t, int64(counts.attempts), lanes.Stat().Lane(pgxlanes.Tx).Acquires, "each attempt a lease of its own on Tx")
				lanesIdle(t, lanes, "after the transfers")
			}
		})
	}
}

// TestRetryDeadlockTransfers: transfers between 2 accounts that lock them in opposite orders, so
// PostgreSQL detects deadlocks (40P01, deadlock_timeout 20 ms here) and aborts one of each pair.
func TestRetryDeadlockTransfers(t *testing.T) {
	for _, which := range []string{"pgxlanes", "pgxpool"} {
		t.Run(which, func(t *testing.T) {
			dsn := newBank(t, 2)
			setDeadlockTimeout(t, dsn, "20ms")
			counts := &retryCounts{}
			var db pgxlanes.Beginner
			if which == "pgxlanes" {
				p := newLanes(t, dsn, "pool_max_conns=12")
				p.AddObserver(counts)
				db = p
			} else {
				db = newPgxpool(t, dsn, "pool_max_conns=12")
			}
			opts := pgxlanes.RetryOptions{MaxAttempts: 20}
			specs := hotSpecs(120, 2, "mixed", 2)
			results, took := runTransfers(t, db, pgx.ReadCommitted, opts, 8, specs)
			ok, gaveUp, failed := checkBank(t, dsn, 2, opts, results)
			t.Logf("%s: %d transfers in %v: %d done, %d gave up after the cap, %d non-retryable", which, len(specs), took.Round(time.Millisecond), ok, gaveUp, failed)
			assert.Greater(t, ok, len(specs)/2, "most transfers go through")
			if which == "pgxlanes" {
				t.Logf("attempts %d, retries %v, gave up %d", counts.attempts, counts.retries, counts.gaveUp)
				assert.Positive(t, counts.retries["40P01"], "40P01 happened and was retried: the test exercises the retries")
			}
		})
	}
}

// setDeadlockTimeout sets deadlock_timeout for the new sessions of dsn's database.
func setDeadlockTimeout(t *testing.T, dsn, d string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, fmt.Sprintf(`alter database %s set deadlock_timeout = '%s'`,
		pgx.Identifier{conn.Config().Database}.Sanitize(), d))
	require.NoError(t, err)
}

func sumMap(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestRetryCommitOutcomeUnknown: the connection is lost while COMMIT is in flight, after the
// server committed. RetryTx returns ErrRetryCommitUnknown after one attempt and does not retry:
// a retry would have applied the transfer twice. The caller then calls again with the same
// idempotency key, which finds the transfer applied and changes nothing. The COMMIT is RetryTx's
// own, or fn's (fn commits and returns Commit's error: with pgxpool, pgx's "conn closed", which
// pgconn marks safe to retry, was retried before RetryTx took fn's error for a Commit's).
func TestRetryCommitOutcomeUnknown(t *testing.T) {
	for _, mode := range []string{"pgxlanes", "pgxpool", "pgxlanes/fn commits", "pgxpool/fn commits"} {
		which, fnCommits := strings.TrimSuffix(mode, "/fn commits"), strings.HasSuffix(mode, "/fn commits")
		t.Run(mode, func(t *testing.T) {
			dsn := newBank(t, 2)
			proxy := pgserver.NewProxy(t, dsn)
			counts := &retryCounts{}
			var db pgxlanes.Beginner
			if which == "pgxlanes" {
				p := newLanes(t, proxy.DSN(), "pool_max_conns=4")
				p.AddObserver(counts)
				db = p
			} else {
				db = newPgxpool(t, proxy.DSN(), "pool_max_conns=4")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spec := transferSpec{key: "once", src: 1, dst: 2, amount: 10}
			attempts := 0
			err := pgxlanes.RetryTx(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
				attempts++
				if err := transfer(ctx, tx, spec); err != nil {
					return err
				}
				// COMMIT will reach the server; its answer will not reach us, and the connection
				// is then reset.
				require.NoError(t, proxy.SetBlackhole(faultproxy.Downstream, true))
				time.AfterFunc(300*time.Millisecond, func() { proxy.Reset(); _ = proxy.Normal() })
				if fnCommits {
					return tx.Commit(ctx)
				}
				return nil
			})
			require.Error(t, err)
			assert.ErrorIs(t, err, pgxlanes.ErrRetryCommitUnknown)
			assert.NotErrorIs(t, err, pgxlanes.ErrRetryGaveUp)
			assert.Equal(t, 1, attempts, "a commit of unknown outcome is never retried")
			t.Logf("%s: %v", which, err)

			check := func() (rows int, bal int64) {
				conn, err := pgx.Connect(ctx, dsn)
				require.NoError(t, err)
				defer conn.Close(ctx)
				require.NoError(t, conn.QueryRow(ctx, `select count(*) from transfers`).Scan(&rows))
				require.NoError(t, conn.QueryRow(ctx, `select balance from accounts where id = 2`).Scan(&bal))
				return rows, bal
			}
			rows, bal := check()
			assert.Equal(t, 1, rows, "the server committed: a blind retry would have applied it twice")
			assert.Equal(t, int64(initialBalance+10), bal)

			// The caller resolves the unknown outcome by calling again with the same key.
			require.NoError(t, pgxlanes.RetryTx(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error { return transfer(ctx, tx, spec) }))
			rows, bal = check()
			assert.Equal(t, 1, rows)
			assert.Equal(t, int64(initialBalance+10), bal, "the idempotency key kept the transfer single")
			if which == "pgxlanes" {
				assert.Equal(t, 1, counts.unknown)
			}
		})
	}
}

// TestRetryJitterVersusFixed compares pauses in the same run, on bursts: 8 callers released
// together each move money out of the same hot account under SERIALIZABLE, with 5 ms of work
// inside the transaction; 16 bursts per mode and round, the modes alternating. The losers of a
// collision fail together, when the winner commits, so with a fixed pause they come back together
// and collide again; with jitter they come back spread out. Modes: a fixed 20 ms pause (about 3
// times a transaction's run); full jitter below the same 20 ms; and RetryTx's exponential full
// jitter from a 20 ms base; and RetryTx's defaults (from 5 ms, up to 1 s). It logs
// throughput and p99 per mode as medians of the rounds with their ranges, and asserts only loosely
// (the figures are for README; the machine's load moves them). PGXLANES_RETRY_ROUNDS sets the
// rounds (default 5).
func TestRetryJitterVersusFixed(t *testing.T) {
	if testing.Short() {
		t.Skip("a side-by-side measurement of about a minute")
	}
	rounds := 5
	if v := os.Getenv("PGXLANES_RETRY_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "PGXLANES_RETRY_ROUNDS")
		rounds = n
	}
	const callers, bursts = 8, 16
	const pause = 20 * time.Millisecond
	maxRand := func(n int64) int64 { return n - 1 }
	modes := []struct {
		name string
		opts pgxlanes.RetryOptions
	}{
		{"fixed", pgxlanes.RetryOptions{MaxAttempts: 100, BaseDelay: pause, MaxDelay: pause, Rand: maxRand}},
		{"jitter", pgxlanes.RetryOptions{MaxAttempts: 100, BaseDelay: pause, MaxDelay: pause}},
		{"exp-jitter", pgxlanes.RetryOptions{MaxAttempts: 100, BaseDelay: pause, MaxDelay: 16 * pause}},
		{"defaults", pgxlanes.RetryOptions{MaxAttempts: 100}}, // base 5 ms, cap 1 s
	}
	dsn := newBank(t, callers+1)
	p := newLanes(t, dsn, "pool_max_conns=20") // the Tx lane takes all 8 callers at once: no queue spreads them
	require.GreaterOrEqual(t, p.Config().Tx.MaxConns, callers)
	counts := map[string]*retryCounts{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	type figures struct{ tput, p99, p50, attempts []float64 }
	got := map[string]*figures{}
	key := 0
	for round := range rounds {
		order := slices.Clone(modes)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, m := range order {
			c := &retryCounts{}
			counts[m.name] = c
			remove := p.AddObserver(c)
			lat := &latencies{}
			var busy time.Duration
			done := 0
			for range bursts {
				start := make(chan struct{})
				errs := make([]error, callers)
				var wg sync.WaitGroup
				for i := range callers {
					key++
					spec := transferSpec{key: "b-" + strconv.Itoa(key), src: 1, dst: 2 + i, amount: 1, lockOrder: "read"}
					wg.Go(func() {
						<-start
						t0 := time.Now()
						errs[i] = m.opts.RetryTx(ctx, p, pgx.TxOptions{IsoLevel: pgx.Serializable}, func(tx pgx.Tx) error {
							if _, err := tx.Exec(ctx, `select pg_sleep(0.005)`); err != nil { // the application's work
								return err
							}
							return transfer(ctx, tx, spec)
						})
						lat.add(time.Since(t0))
					})
				}
				t0 := time.Now()
				close(start)
				wg.Wait()
				busy += time.Since(t0)
				for _, err := range errs {
					if assert.NoError(t, err) {
						done++
					}
				}
			}
			remove()
			p99, _ := lat.quantile(0.99)
			p50, _ := lat.quantile(0.50)
			f := got[m.name]
			if f == nil {
				f = &figures{}
				got[m.name] = f
			}
			f.tput = append(f.tput, float64(done)/busy.Seconds())
			f.p99 = append(f.p99, ms(p99))
			f.p50 = append(f.p50, ms(p50))
			f.attempts = append(f.attempts, float64(c.attempts)/float64(done))
			t.Logf("round %d %-10s: %d transfers in %v: %.0f/s, p50 %v, p99 %v, %.2f attempts per transfer",
				round+1, m.name, done, busy.Round(time.Millisecond), float64(done)/busy.Seconds(), fmtDur(p50), fmtDur(p99), float64(c.attempts)/float64(done))
		}
	}
	checkBank(t, dsn, callers+1, pgxlanes.RetryOptions{MaxAttempts: 100}, nil)
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("load average: %s", load)
	for _, m := range modes {
		f := got[m.name]
		t.Logf("%-10s: throughput %s transfers/s, p50 %s ms, p99 %s ms, attempts per transfer %.2f (median of %d [range])", m.name,
			medianRangeText(f.tput), medianRangeText(f.p50), medianRangeText(f.p99), medianF(f.attempts), rounds)
		figure(t, "retry_"+m.name+"_tput", medianF(f.tput))
		figure(t, "retry_"+m.name+"_p99_ms", medianF(f.p99))
	}
	for _, name := range []string{"jitter", "exp-jitter", "defaults"} {
		j, f := got[name], got["fixed"]
		t.Logf("%s / fixed: throughput ×%.2f, p99 ×%.2f", name, medianF(j.tput)/medianF(f.tput), medianF(j.p99)/medianF(f.p99))
	}
	assert.Greater(t, medianF(got["jitter"].tput), medianF(got["fixed"].tput)/2, "jitter's throughput is not far below fixed's")
}

func medianF(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func medianRangeText(v []float64) string {
	return fmt.Sprintf("%.0f [%.0f–%.0f]", medianF(v), slices.Min(v), slices.Max(v))
}

// TestRetryStopsAtDeadline: a row another session holds makes every attempt fail with 55P03 (FOR
// UPDATE NOWAIT), retried here on request; RetryTx returns before ctx's deadline, without a pause
// that crosses it, with an error that matches context.DeadlineExceeded and 55P03, every attempt's
// lease back in its lane and no goroutine left behind. A ctx cancelled during a pause returns at
// once, with a *RetryError whose reason is the cancel.
func TestRetryStopsAtDeadline(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dsn := newBank(t, 2)
	p, err := pgxlanes.New(context.Background(), withParams(dsn, "pool_max_conns=4"))
	require.NoError(t, err)
	defer p.Close()
	holder, err := pgx.Connect(context.Background(), dsn)
	require.NoError(t, err)
	defer holder.Close(context.Background())
	_, err = holder.Exec(context.Background(), `begin; select 1 from accounts where id = 1 for update`)
	require.NoError(t, err)

	// The pauses are their bounds (Rand returns n-1): 0.5 s, 1 s, then 2 s, which would cross
	// the deadline at 3 s, so RetryTx gives up at a pause, about 1.5 s in, whatever the machine's
	// load. With random pauses the deadline can instead end inside an attempt (a pause that ends
	// 1 ms before it), and that attempt's own error is returned, as RetryTx documents.
	o := pgxlanes.RetryOptions{RetryCodes: append(pgxlanes.DefaultRetryCodes(), "55P03"), MaxAttempts: 1000,
		BaseDelay: 500 * time.Millisecond, MaxDelay: 5 * time.Second, Rand: func(n int64) int64 { return n - 1 }}
	lockRow := func(ctx context.Context) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `select 1 from accounts where id = 1 for update nowait`)
			return err
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	err = o.RetryTx(ctx, p, pgx.TxOptions{}, lockRow(ctx))
	returned := time.Now()
	var re *pgxlanes.RetryError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, pgxlanes.RetryReasonDeadline, re.Reason)
	assert.Equal(t, "55P03", re.Code)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "55P03", pe.Code)
	assert.GreaterOrEqual(t, re.Attempts, 2)
	// A pause that crossed the deadline would end at it, when ctx does: the call returns before.
	assert.True(t, returned.Before(deadline), "returned %v after the deadline", returned.Sub(deadline))
	t.Logf("%d attempts; returned %v before the deadline", re.Attempts, deadline.Sub(returned).Round(time.Millisecond))
	assert.Equal(t, int64(re.Attempts), p.Stat().Lane(pgxlanes.Tx).Acquires, "each attempt a lease of its own")
	lanesIdle(t, p, "after the deadline")

	// Cancelled during a pause of 1 s: returns at once. The cancel comes once the first attempt's
	// lease is back (its acquire counted, nothing in use): in the pause, whatever the load. A
	// cancel at a fixed time could land inside a slow first attempt, whose own error RetryTx
	// then returns as it is.
	o.BaseDelay, o.MaxDelay = time.Second, time.Second
	cctx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	before := p.Stat().Lane(pgxlanes.Tx).Acquires
	cancelled := make(chan time.Time, 1)
	go func() {
		for cctx.Err() == nil {
			if ls := p.Stat().Lane(pgxlanes.Tx); ls.Acquires == before+1 && ls.InUse == 0 {
				cancelled <- time.Now()
				ccancel()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	err = o.RetryTx(cctx, p, pgx.TxOptions{}, lockRow(cctx))
	returned = time.Now()
	var ce *pgxlanes.RetryError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, pgxlanes.RetryReasonCanceled, ce.Reason)
	assert.Equal(t, 1, ce.Attempts)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, pgxlanes.ErrRetryGaveUp)
	select {
	case at := <-cancelled:
		// The pause had 1 s to run: returning within half of it is returning at the cancel.
		assert.Less(t, returned.Sub(at), 500*time.Millisecond, "returned at the cancel, not at the pause's end")
	default:
		t.Fatal("RetryTx returned before the first attempt's lease was back")
	}
	lanesIdle(t, p, "after the cancel")
	_, err = holder.Exec(context.Background(), `rollback`)
	require.NoError(t, err)
}

// TestRetryCommitTerminatedIsUnknown: the backend is terminated while COMMIT runs (in a deferred
// trigger, so after the transaction's work and before its answer). Commit says the outcome is
// unknown, though the error it wraps is a server's (FATAL 57P01); RetryTx must then report
// ErrRetryCommitUnknown after one attempt, with the default codes and with 57P01 listed as
// retryable (a common addition for fail-overs), and never run the transaction again.
func TestRetryCommitTerminatedIsUnknown(t *testing.T) {
	bg := context.Background()
	dsn := newDB(t, 1)
	admin, err := pgx.Connect(bg, dsn)
	require.NoError(t, err)
	defer admin.Close(bg)
	for _, q := range []string{
		`create table events (id serial primary key, v int)`,
		`create function slow_commit() returns trigger language plpgsql as $$ begin if new.v = 1 then perform pg_sleep(2); end if; return null; end $$`,
		`create constraint trigger slow_commit after insert on events deferrable initially deferred for each row execute function slow_commit()`,
	} {
		_, err := admin.Exec(bg, q)
		require.NoError(t, err)
	}
	p := newLanes(t, dsn, "")

	// terminateDuringCommit ends backend pid once it runs the COMMIT's deferred trigger; wait
	// waits for that to be done (admin is one connection).
	var wg sync.WaitGroup
	wait := wg.Wait
	terminateDuringCommit := func(t *testing.T, pid uint32) {
		wg.Go(func() {
			assert.EventuallyWithT(t, func(c *assert.CollectT) {
				var n int
				assert.NoError(c, admin.QueryRow(bg, `select count(*) from pg_stat_activity where pid = $1 and wait_event = 'PgSleep'`, int32(pid)).Scan(&n))
				assert.Equal(c, 1, n)
			}, 10*time.Second, 10*time.Millisecond)
			_, _ = admin.Exec(bg, "select pg_terminate_backend($1)", int32(pid))
		})
	}

	t.Run("Commit", func(t *testing.T) {
		tx, err := p.Begin(bg)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(bg) }()
		_, err = tx.Exec(bg, "insert into events (v) values (1)")
		require.NoError(t, err)
		terminateDuringCommit(t, tx.Conn().PgConn().PID())
		err = tx.Commit(bg)
		wait()
		t.Logf("Commit: %v", err)
		require.ErrorIs(t, err, pgxlanes.ErrCommitOutcomeUnknown)
	})
	// pgxpool beside: pgx's Commit returns the server's FATAL as it is, which RetryTx must not
	// take for an answer (with 57P01 listed it retried before).
	pp := newPgxpool(t, dsn, "")
	for _, tc := range []struct {
		name  string
		db    pgxlanes.Beginner
		codes []string
	}{
		{"default codes", p, nil},
		{"57P01 listed", p, append(pgxlanes.DefaultRetryCodes(), "57P01")},
		{"pgxpool/default codes", pp, nil},
		{"pgxpool/57P01 listed", pp, append(pgxlanes.DefaultRetryCodes(), "57P01")},
	} {
		t.Run("RetryTx/"+tc.name, func(t *testing.T) {
			attempts := 0
			err := pgxlanes.RetryOptions{RetryCodes: tc.codes}.RetryTx(bg, tc.db, pgx.TxOptions{}, func(tx pgx.Tx) error {
				attempts++
				if _, err := tx.Exec(bg, "insert into events (v) values ($1)", attempts); err != nil {
					return err
				}
				if attempts == 1 {
					terminateDuringCommit(t, tx.Conn().PgConn().PID())
				}
				return nil
			})
			wait()
			t.Logf("RetryTx: %v after %d attempt(s)", err, attempts)
			assert.Equal(t, 1, attempts, "a transaction whose COMMIT's outcome is unknown ran again")
			var re *pgxlanes.RetryError
			require.ErrorAs(t, err, &re)
			assert.ErrorIs(t, err, pgxlanes.ErrRetryCommitUnknown)
			assert.Equal(t, pgxlanes.RetryReasonUnknown, re.Reason)
		})
	}
}
