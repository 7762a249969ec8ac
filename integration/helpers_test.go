package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// withParams appends query parameters to a URL DSN.
func withParams(dsn, params string) string {
	if params == "" {
		return dsn
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&" + params
	}
	return dsn + "?" + params
}

// newDB returns the DSN of a fresh database with a table items(id, v) of n rows.
func newDB(t testing.TB, n int) string {
	t.Helper()
	dsn := pgserver.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `create table items (id int primary key, v int not null)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `insert into items select g, g from generate_series(1, $1::int) g`, n); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// behindProxy is the set-up of a test that stalls a pool's link: goleak checked once the test and
// its clean-ups are done, a fresh database (newDB with 1 row), an admin connection to it that
// does not go through the proxy, and a proxy in front of it whose link is back to normal at the
// end. The pool under test connects to proxy.DSN().
func behindProxy(t *testing.T) (admin *pgx.Conn, proxy *pgserver.Proxy) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	bg := context.Background()
	dsn := newDB(t, 1)
	admin, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(bg) })
	proxy = pgserver.NewProxy(t, dsn)
	t.Cleanup(func() {
		if err := proxy.Normal(); err != nil {
			t.Error(err)
		}
	})
	return admin, proxy
}

func newLanes(t testing.TB, dsn, params string) *pgxlanes.Pool {
	t.Helper()
	p, err := pgxlanes.New(context.Background(), withParams(dsn, params))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func newPgxpool(t testing.TB, dsn, params string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), withParams(dsn, params))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// latencies collects durations from many goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// quantile returns the q-quantile (0..1) and the count.
func (l *latencies) quantile(q float64) (time.Duration, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0, 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))], len(s)
}

func (l *latencies) max() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	return slices.Max(l.d)
}

// waitObserver records acquire waits per lane through the pgxlanes.Observer hook.
type waitObserver struct {
	waits [3]latencies
}

func (o *waitObserver) ObserveAcquire(e pgxlanes.AcquireEvent) {
	if e.Err == nil {
		o.waits[e.Lane].add(e.Wait)
	}
}
func (o *waitObserver) ObserveRelease(pgxlanes.ReleaseEvent) {}

// sessions returns pg_stat_database.sessions for the database of dsn once it has settled: the
// counter is flushed by backends with a delay, so it is read until two reads agree.
func sessions(t testing.TB, dsn string) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgserver.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var last int64 = -1
	for range 50 {
		var n int64
		if _, err := conn.Exec(ctx, "select pg_stat_clear_snapshot()"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "select sessions from pg_stat_database where datname = $1", cfg.Database).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == last {
			return n
		}
		last = n
		time.Sleep(600 * time.Millisecond)
	}
	t.Fatalf("pg_stat_database.sessions did not settle")
	return 0
}

// lanesIdle fails t unless no lane holds a slot or has a waiter, and pgxpool has no connection
// acquired. pgxpool destroys a broken connection in the background and counts it as acquired
// until then, so its count is given a moment to settle; the lanes' count must be exact at once.
// lanesIdle checks that every lane is back to zero. A connection whose request was interrupted
// keeps its slot while it is cleaned (at most Config.CancelGrace), so the check waits that long.
func lanesIdle(t testing.TB, p *pgxlanes.Pool, when string) {
	t.Helper()
	pgserver.Eventually(t, p.Config().CancelGrace+2*time.Second, when+": every lane idle", func() bool {
		st := p.Stat()
		for _, l := range pgxlanes.Lanes() {
			if ls := st.Lane(l); ls.InUse != 0 || ls.Waiting != 0 || ls.Cleaning != 0 {
				return false
			}
		}
		return true
	})
	pgserver.Eventually(t, 2*time.Second, when+": no connection acquired from pgxpool", func() bool {
		return p.Stat().AcquiredConns() == 0
	})
}

func fmtDur(d time.Duration) string { return fmt.Sprint(d.Round(10 * time.Microsecond)) }

func itoa(n int) string { return fmt.Sprint(n) }

// sharedDSN is the DSN of the shared server's own database, for out-of-band checks.
func sharedDSN(t testing.TB) string { return pgserver.DSN(t) }

// figure logs a figure for docs/figures.sh, which runs the tests that measure the figures in README
// and docs several times and reports each as a median with its range: "figure: <name> <value>".
func figure(t testing.TB, name string, v float64) {
	t.Helper()
	t.Logf("figure: %s %g", name, v)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadavg is the machine's load average over 1, 5 and 15 minutes, for the figures a test logs.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
