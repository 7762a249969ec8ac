package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/internal/pgserver"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestLongOnAReplica: with Long aimed at another server (a read replica stand-in), reports land
// there and lookups on the primary; each server's sessions stay within its own sizing; the lane
// keeps its timeouts, budget and guard there.
func TestLongOnAReplica(t *testing.T) {
	bg := context.Background()
	primaryDSN := newDB(t, 10)
	replica := pgserver.NewLocal(t, pgserver.Options{})
	cfg, err := pgxlanes.ParseConfig(withParams(primaryDSN, "pool_max_conns=4"))
	require.NoError(t, err)
	rc, err := pgxpool.ParseConfig(withParams(replica.DSN(), "pool_max_conns=2"))
	require.NoError(t, err)
	cfg.Long.Server = rc
	cfg.Long.OverBudget = pgxlanes.ActionCancel
	p, err := pgxlanes.NewWithConfig(bg, cfg)
	require.NoError(t, err)
	defer p.Close()

	port := func(ctx context.Context) string {
		var s string
		require.NoError(t, p.QueryRow(ctx, "select current_setting('port')").Scan(&s))
		return s
	}
	long := pgxlanes.WithLane(bg, pgxlanes.Long)
	assert.Equal(t, itoa(replica.Port()), port(long), "a report lands on the replica")
	assert.NotEqual(t, itoa(replica.Port()), port(bg), "a lookup lands on the primary")
	resolved := p.Config()
	assert.Equal(t, 2, resolved.Long.MaxConns, "Long is sized by the replica's pool")
	assert.Equal(t, time.Duration(pgxlanes.Off), resolved.Short.SlowThreshold, "no learning while Long is elsewhere")

	// Load on both: 6 reports (Long holds at most 2) and 8 lookup clients (the primary holds 4).
	var wg sync.WaitGroup
	stop := time.Now().Add(1500 * time.Millisecond)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				_, err := p.Exec(long, "select pg_sleep(0.05)")
				assert.NoError(t, err)
			}
		}()
	}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				assert.NoError(t, p.QueryRow(bg, "select v from items where id = 1").Scan(new(int)))
			}
		}()
	}
	var peakReplica, peakPrimary int
	sampler, err := pgx.Connect(bg, replica.DSN())
	require.NoError(t, err)
	defer sampler.Close(bg)
	primarySampler, err := pgx.Connect(bg, primaryDSN)
	require.NoError(t, err)
	defer primarySampler.Close(bg)
	count := func(c *pgx.Conn) int {
		var n int
		require.NoError(t, c.QueryRow(bg, `select count(*) from pg_stat_activity where backend_type = 'client backend'
			and pid <> pg_backend_pid() and application_name <> 'pgxlanes guard' and datname = current_database()`).Scan(&n))
		return n
	}
	for time.Now().Before(stop) {
		peakReplica = max(peakReplica, count(sampler))
		peakPrimary = max(peakPrimary, count(primarySampler))
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("peak sessions: replica %d (Long's cap 2), primary %d (pool 4)", peakReplica, peakPrimary)
	assert.LessOrEqual(t, peakReplica, 2)
	assert.LessOrEqual(t, peakPrimary, 4)
	assert.Greater(t, peakReplica, 0)

	// The guard acts on the replica: a report over its budget is cancelled there.
	_, err = p.Exec(pgxlanes.WithBudget(long, 400*time.Millisecond), "select pg_sleep(5)")
	require.ErrorIs(t, err, pgxlanes.ErrBudgetExceeded)
	lanesIdle(t, p, "after the reports")
}
