package integration

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
)

// benchDeadline is the deadline of BenchmarkDeadline's calls: issue 11's 50 ms.
const benchDeadline = 50 * time.Millisecond

// BenchmarkDeadline runs `select pg_sleep(1)` under a 50 ms deadline through pgxpool and
// pgxlanes, one call at a time. Every call must fail with errors.Is(err, ctx.Err()). It reports
// how long after the deadline the caller got control back (overshoot-ms, the mean, and
// p50-overshoot-ms), and the new server sessions the deadlines cost, per 100 (pgxpool closes the
// connection of each, pgxlanes cleans and keeps it). ns/op is about the deadline plus the
// overshoot. The goal is an overshoot within 5 ms on loopback and at most 3 new sessions per 100
// deadlines; run with -benchtime 100x so that the sessions are counted over 100 deadlines, and
// compare the implementations with benchstat -col /Impl.
func BenchmarkDeadline(b *testing.B) {
	impls := []struct {
		name string
		open func(tb testing.TB, dsn string) func(context.Context) error
	}{
		{"pgxpool", func(tb testing.TB, dsn string) func(context.Context) error {
			p := newPgxpool(tb, dsn, "pool_max_conns=4")
			if err := p.Ping(context.Background()); err != nil {
				tb.Fatal(err)
			}
			return func(ctx context.Context) error { _, err := p.Exec(ctx, "select pg_sleep(1)"); return err }
		}},
		{"pgxlanes", func(tb testing.TB, dsn string) func(context.Context) error {
			p := newLanes(tb, dsn, "pool_max_conns=4")
			if err := p.Ping(context.Background()); err != nil {
				tb.Fatal(err)
			}
			return func(ctx context.Context) error { _, err := p.Exec(ctx, "select pg_sleep(1)"); return err }
		}},
	}
	for _, impl := range impls {
		// One database per implementation: pg_stat_database.sessions counts its sessions.
		dsn := pgserver.NewDatabase(b)
		b.Run("Impl="+impl.name, func(b *testing.B) {
			exec := impl.open(b, dsn)
			before := sessions(b, dsn)
			over := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), benchDeadline)
				start := time.Now()
				err := exec(ctx)
				took := time.Since(start)
				if !errors.Is(err, ctx.Err()) || ctx.Err() == nil {
					cancel()
					b.Fatalf("call %d: %v after %v; want the context's error at the deadline", i, err, took)
				}
				cancel()
				over = append(over, took-benchDeadline)
			}
			b.StopTimer()
			newSessions := sessions(b, dsn) - before
			var sum time.Duration
			for _, d := range over {
				sum += d
			}
			slices.Sort(over)
			b.ReportMetric(ms(sum/time.Duration(len(over))), "overshoot-ms")
			b.ReportMetric(ms(over[len(over)/2]), "p50-overshoot-ms")
			b.ReportMetric(float64(newSessions)*100/float64(b.N), "new-sessions/100")
		})
	}
}
