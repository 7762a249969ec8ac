package wire_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type cleanedFunc func(bool)

func (f cleanedFunc) Cleaned(ok bool) { f(ok) }

// Finish stages the defaults and says the Conn is fit; during a drain it defers to the drain's
// end, as OnClean does; once the Conn is closed it is unfit.
func TestFinish(t *testing.T) {
	c, w := connect(t, liveDSN(t), pgx.QueryExecModeCacheStatement)
	ctx := context.Background()
	w.Stage("set statement_timeout = 12345")
	var st string
	require.NoError(t, c.QueryRow(ctx, "select current_setting('statement_timeout')").Scan(&st))
	require.Equal(t, "12345ms", st)

	var cleaning atomic.Int64
	draining, fit := w.Finish(cleanedFunc(func(bool) { t.Error("no drain under way") }), &cleaning)
	assert.False(t, draining)
	assert.Zero(t, cleaning.Load(), "nothing to clean")
	assert.True(t, fit)
	require.NoError(t, c.QueryRow(ctx, "select current_setting('statement_timeout')").Scan(&st))
	assert.Equal(t, "0", st, "the defaults are staged")

	qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := c.Exec(qctx, "select pg_sleep(2)")
	cancel()
	require.Error(t, err)
	cleaned := make(chan bool, 1)
	draining, _ = w.Finish(cleanedFunc(func(ok bool) {
		assert.Equal(t, int64(1), cleaning.Load(), "counted before Cleaned runs")
		cleaning.Add(-1)
		cleaned <- ok
	}), &cleaning)
	require.True(t, draining, "the interrupted statement's replies are being drained")
	select {
	case ok := <-cleaned:
		assert.True(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("Cleaned not called at the drain's end")
	}
	waitClean(t, w)

	require.NoError(t, w.Close())
	draining, fit = w.Finish(nil, nil)
	assert.False(t, draining)
	assert.False(t, fit, "a closed Conn is not fit")
}
