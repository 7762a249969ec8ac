package pgxlanes_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// These tests drive RetryOptions.Do, the loop under RetryTx, with attempts that return scripted
// errors: the schedule is pure, so it runs in a synctest bubble on the fake clock, with no sleep.
// The loop against PostgreSQL is in integration/retry_test.go.

var (
	serialization = &pgconn.PgError{Code: "40001", Message: "could not serialize access due to concurrent update"}
	deadlock      = &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	uniqueKey     = &pgconn.PgError{Code: "23505", Message: "duplicate key value violates unique constraint"}
	lockTimeout   = &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
)

// safeErr is an error pgx marks safe to retry: nothing of the request was sent.
type safeErr struct{}

func (safeErr) Error() string     { return "dial tcp: connection refused" }
func (safeErr) SafeToRetry() bool { return true }

// ctxDoneBeforeSend is pgconn's error for a request whose ctx had ended before it was sent.
type ctxDoneBeforeSend struct{}

func (ctxDoneBeforeSend) Error() string     { return "context already done: context canceled" }
func (ctxDoneBeforeSend) SafeToRetry() bool { return true }
func (ctxDoneBeforeSend) Unwrap() error     { return context.Canceled }

// script is an attempt function: its nth call returns the nth pair (the last one over and over),
// and it records when each call started on the bubble's clock.
type script struct {
	steps  [][2]error
	starts []time.Time
}

func (s *script) attempt(context.Context) (error, error) {
	s.starts = append(s.starts, time.Now())
	i := min(len(s.starts)-1, len(s.steps)-1)
	return s.steps[i][0], s.steps[i][1]
}

// gaps returns the time between consecutive attempts.
func (s *script) gaps() []time.Duration {
	var g []time.Duration
	for i := 1; i < len(s.starts); i++ {
		g = append(g, s.starts[i].Sub(s.starts[i-1]))
	}
	return g
}

func fail(err error) [2]error       { return [2]error{err, nil} }
func failCommit(err error) [2]error { return [2]error{nil, err} }

var ok = [2]error{}

// maxRand removes the jitter: every pause is its bound.
func maxRand(n int64) int64 { return n - 1 }

func TestRetryBackoffSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var bounds []time.Duration
		o := pgxlanes.RetryOptions{Rand: func(n int64) int64 { bounds = append(bounds, time.Duration(n)); return n - 1 }}
		s := &script{steps: [][2]error{fail(serialization)}}
		start := time.Now()
		err := o.Do(context.Background(), nil, s.attempt)

		// The defaults: 10 attempts, bounds doubling from 5 ms, capped at 1 s.
		ms := time.Millisecond
		want := []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second}
		require.Equal(t, want, bounds, "the bounds of the nine pauses")
		wantGaps := make([]time.Duration, len(want))
		for i, b := range want {
			wantGaps[i] = b - 1
		}
		assert.Equal(t, wantGaps, s.gaps(), "each pause is what Rand chose")
		assert.Len(t, s.starts, pgxlanes.DefaultRetryMaxAttempts)

		var re *pgxlanes.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, pgxlanes.RetryReasonMaxAttempts, re.Reason)
		assert.Equal(t, 10, re.Attempts)
		assert.Equal(t, "40001", re.Code)
		assert.Equal(t, time.Since(start), re.Elapsed, "no pause after the last attempt")
		assert.ErrorIs(t, err, pgxlanes.ErrRetryGaveUp)
		assert.ErrorIs(t, err, serialization, "the last attempt's error is wrapped")
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, "40001", pe.Code)
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "gave up after 10 attempt(s)")
	})
}

// With full jitter each pause is uniform below its bound: Rand's choice, whatever it is.
func TestRetryFullJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var chosen []time.Duration
		o := pgxlanes.RetryOptions{MaxAttempts: 6, BaseDelay: 100 * time.Millisecond, MaxDelay: 400 * time.Millisecond,
			Rand: func(n int64) int64 {
				v := n / 3 * int64(len(chosen)%3) // 0, n/3, 2n/3, ...
				chosen = append(chosen, time.Duration(v))
				return v
			}}
		s := &script{steps: [][2]error{fail(deadlock)}}
		err := o.Do(context.Background(), nil, s.attempt)
		require.ErrorIs(t, err, pgxlanes.ErrRetryGaveUp)
		assert.Equal(t, chosen, s.gaps())
		ms := time.Millisecond
		// bounds 100, 200, 400, 400, 400 ms; choices 0, 1/3, 2/3, 0, 1/3 of them.
		assert.Equal(t, durations{0, 66 * ms, 266 * ms, 0, 133 * ms}, durations(s.gaps()).roundMs())
	})
}

type durations []time.Duration

func (d durations) roundMs() durations {
	out := make(durations, len(d))
	for i, v := range d {
		out[i] = v.Truncate(time.Millisecond)
	}
	return out
}

func TestRetryDefaultRandStaysBelowBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := pgxlanes.RetryOptions{MaxAttempts: 200, BaseDelay: 8 * time.Millisecond, MaxDelay: 8 * time.Millisecond, MaxElapsed: pgxlanes.Off}
		s := &script{steps: [][2]error{fail(serialization)}}
		require.ErrorIs(t, o.Do(context.Background(), nil, s.attempt), pgxlanes.ErrRetryGaveUp)
		distinct := map[time.Duration]bool{}
		for _, g := range s.gaps() {
			require.Less(t, g, 8*time.Millisecond)
			require.GreaterOrEqual(t, g, time.Duration(0))
			distinct[g] = true
		}
		assert.Greater(t, len(distinct), 100, "the pauses are spread, not one value")
	})
}

func TestRetryStopsAtMaxElapsed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := pgxlanes.RetryOptions{MaxAttempts: 100, BaseDelay: time.Second, MaxDelay: time.Second, MaxElapsed: 3500 * time.Millisecond, Rand: maxRand}
		s := &script{steps: [][2]error{fail(serialization)}}
		start := time.Now()
		err := o.Do(context.Background(), nil, s.attempt)
		var re *pgxlanes.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, pgxlanes.RetryReasonMaxElapsed, re.Reason)
		// Attempts at 0, 1, 2, 3 s (less a ns each): the next would start past 3.5 s.
		assert.Equal(t, 4, re.Attempts)
		assert.Less(t, time.Since(start), 3500*time.Millisecond, "returned without taking a pause past MaxElapsed")
	})
}

// A pause never crosses ctx's deadline: RetryTx returns at once when the next attempt could not
// start before it, with an error that matches context.DeadlineExceeded.
func TestRetryNeverPausesPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		o := pgxlanes.RetryOptions{MaxAttempts: 100, BaseDelay: time.Second, MaxDelay: time.Second, Rand: maxRand}
		s := &script{steps: [][2]error{fail(serialization)}}
		start := time.Now()
		err := o.Do(ctx, nil, s.attempt)
		var re *pgxlanes.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, pgxlanes.RetryReasonDeadline, re.Reason)
		assert.Equal(t, 3, re.Attempts, "attempts at about 0, 1 and 2 s; the next would start at 3 s")
		assert.Less(t, time.Since(start), 2100*time.Millisecond, "returned before the deadline, without a useless pause")
		assert.NoError(t, ctx.Err())
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorIs(t, err, serialization)
	})
}

func TestRetryCancelDuringPause(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(1500*time.Millisecond, cancel)
		o := pgxlanes.RetryOptions{BaseDelay: time.Second, MaxDelay: time.Second, Rand: maxRand}
		s := &script{steps: [][2]error{fail(serialization)}}
		start := time.Now()
		err := o.Do(ctx, nil, s.attempt)
		assert.Equal(t, 1500*time.Millisecond, time.Since(start), "returned when ctx was cancelled, mid-pause")
		var re *pgxlanes.RetryError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, pgxlanes.RetryReasonCanceled, re.Reason)
		assert.Equal(t, 2, re.Attempts)
		assert.ErrorIs(t, err, context.Canceled)
		assert.ErrorIs(t, err, pgxlanes.ErrRetryGaveUp)
	})
}

// An attempt that fails because ctx ended returns its error as it is, never retried: it matches
// ctx's error already, even when pgx marks it safe to retry.
func TestRetryCtxErrorNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctxErr := &pgxlanes.AcquireError{Lane: pgxlanes.Tx, Err: context.DeadlineExceeded}
		s := &script{steps: [][2]error{fail(ctxErr)}}
		err := pgxlanes.RetryOptions{}.Do(context.Background(), nil, s.attempt)
		assert.Same(t, ctxErr, err)
		assert.Len(t, s.starts, 1)
	})
}

// What is retried, what is returned as it is, and what is returned as an unknown outcome.
func TestRetryClassification(t *testing.T) {
	acqTimeout := &pgxlanes.AcquireError{Lane: pgxlanes.Tx, Err: pgxlanes.ErrAcquireTimeout}
	laneFull := &pgxlanes.AcquireError{Lane: pgxlanes.Tx, Err: pgxlanes.ErrLaneFull}
	appErr := errors.New("insufficient funds")
	budgetRefused := &pgxlanes.BudgetError{Lane: pgxlanes.Tx, Action: pgxlanes.ActionCancel}
	budgetMidCommit := &pgxlanes.BudgetError{Lane: pgxlanes.Tx, Action: pgxlanes.ActionTerminate, Err: io.ErrUnexpectedEOF}
	for _, tc := range []struct {
		name  string
		opts  pgxlanes.RetryOptions
		first [2]error
		// want: "retry" (then the second attempt commits), "as-is" (returned unchanged after one
		// attempt), "unknown" (a RetryError with ErrRetryCommitUnknown after one attempt).
		want string
		code string
	}{
		{"40001 in fn", pgxlanes.RetryOptions{}, fail(fmt.Errorf("transfer: %w", serialization)), "retry", "40001"},
		{"40P01 in fn", pgxlanes.RetryOptions{}, fail(deadlock), "retry", "40P01"},
		{"40001 at commit", pgxlanes.RetryOptions{}, failCommit(serialization), "retry", "40001"},
		{"safe to retry at begin", pgxlanes.RetryOptions{}, fail(safeErr{}), "retry", pgxlanes.RetryCodeConn},
		// pgx marks "conn closed" safe to retry even when COMMIT was sent (integration/retry_test.go).
		{"safe to retry at commit", pgxlanes.RetryOptions{}, failCommit(safeErr{}), "unknown", ""},
		{"ctx ended before commit was sent", pgxlanes.RetryOptions{}, failCommit(&ctxDoneBeforeSend{}), "as-is", ""},
		{"23505", pgxlanes.RetryOptions{}, fail(uniqueKey), "as-is", ""},
		{"55P03 by default", pgxlanes.RetryOptions{}, fail(lockTimeout), "as-is", ""},
		{"55P03 listed", pgxlanes.RetryOptions{RetryCodes: append(pgxlanes.DefaultRetryCodes(), "55P03")}, fail(lockTimeout), "retry", "55P03"},
		{"40001 unlisted", pgxlanes.RetryOptions{RetryCodes: []string{"55P03"}}, fail(serialization), "as-is", ""},
		{"application error", pgxlanes.RetryOptions{}, fail(appErr), "as-is", ""},
		{"acquire timeout by default", pgxlanes.RetryOptions{}, fail(acqTimeout), "as-is", ""},
		{"acquire timeout with RetryAcquire", pgxlanes.RetryOptions{RetryAcquire: true}, fail(acqTimeout), "retry", pgxlanes.RetryCodeAcquireTimeout},
		{"lane full by default", pgxlanes.RetryOptions{}, fail(laneFull), "as-is", ""},
		{"lane full with RetryAcquire", pgxlanes.RetryOptions{RetryAcquire: true}, fail(laneFull), "retry", pgxlanes.RetryCodeLaneFull},
		{"commit lost connection", pgxlanes.RetryOptions{}, failCommit(io.ErrUnexpectedEOF), "unknown", ""},
		{"commit ctx ended in flight", pgxlanes.RetryOptions{}, failCommit(fmt.Errorf("commit: %w", context.DeadlineExceeded)), "unknown", ""},
		{"commit of a failed transaction", pgxlanes.RetryOptions{}, failCommit(pgx.ErrTxCommitRollback), "as-is", ""},
		{"commit after fn committed", pgxlanes.RetryOptions{}, failCommit(pgx.ErrTxClosed), "as-is", ""},
		{"commit refused by the guard", pgxlanes.RetryOptions{}, failCommit(budgetRefused), "as-is", ""},
		{"commit lost during a terminate", pgxlanes.RetryOptions{}, failCommit(budgetMidCommit), "unknown", ""},
		{"commit 23505 (deferred constraint)", pgxlanes.RetryOptions{}, failCommit(uniqueKey), "as-is", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &script{steps: [][2]error{tc.first, ok}}
				pool := newOfflinePool(t)
				obs := &retryEvents{}
				pool.AddObserver(obs)
				err := tc.opts.Do(context.Background(), pool, s.attempt)
				firstErr := tc.first[0]
				if firstErr == nil {
					firstErr = tc.first[1]
				}
				switch tc.want {
				case "retry":
					require.NoError(t, err)
					assert.Len(t, s.starts, 2)
					require.Len(t, obs.events, 2)
					assert.Equal(t, pgxlanes.RetryWillRetry, obs.events[0].Outcome)
					assert.Equal(t, tc.code, obs.events[0].Code)
					assert.Equal(t, pgxlanes.RetryCommitted, obs.events[1].Outcome)
				case "as-is":
					assert.Same(t, firstErr, err) //nolint:testifylint // the very error
					assert.Len(t, s.starts, 1)
					require.Len(t, obs.events, 1)
					assert.Equal(t, pgxlanes.RetryFailed, obs.events[0].Outcome)
				case "unknown":
					assert.ErrorIs(t, err, pgxlanes.ErrRetryCommitUnknown)
					assert.NotErrorIs(t, err, pgxlanes.ErrRetryGaveUp)
					assert.ErrorIs(t, err, firstErr)
					assert.Len(t, s.starts, 1, "never retried")
					require.Len(t, obs.events, 1)
					assert.Equal(t, pgxlanes.RetryCommitUnknown, obs.events[0].Outcome)
					assert.Contains(t, err.Error(), "commit outcome unknown")
				}
			})
		})
	}
}

func TestRetryOptionsValidated(t *testing.T) {
	never := func(context.Context) (error, error) { panic("an attempt ran with bad options") }
	for _, tc := range []struct {
		opts  pgxlanes.RetryOptions
		field string
	}{
		{pgxlanes.RetryOptions{MaxAttempts: -1}, "MaxAttempts"},
		{pgxlanes.RetryOptions{MaxElapsed: -2}, "MaxElapsed"},
		{pgxlanes.RetryOptions{BaseDelay: -time.Second}, "BaseDelay"},
		{pgxlanes.RetryOptions{MaxDelay: -time.Second}, "MaxDelay"},
		{pgxlanes.RetryOptions{BaseDelay: 2 * time.Second, MaxDelay: time.Second}, "BaseDelay"},
		{pgxlanes.RetryOptions{RetryCodes: []string{"4001"}}, "RetryCodes"},
		{pgxlanes.RetryOptions{RetryCodes: []string{"40p01"}}, "RetryCodes"},
	} {
		err := tc.opts.Do(context.Background(), nil, never)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "pgxlanes: RetryOptions."+tc.field)
	}
	assert.ErrorContains(t, pgxlanes.RetryOptions{}.Do(context.Background(), nil, nil), "attempt is nil")
	assert.ErrorContains(t, pgxlanes.RetryTx(context.Background(), nil, pgx.TxOptions{}, func(pgx.Tx) error { return nil }), "db is nil")
	assert.ErrorContains(t, pgxlanes.RetryTx(context.Background(), (*pgxlanes.Pool)(nil), pgx.TxOptions{}, func(pgx.Tx) error { return nil }), "db is nil")
	assert.ErrorContains(t, pgxlanes.RetryTx(context.Background(), (*pgxpool.Pool)(nil), pgx.TxOptions{}, func(pgx.Tx) error { return nil }), "db is nil")
	pool := newOfflinePool(t)
	assert.ErrorContains(t, pgxlanes.RetryTx(context.Background(), pool, pgx.TxOptions{}, nil), "fn is nil")
	// Off is valid for MaxElapsed; 1 attempt means no retry.
	s := &script{steps: [][2]error{fail(serialization)}}
	err := pgxlanes.RetryOptions{MaxAttempts: 1, MaxElapsed: pgxlanes.Off}.Do(context.Background(), nil, s.attempt)
	require.ErrorIs(t, err, pgxlanes.ErrRetryGaveUp)
	assert.Len(t, s.starts, 1)
}

// A RetryObserver of the pool sees every attempt, on the lane and tag of ctx.
func TestRetryEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pool := newOfflinePool(t)
		obs := &retryEvents{}
		pool.AddObserver(obs)
		ctx := pgxlanes.WithTag(pgxlanes.WithLane(context.Background(), pgxlanes.Long), "transfer")
		s := &script{steps: [][2]error{fail(serialization), fail(deadlock), failCommit(serialization)}}
		o := pgxlanes.RetryOptions{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: time.Second, Rand: maxRand}
		err := o.Do(ctx, pool, s.attempt)
		require.ErrorIs(t, err, pgxlanes.ErrRetryGaveUp)
		require.Len(t, obs.events, 3)
		for i, e := range obs.events {
			assert.Equal(t, pgxlanes.Long, e.Lane)
			assert.Equal(t, "transfer", e.Tag)
			assert.Equal(t, i+1, e.Attempt)
			assert.Error(t, e.Err)
		}
		assert.Equal(t, []string{"retry 40001 ", "retry 40P01 ", "gave_up 40001 max_attempts"}, obs.summary())
		assert.Equal(t, time.Second-1, obs.events[0].Delay)
		assert.Equal(t, 2*(time.Second-1), obs.events[2].Elapsed)

		// The default lane of a transaction is Tx; an attempt that commits is reported too.
		obs.events = nil
		s = &script{steps: [][2]error{ok}}
		require.NoError(t, o.Do(context.Background(), pool, s.attempt))
		require.Len(t, obs.events, 1)
		assert.Equal(t, pgxlanes.Tx, obs.events[0].Lane)
		assert.Equal(t, "committed", obs.events[0].Outcome.String())
	})
}

// newOfflinePool returns a pool on a server that is never contacted: New does not connect.
func newOfflinePool(t *testing.T) *pgxlanes.Pool {
	t.Helper()
	pool, err := pgxlanes.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// retryEvents is an Observer that records the retry events.
type retryEvents struct {
	mu     sync.Mutex
	events []pgxlanes.RetryEvent
}

func (r *retryEvents) ObserveAcquire(pgxlanes.AcquireEvent) {}
func (r *retryEvents) ObserveRelease(pgxlanes.ReleaseEvent) {}
func (r *retryEvents) ObserveRetry(e pgxlanes.RetryEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *retryEvents) summary() []string {
	var s []string
	for _, e := range r.events {
		s = append(s, fmt.Sprintf("%v %s %s", e.Outcome, e.Code, e.Reason))
	}
	return s
}
