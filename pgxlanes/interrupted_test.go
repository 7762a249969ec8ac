package pgxlanes

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The error of a call a context ended keeps every identity a caller checks: pgx's timeout
// predicate (for a deadline, as pgxpool's error), the context's error, and the server's 57014.
func TestInterruptedErrorIdentity(t *testing.T) {
	pgErr := &pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}
	for _, tc := range []struct {
		cause   error
		timeout bool
	}{
		{context.DeadlineExceeded, true},
		{context.Canceled, false},
	} {
		err := error(&interruptedError{lane: Short, cause: tc.cause, err: pgErr})
		assert.Equal(t, tc.timeout, pgconn.Timeout(err), "%v", tc.cause)
		assert.ErrorIs(t, err, tc.cause)
		var got *pgconn.PgError
		require.ErrorAs(t, err, &got)
		assert.Equal(t, "57014", got.Code)
		assert.Equal(t, "pgxlanes: short lane: "+tc.cause.Error()+": "+pgErr.Error(), err.Error())
		if tc.cause == context.DeadlineExceeded {
			assert.NotErrorIs(t, err, context.Canceled)
		}
	}
	t0 := pgconnTimeout()
	require.NotNil(t, t0, "pgconn gave no timeout error to mint")
	assert.Equal(t, context.DeadlineExceeded, errors.Unwrap(t0))
}

// A deadline that ends the wait for a connection is a timeout for pgx's predicate too; the lane's
// own acquire timeout and a cancelled context are not.
func TestAcquireErrorTimeout(t *testing.T) {
	for _, tc := range []struct {
		err     error
		timeout bool
	}{
		{context.DeadlineExceeded, true},
		{context.Canceled, false},
		{ErrAcquireTimeout, false},
		{ErrLaneFull, false},
	} {
		err := error(&AcquireError{Lane: Short, Err: tc.err})
		assert.Equal(t, tc.timeout, pgconn.Timeout(err), "%v", tc.err)
		assert.ErrorIs(t, err, tc.err)
		var ae *AcquireError
		assert.ErrorAs(t, err, &ae)
		var anyErr error
		require.ErrorAs(t, err, &anyErr)
		assert.Same(t, err, anyErr)
	}
}
