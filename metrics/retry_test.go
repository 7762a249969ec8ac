package metrics_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/metrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestRetryCounters drives RetryOptions.Do on a pool with scripted attempts (the loop is the real
// one; the transactions are not: integration/retry_test.go runs them against PostgreSQL) and
// reads the counters through a pedantic registry.
func TestRetryCounters(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c := metrics.NewCollector(pool, metrics.WithTags("transfer"))
	reg := registry(t, c)

	serialization := &pgconn.PgError{Code: "40001"}
	lockTimeout := &pgconn.PgError{Code: "55P03"}
	run := func(ctx context.Context, o pgxlanes.RetryOptions, steps ...[2]error) error {
		i := 0
		return o.Do(ctx, pool, func(context.Context) (error, error) {
			s := steps[min(i, len(steps)-1)]
			i++
			return s[0], s[1]
		})
	}
	fast := pgxlanes.RetryOptions{BaseDelay: time.Microsecond, MaxDelay: time.Microsecond, MaxAttempts: 3,
		RetryCodes: append(pgxlanes.DefaultRetryCodes(), "55P03")}
	tagged := pgxlanes.WithTag(context.Background(), "transfer")

	// Tx, tag transfer: 40001 twice, then committed: 3 attempts, 2 retries.
	require.NoError(t, run(tagged, fast, [2]error{serialization, nil}, [2]error{nil, serialization}, [2]error{}))
	// Long, tag "report" (not allowed: other): 55P03 until the cap.
	long := pgxlanes.WithTag(pgxlanes.WithLane(context.Background(), pgxlanes.Long), "report")
	require.ErrorIs(t, run(long, fast, [2]error{lockTimeout, nil}), pgxlanes.ErrRetryGaveUp)
	// Tx, no tag: a commit of unknown outcome.
	require.ErrorIs(t, run(context.Background(), fast, [2]error{nil, io.ErrUnexpectedEOF}), pgxlanes.ErrRetryCommitUnknown)

	v := func(name string, labels map[string]string) float64 { return value(t, reg, name, labels) }
	assert.Equal(t, 3.0, v("pgxlanes_retry_attempts_total", map[string]string{"lane": "tx", "tag": "transfer"}))
	assert.Equal(t, 2.0, v("pgxlanes_retry_retries_total", map[string]string{"lane": "tx", "tag": "transfer", "code": "40001"}))
	assert.Equal(t, 0.0, v("pgxlanes_retry_gave_up_total", map[string]string{"lane": "tx", "tag": "transfer", "reason": "max_attempts"}))

	assert.Equal(t, 3.0, v("pgxlanes_retry_attempts_total", map[string]string{"lane": "long", "tag": "other"}))
	assert.Equal(t, 2.0, v("pgxlanes_retry_retries_total", map[string]string{"lane": "long", "tag": "other", "code": "55P03"}))
	assert.Equal(t, 1.0, v("pgxlanes_retry_gave_up_total", map[string]string{"lane": "long", "tag": "other", "reason": "max_attempts"}))

	assert.Equal(t, 1.0, v("pgxlanes_retry_attempts_total", map[string]string{"lane": "tx", "tag": "none"}))
	assert.Equal(t, 1.0, v("pgxlanes_retry_commit_unknown_total", map[string]string{"lane": "tx", "tag": "none"}))
	assert.Equal(t, 0.0, v("pgxlanes_retry_commit_unknown_total", map[string]string{"lane": "tx", "tag": "transfer"}))

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// The retry counters exist from the start, for every lane and default code and reason, and
// carry no tag label without WithTags.
func TestRetryCountersFromZero(t *testing.T) {
	pool := newPool(t, offlineDSN)
	reg := registry(t, metrics.NewCollector(pool))
	for _, l := range []string{"short", "tx", "long"} {
		assert.Equal(t, 0.0, value(t, reg, "pgxlanes_retry_attempts_total", map[string]string{"lane": l}))
		assert.Equal(t, 0.0, value(t, reg, "pgxlanes_retry_commit_unknown_total", map[string]string{"lane": l}))
		for _, code := range []string{"40001", "40P01", "conn"} {
			assert.Equal(t, 0.0, value(t, reg, "pgxlanes_retry_retries_total", map[string]string{"lane": l, "code": code}))
		}
		for _, r := range []string{"max_attempts", "max_elapsed", "deadline", "canceled"} {
			assert.Equal(t, 0.0, value(t, reg, "pgxlanes_retry_gave_up_total", map[string]string{"lane": l, "reason": r}))
		}
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				assert.NotEqual(t, "tag", lp.GetName(), "%s has a tag label without WithTags", mf.GetName())
			}
		}
	}
}
