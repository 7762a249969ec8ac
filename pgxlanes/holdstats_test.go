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
	p, n := h.p99(Short)
	assert.Zero(t, p)
	assert.Zero(t, n)
	for i := range 1000 {
		d := 2 * time.Millisecond
		if i%100 == 0 {
			d = 900 * time.Millisecond // 1 % slow: the p99 is still the lookups'
		}
		h.record(Short, d)
	}
	for range 100 {
		h.record(Tx, 3*time.Second)
	}
	p, n = h.p99(Short)
	assert.Equal(t, uint64(1000), n)
	assert.GreaterOrEqual(t, p, 2*time.Millisecond)
	assert.Less(t, p, 3*time.Millisecond)
	p, _ = h.p99(Tx)
	assert.GreaterOrEqual(t, p, 3*time.Second)
	assert.Less(t, p, 4*time.Second)
	assert.Equal(t, 6*time.Second, advisedTimeout(2*time.Second))
	assert.Zero(t, testing.AllocsPerRun(100, func() { h.record(Long, time.Second) }))
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
