package integration

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestRestartErrorsBeside: a pg_ctl restart -m fast under light load, with pgxpool and pgxlanes
// running the same load beside each other against the same server: 4 goroutines per pool each
// running a lookup every 5 ms. It logs the errors each pool returned, by kind (errKind), and how
// long each took to serve again; it checks that pgxlanes returns no more errors in all than
// pgxpool plus a margin, and no untyped error.
func TestRestartErrorsBeside(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a server")
	}
	srv := pgserver.NewLocal(t, pgserver.Options{})
	ctx := context.Background()
	pp, err := pgxpool.New(ctx, withParams(srv.DSN(), "pool_max_conns=5"))
	require.NoError(t, err)
	defer pp.Close()
	lp, err := pgxlanes.New(ctx, withParams(srv.DSN(), "pool_max_conns=5"))
	require.NoError(t, err)
	defer lp.Close()

	type tally struct {
		mu        sync.Mutex
		kinds     map[string]int
		lastFail  time.Time
		firstFail time.Time
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	load := func(tl *tally, q func(context.Context) error) {
		tl.kinds = map[string]int{}
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					c, cancel := context.WithTimeout(ctx, 2*time.Second)
					err := q(c)
					cancel()
					tl.mu.Lock()
					k := errKind(err)
					tl.kinds[k]++
					if err != nil {
						if tl.firstFail.IsZero() {
							tl.firstFail = time.Now()
						}
						tl.lastFail = time.Now()
					}
					tl.mu.Unlock()
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
	}
	var pt, lt tally
	load(&pt, func(c context.Context) error {
		var one int
		return pp.QueryRow(c, "select 1").Scan(&one)
	})
	load(&lt, func(c context.Context) error {
		var one int
		return lp.QueryRow(c, "select 1").Scan(&one)
	})
	time.Sleep(time.Second)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	st, err := srv.Restart(rctx, pgserver.StopFast)
	cancel()
	require.NoError(t, err)
	time.Sleep(3 * time.Second)
	stop.Store(true)
	wg.Wait()
	errs := func(tl *tally) int {
		n := 0
		for k, v := range tl.kinds {
			if k != "ok" {
				n += v
			}
		}
		return n
	}
	t.Logf("server down %v", st.Down)
	t.Logf("pgxpool:  %d errors %v, failing for %v", errs(&pt), pt.kinds, pt.lastFail.Sub(pt.firstFail).Round(time.Millisecond))
	t.Logf("pgxlanes: %d errors %v, failing for %v", errs(&lt), lt.kinds, lt.lastFail.Sub(lt.firstFail).Round(time.Millisecond))
	figure(t, "restart_errors_pgxpool", float64(errs(&pt)))
	figure(t, "restart_errors_pgxlanes", float64(errs(&lt)))
	require.Zero(t, lt.kinds["untyped"], "every pgxlanes error is typed")
	require.LessOrEqual(t, errs(&lt), errs(&pt)+errs(&pt)/4+8, "pgxlanes returns no more errors than pgxpool (with a margin for the noise of one run)")
}
