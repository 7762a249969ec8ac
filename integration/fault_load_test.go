package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// The fault suite's mixed load and the invariants checked after each fault (issue 12).
//
// Load: lookups on Short (QueryRow), transactions on Tx that insert two rows under one fresh id,
// and Long work (WithLane(ctx, Long)). Every call runs under a deadline of its own.
//
// After each fault:
//   - every transaction whose Commit returned nil has both its rows (0 acknowledged commits lost);
//     no id has one row of two (nothing half-applied); no transaction that failed before its
//     Commit is present. A transaction whose Commit itself failed may be present: the server may
//     have committed before the link broke. Those are counted as "ambiguous".
//   - no call overran its deadline, nor an acquire its lane's acquire timeout, by more than
//     faultSlack;
//   - every error is typed: see errKind;
//   - every lane is back to 0 in use at quiescence, pgxpool's acquired count too;
//   - goleak is clean after Close.

// faultSlack is how far past its deadline or acquire timeout a call may return. Generous: the
// machine is shared and -race slows everything.
const faultSlack = 2 * time.Second

// The deadlines of the load's calls.
const (
	shortDeadline = 2 * time.Second
	txDeadline    = 5 * time.Second
	longDeadline  = 8 * time.Second
)

// faultParams are the pool's settings under the fault suite's load.
const faultParams = "pool_max_conns=8&lane_tx_acquire_timeout=2s&lane_long_acquire_timeout=3s"

// stressDuration is PGXLANES_STRESS as a duration, 0 if unset.
func stressDuration(t testing.TB) time.Duration {
	t.Helper()
	v := os.Getenv("PGXLANES_STRESS")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "PGXLANES_STRESS=%q", v)
	return d
}

// createFaultTable creates the table the load's transactions insert into.
func createFaultTable(t testing.TB, dsn string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `create table if not exists fault_tx (id bigint, part int, primary key (id, part));
		create table if not exists items (id int primary key, v int not null);
		insert into items select g, g from generate_series(1, 100) g on conflict do nothing`)
	require.NoError(t, err)
}

// errKind classifies an error of the load. Every kind but "untyped" is one a caller can act on:
//   - acquire_timeout, lane_full, closed, budget, commit_unknown: the pgxlanes sentinels
//     (errors.Is; commit_unknown: the connection was lost during COMMIT, which may have
//     committed: the accounting counts those commits as ambiguous);
//   - deadline, canceled: the call's own context (errors.Is on its ctx error);
//   - server_<SQLSTATE>: a *pgconn.PgError of class 08 (connection exception), 53 (insufficient
//     resources: 53300 too many connections) or 57 (operator intervention: 57P01 admin shutdown,
//     57P02 crash shutdown, 57P03 cannot connect now, 57014 query canceled);
//   - connect_failed: a new connection could not be opened (*pgconn.ConnectError: refused, reset
//     or timed out while the server was down);
//   - conn_lost, the connection error class: the link or the session is gone. A net.Error,
//     io.EOF or io.ErrUnexpectedEOF, ECONNRESET,
//     ECONNREFUSED or EPIPE, or an error pgconn.SafeToRetry accepts (a closed connection: the
//     request was never sent).
func errKind(err error) string {
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, pgxlanes.ErrAcquireTimeout):
		return "acquire_timeout"
	case errors.Is(err, pgxlanes.ErrLaneFull):
		return "lane_full"
	case errors.Is(err, pgxlanes.ErrClosed):
		return "closed"
	case errors.Is(err, pgxlanes.ErrCommitOutcomeUnknown):
		return "commit_unknown"
	case errors.Is(err, pgxlanes.ErrBudgetExceeded):
		return "budget"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &pgErr):
		switch pgErr.Code[:2] {
		case "08", "53", "57":
			return "server_" + pgErr.Code
		}
		return "untyped"
	case errors.As(err, &connErr):
		return "connect_failed"
	case errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE),
		pgconn.SafeToRetry(err):
		return "conn_lost"
	}
	return "untyped"
}

// faultIDs numbers the load's transactions across every test of the package, so that loads
// that share a table never insert the same id.
var faultIDs atomic.Int64

// faultLoad runs the mixed load against a pool and records what it saw.
type faultLoad struct {
	p       *pgxlanes.Pool
	acquire [3]time.Duration // the lanes' acquire timeouts
	quiet   bool             // log no figures (the repeated cycles of a stress run)

	ops  atomic.Int64
	stop chan struct{}
	wg   sync.WaitGroup

	mu           sync.Mutex
	acked        map[int64]bool // Commit returned nil
	failedBefore map[int64]bool // failed before Commit was called
	failedCommit map[int64]bool // Commit returned an error
	kinds        map[string]int // "op kind" -> count, errors only
	untyped      []string
	overruns     []string
	maxOverrun   time.Duration
}

func newFaultLoad(p *pgxlanes.Pool) *faultLoad {
	l := &faultLoad{p: p, acked: map[int64]bool{}, failedBefore: map[int64]bool{}, failedCommit: map[int64]bool{},
		kinds: map[string]int{}}
	for _, ln := range pgxlanes.Lanes() {
		l.acquire[ln] = p.Config().Lane(ln).AcquireTimeout
	}
	return l
}

// start runs 3 lookup, 3 transaction and 1 Long worker until stopLoad.
func (l *faultLoad) start() {
	l.stop = make(chan struct{})
	run := func(f func()) {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				f()
				l.ops.Add(1)
				time.Sleep(2 * time.Millisecond) // pacing, so that the 2 cores also serve the server
			}
		}()
	}
	for range 3 {
		run(l.lookup)
		run(func() { l.transaction() })
	}
	run(l.long)
}

// stopLoad stops the workers and waits for them.
func (l *faultLoad) stopLoad() {
	close(l.stop)
	l.wg.Wait()
}

// timed runs f under a deadline and records its error kind and any overrun: past the deadline,
// or past the lane's acquire timeout for an acquire that timed out.
func (l *faultLoad) timed(op string, lane pgxlanes.Lane, d time.Duration, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	l.record(op, lane, d, time.Since(start), err)
	return err
}

func (l *faultLoad) record(op string, lane pgxlanes.Lane, deadline, took time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	bound := deadline
	if errors.Is(err, pgxlanes.ErrAcquireTimeout) && l.acquire[lane] > 0 {
		bound = min(bound, l.acquire[lane])
	}
	if over := took - bound; over > 0 {
		l.maxOverrun = max(l.maxOverrun, over)
		if over > faultSlack {
			l.overruns = append(l.overruns, fmt.Sprintf("%s took %v, bound %v: %v", op, took, bound, err))
		}
	}
	if err == nil {
		return
	}
	k := errKind(err)
	l.kinds[op+" "+k]++
	if k == "untyped" && len(l.untyped) < 10 {
		l.untyped = append(l.untyped, fmt.Sprintf("%s: %T: %v", op, err, err))
	}
}

func (l *faultLoad) lookup() {
	_ = l.timed("lookup", pgxlanes.Short, shortDeadline, func(ctx context.Context) error {
		return l.p.QueryRow(ctx, "select v from items where id = $1", 1+l.ops.Load()%100).Scan(new(int))
	})
}

func (l *faultLoad) long() {
	_ = l.timed("long", pgxlanes.Long, longDeadline, func(ctx context.Context) error {
		_, err := l.p.Exec(pgxlanes.WithLane(ctx, pgxlanes.Long), "select pg_sleep(0.2), count(*) from items")
		return err
	})
}

// transaction inserts the rows (id, 1) and (id, 2) for a fresh id and commits, and records the
// id by outcome. It reports whether the Commit was acknowledged.
func (l *faultLoad) transaction() bool {
	id := faultIDs.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), txDeadline)
	defer cancel()
	start := time.Now()
	tx, err := l.p.Begin(ctx)
	l.record("begin", pgxlanes.Tx, txDeadline, time.Since(start), err)
	if err != nil {
		l.outcome(l.failedBefore, id)
		return false
	}
	for part := 1; part <= 2 && err == nil; part++ {
		_, err = tx.Exec(ctx, "insert into fault_tx (id, part) values ($1, $2)", id, part)
	}
	if err != nil {
		l.record("insert", pgxlanes.Tx, txDeadline, time.Since(start), err)
		l.outcome(l.failedBefore, id)
		rstart := time.Now()
		rerr := tx.Rollback(context.Background()) // bounded by the lease: it must return at once
		l.record("rollback", pgxlanes.Tx, time.Second, time.Since(rstart), rerr)
		return false
	}
	err = tx.Commit(ctx)
	l.record("commit", pgxlanes.Tx, txDeadline, time.Since(start), err)
	if err != nil {
		l.outcome(l.failedCommit, id)
		return false
	}
	l.outcome(l.acked, id)
	return true
}

func (l *faultLoad) outcome(m map[int64]bool, id int64) {
	l.mu.Lock()
	m[id] = true
	l.mu.Unlock()
}

func (l *faultLoad) ackedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// waitAcked waits until n more commits were acknowledged.
func (l *faultLoad) waitAcked(t testing.TB, n int, within time.Duration, what string) {
	t.Helper()
	want := l.ackedCount() + n
	pgserver.Eventually(t, within, what, func() bool { return l.ackedCount() >= want })
}

// recovered polls until a lookup and a transaction succeed again, and returns how long after
// from each first did.
func (l *faultLoad) recovered(t testing.TB, from time.Time) (lookup, tx time.Duration) {
	t.Helper()
	pgserver.Eventually(t, 30*time.Second, "a lookup succeeds after the fault", func() bool {
		return l.timed("probe", pgxlanes.Short, shortDeadline, func(ctx context.Context) error {
			return l.p.QueryRow(ctx, "select 1").Scan(new(int))
		}) == nil
	})
	lookup = time.Since(from)
	pgserver.Eventually(t, 30*time.Second, "a transaction commits after the fault", l.transaction)
	return lookup, time.Since(from)
}

// errorKinds sums the recorded errors by kind.
func (l *faultLoad) errorKinds() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, n := range l.kinds {
		_, kind, _ := strings.Cut(k, " ")
		out[kind] += n
	}
	return out
}

// checkCalls asserts the per-call invariants: no overrun past the slack, no untyped error.
func (l *faultLoad) checkCalls(t testing.TB, name string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var ops []string
	for _, k := range slices.Sorted(maps.Keys(l.kinds)) {
		ops = append(ops, fmt.Sprintf("%s=%d", k, l.kinds[k]))
	}
	t.Logf("%s: %d operations; errors by call and kind: %s", name, l.ops.Load(), strings.Join(ops, ", "))
	assert.Empty(t, l.overruns, "calls that overran their deadline or acquire timeout by more than %v", faultSlack)
	assert.Empty(t, l.untyped, "errors of no known kind")
	l.figure(t, "fault_"+name+"_max_overrun_ms", float64(l.maxOverrun.Milliseconds()))
}

// checkRows asserts the commit invariants against the table, read over a direct connection to
// dsn, and logs the figures. It returns the number of acknowledged commits.
func (l *faultLoad) checkRows(t testing.TB, name, dsn string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var conn *pgx.Conn
	// The server frees a closed session's slot a moment after the client left.
	pgserver.Eventually(t, 20*time.Second, "a connection for the check", func() bool {
		var err error
		conn, err = pgx.Connect(ctx, dsn)
		return err == nil
	})
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "select id, count(*) from fault_tx group by id")
	require.NoError(t, err)
	present := map[int64]int{}
	for rows.Next() {
		var id, n int64
		require.NoError(t, rows.Scan(&id, &n))
		present[id] = int(n)
	}
	require.NoError(t, rows.Err())

	l.mu.Lock()
	defer l.mu.Unlock()
	lost, half, phantom, ambiguous := 0, 0, 0, 0
	for id, n := range present {
		if n != 2 {
			half++ // whichever load inserted it
		}
		switch {
		case l.failedBefore[id]:
			phantom++
		case l.failedCommit[id]:
			ambiguous++
		}
	}
	for id := range l.acked {
		if present[id] != 2 {
			lost++
		}
	}
	t.Logf("%s: %d commits acknowledged, %d lost; %d failed before Commit, %d present; %d failed at Commit, %d of them committed (ambiguous); %d half-applied",
		name, len(l.acked), lost, len(l.failedBefore), phantom, len(l.failedCommit), ambiguous, half)
	l.figure(t, "fault_"+name+"_commits_acked", float64(len(l.acked)))
	l.figure(t, "fault_"+name+"_commits_lost", float64(lost))
	l.figure(t, "fault_"+name+"_commits_ambiguous", float64(ambiguous))
	assert.Zero(t, lost, "acknowledged commits lost")
	assert.Zero(t, half, "transactions half-applied")
	assert.Zero(t, phantom, "transactions that failed before Commit but are present")
	assert.NotZero(t, len(l.acked), "the load committed nothing: the test proves nothing")
	return len(l.acked)
}

// figure logs a figure unless the load is quiet.
func (l *faultLoad) figure(t testing.TB, name string, v float64) {
	t.Helper()
	if !l.quiet {
		figure(t, name, v)
	}
}

// logKinds logs the errors by kind as figures.
func (l *faultLoad) logKinds(t testing.TB, name string) {
	t.Helper()
	kinds := l.errorKinds()
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		l.figure(t, "fault_"+name+"_errors_"+k, float64(kinds[k]))
	}
}
