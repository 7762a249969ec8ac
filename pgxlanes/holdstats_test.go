package pgxlanes

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHoldBuckets(t *testing.T) {
	prev := time.Duration(0)
	for b := range holdBuckets {
		up := holdUpper(b)
		assert.Greater(t, up, prev, "bucket %d", b)
		prev = up
	}
	for _, d := range []time.Duration{0, time.Microsecond, 1500 * time.Microsecond, 3 * time.Millisecond, time.Second, 7 * time.Second, time.Hour} {
		b := holdBucket(d)
		assert.LessOrEqual(t, d, holdUpper(b), "%v in bucket %d", d, b)
		if b > 0 {
			assert.Greater(t, d, holdUpper(b-1), "%v in bucket %d", d, b)
			assert.Less(t, float64(holdUpper(b)), 1.26*float64(d)+1, "%v: bucket bound within 26%%", d)
		}
	}
}

func TestHoldP99(t *testing.T) {
	var h holdStats
	now := monoNow()
	p, n := h.p99(Short, now)
	assert.Zero(t, p)
	assert.Zero(t, n)
	for i := range 1000 {
		d := 2 * time.Millisecond
		if i%100 == 0 {
			d = 900 * time.Millisecond // 1 % slow: the p99 is still the lookups'
		}
		h.record(Short, d, now)
	}
	for range 100 {
		h.record(Tx, 3*time.Second, now)
	}
	p, n = h.p99(Short, now)
	assert.Equal(t, uint64(1000), n)
	assert.GreaterOrEqual(t, p, 2*time.Millisecond)
	assert.Less(t, p, 3*time.Millisecond)
	p, _ = h.p99(Tx, now)
	assert.GreaterOrEqual(t, p, 3*time.Second)
	assert.Less(t, p, 4*time.Second)
	assert.Equal(t, 6*time.Second, advisedTimeout(2*time.Second))
	assert.Zero(t, testing.AllocsPerRun(100, func() { h.record(Long, time.Second, now) }))
}

// TestHoldWindows: the p99 covers the window of the time it is read at and the one before,
// whether or not it was read in between. A busy hour nobody read is gone an hour later; a minute
// ago stays.
func TestHoldWindows(t *testing.T) {
	const w = mono(holdWindow)
	var h holdStats
	t0 := monoNow()
	for range 1000 {
		h.record(Short, 900*time.Millisecond, t0) // the first window: slow
	}
	// Nobody reads for an hour; then, in one window, 100 fast holds.
	later := t0 + 60*w + w/2
	for range 100 {
		h.record(Short, 2*time.Millisecond, later)
	}
	p, n := h.p99(Short, later)
	assert.Equal(t, uint64(100), n, "only the last window's holds: the hour-old ones are gone")
	assert.Less(t, p, 3*time.Millisecond)

	// The window before the current one still counts; two windows on, it is gone too.
	p, n = h.p99(Short, later+w)
	assert.Equal(t, uint64(100), n, "a window on: the holds of the window before")
	assert.Less(t, p, 3*time.Millisecond)
	h.record(Short, 5*time.Millisecond, later+w+w/4)
	_, n = h.p99(Short, later+w+w/3)
	assert.Equal(t, uint64(101), n)
	_, n = h.p99(Short, later+2*w+w/3)
	assert.Equal(t, uint64(1), n, "the window of the 100 ended two windows ago")
	p, n = h.p99(Short, later+10*w)
	assert.Zero(t, n, "read alone, long after: nothing recent")
	assert.Zero(t, p)
}

// TestHoldP99Live: every lease's end records its hold in its lane, with no observer added: the
// lookups' p99 in Short, a connection held for 50 ms in Tx, against a real PostgreSQL.
func TestHoldP99Live(t *testing.T) {
	ctx := context.Background()
	p := reusePool(t, "pool_max_conns=4")
	assert.Zero(t, p.Stat().Lane(Short).HoldP99, "no lease ended yet")
	for range 20 {
		var n int
		require.NoError(t, p.QueryRow(ctx, "select 1").Scan(&n))
	}
	c, err := p.Acquire(ctx) // a held connection: Tx
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond) // the hold being measured
	c.Release()

	short, tx := p.Stat().Lane(Short), p.Stat().Lane(Tx)
	assert.Positive(t, short.HoldP99)
	assert.Less(t, short.HoldP99, 50*time.Millisecond)
	assert.GreaterOrEqual(t, tx.HoldP99, 50*time.Millisecond)
	assert.Less(t, tx.HoldP99, 5*time.Second)
	assert.Equal(t, 3*tx.HoldP99, tx.AdvisedTimeout)
	assert.Zero(t, p.Stat().Lane(Long).HoldP99, "no Long lease")
}
