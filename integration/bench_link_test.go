package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgxlanes/pgxlanes/internal/faultproxy"
	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// linkPool is what BenchmarkOverLink needs of a pool: a held connection and a transaction.
type linkPool interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	held(ctx context.Context) (exec func(context.Context, string) error, release func(), err error)
	totalConns() int32
}

type linkPgxpool struct{ *pgxpool.Pool }

func (p linkPgxpool) held(ctx context.Context) (func(context.Context, string) error, func(), error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, sql string) error { _, err := c.Exec(ctx, sql); return err }, c.Release, nil
}

func (p linkPgxpool) totalConns() int32 { return p.Stat().TotalConns() }

type linkLanes struct{ *pgxlanes.Pool }

func (p linkLanes) totalConns() int32 { return p.Stat().TotalConns() }

func (p linkLanes) held(ctx context.Context) (func(context.Context, string) error, func(), error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, sql string) error { _, err := c.Exec(ctx, sql); return err }, c.Release, nil
}

// BenchmarkOverLink measures a held connection (Acquire + Exec + Release, on the Tx lane whose
// timeouts differ from the session defaults) and a one-statement transaction through a proxy
// that adds 1 ms each way, as a link to a database in another zone would: the cost is round trips.
// Compare with benchstat -col /Impl. Run with -benchtime 300x: each op takes milliseconds.
func BenchmarkOverLink(b *testing.B) {
	proxy := pgserver.NewProxy(b, newDB(b, 1))
	if err := proxy.SetLatency(faultproxy.Both, time.Millisecond); err != nil {
		b.Fatal(err)
	}
	bg := context.Background()
	impls := []struct {
		name string
		open func() linkPool
	}{
		{"pgxpool", func() linkPool {
			p := newPgxpool(b, proxy.DSN(), "pool_max_conns=4&pool_min_conns=4")
			return linkPgxpool{p}
		}},
		{"pgxlanes", func() linkPool {
			p := newLanes(b, proxy.DSN(), "pool_max_conns=4&pool_min_conns=4")
			return linkLanes{p}
		}},
	}
	for _, kind := range []string{"held", "tx"} {
		for _, impl := range impls {
			b.Run("Kind="+kind+"/Impl="+impl.name, func(b *testing.B) {
				p := impl.open()
				op := func() error {
					if kind == "tx" {
						return pgx.BeginFunc(bg, p, func(tx pgx.Tx) error { _, err := tx.Exec(bg, "select 1"); return err })
					}
					exec, release, err := p.held(bg)
					if err != nil {
						return err
					}
					defer release()
					return exec(bg, "select 1")
				}
				// Warm: every connection open (over the slow link, in the background), statements
				// prepared, settings applied.
				pgserver.Eventually(b, 30*time.Second, "min conns open", func() bool { return p.totalConns() >= 4 })
				for range 3 {
					if err := op(); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				for b.Loop() {
					if err := op(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
