package otelmetrics_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/metrics/otelmetrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestRetryCounters drives RetryOptions.Do on a registered pool with scripted attempts (the loop is
// the real one; integration/retry_test.go runs the transactions against PostgreSQL).
func TestRetryCounters(t *testing.T) {
	otel := newSDK(t)
	pool := offlinePool(t)
	reg, err := otelmetrics.Register(pool, otelmetrics.WithMeterProvider(otel.provider), otelmetrics.WithPoolName("p"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })

	run := func(ctx context.Context, o pgxlanes.RetryOptions, steps ...[2]error) error {
		i := 0
		return o.Do(ctx, pool, func(context.Context) (error, error) {
			s := steps[min(i, len(steps)-1)]
			i++
			return s[0], s[1]
		})
	}
	fast := pgxlanes.RetryOptions{BaseDelay: time.Microsecond, MaxDelay: time.Microsecond, MaxAttempts: 3}
	serialization := &pgconn.PgError{Code: "40001"}
	require.NoError(t, run(context.Background(), fast, [2]error{serialization, nil}, [2]error{}))
	long := pgxlanes.WithTag(pgxlanes.WithLane(context.Background(), pgxlanes.Long), "user-42")
	require.ErrorIs(t, run(long, fast, [2]error{&pgconn.PgError{Code: "40P01"}, nil}), pgxlanes.ErrRetryGaveUp)
	require.ErrorIs(t, run(context.Background(), fast, [2]error{nil, io.ErrUnexpectedEOF}), pgxlanes.ErrRetryCommitUnknown)

	ms := otel.collect(t)
	tx, lng := attrs("db.client.connection.pool.name", "p", "pgxlanes.lane", "tx"), attrs("db.client.connection.pool.name", "p", "pgxlanes.lane", "long")
	assert.Equal(t, int64(3), value(t, ms["pgxlanes.retry.attempts"], tx))
	assert.Equal(t, int64(3), value(t, ms["pgxlanes.retry.attempts"], lng), "no tag attribute: the tag does not add series")
	assert.Equal(t, int64(1), value(t, ms["pgxlanes.retry.retries"],
		attrs("db.client.connection.pool.name", "p", "pgxlanes.lane", "tx", "pgxlanes.retry.code", "40001")))
	assert.Equal(t, int64(2), value(t, ms["pgxlanes.retry.retries"],
		attrs("db.client.connection.pool.name", "p", "pgxlanes.lane", "long", "pgxlanes.retry.code", "40P01")))
	assert.Equal(t, int64(1), value(t, ms["pgxlanes.retry.gave_up"],
		attrs("db.client.connection.pool.name", "p", "pgxlanes.lane", "long", "pgxlanes.retry.reason", "max_attempts")))
	assert.Equal(t, int64(1), value(t, ms["pgxlanes.retry.commit_unknown"], tx))
}
