package stdlib_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	pgxstdlib "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
	"github.com/pgxlanes/pgxlanes/stdlib"
)

// BenchmarkQueryRow compares a lookup and a short transaction through database/sql on pgxlanes
// (a lease per call) with pgx's stdlib on a pgxpool of the same size (the baseline).
func BenchmarkQueryRow(b *testing.B) {
	ctx := context.Background()
	dsn := withParams(pgserver.NewDatabase(b), "pool_max_conns=8")
	lanesPool, err := pgxlanes.New(ctx, dsn)
	require.NoError(b, err)
	defer lanesPool.Close()
	plainPool, err := pgxpool.New(ctx, dsn)
	require.NoError(b, err)
	defer plainPool.Close()
	dbs := []struct {
		name string
		db   *sql.DB
	}{{"pgx", pgxstdlib.OpenDBFromPool(plainPool)}, {"pgxlanes", stdlib.OpenDBFromPool(lanesPool)}}
	// The same lookup on *pgxlanes.Pool without database/sql: what the bridge adds.
	b.Run("Op=QueryRow/Driver=pgxlanes-direct/Clients=1", func(b *testing.B) {
		var n int
		for b.Loop() {
			require.NoError(b, lanesPool.QueryRow(ctx, "select $1::int", 1).Scan(&n))
		}
	})
	for _, d := range dbs {
		defer d.db.Close()
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("Op=QueryRow/Driver=%s/Clients=%d", d.name, clients), func(b *testing.B) {
				clientsLoop(b, clients, func() error {
					var n int
					return d.db.QueryRowContext(ctx, "select $1::int", 1).Scan(&n)
				})
			})
		}
		b.Run(fmt.Sprintf("Op=Tx/Driver=%s/Clients=1", d.name), func(b *testing.B) {
			var n int
			for b.Loop() {
				tx, err := d.db.BeginTx(ctx, nil)
				require.NoError(b, err)
				require.NoError(b, tx.QueryRowContext(ctx, "select $1::int", 1).Scan(&n))
				require.NoError(b, tx.Commit())
			}
		})
	}
}

// clientsLoop runs f b.N times in all, from the given number of goroutines.
func clientsLoop(b *testing.B, clients int, f func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := f(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
