package pgxlanes

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
		h.ObserveRelease(ReleaseEvent{Lane: Short, Hold: d})
	}
	for range 100 {
		h.ObserveRelease(ReleaseEvent{Lane: Tx, Hold: 3 * time.Second})
	}
	p, n = h.p99(Short)
	assert.Equal(t, uint64(1000), n)
	assert.GreaterOrEqual(t, p, 2*time.Millisecond)
	assert.Less(t, p, 3*time.Millisecond)
	p, _ = h.p99(Tx)
	assert.GreaterOrEqual(t, p, 3*time.Second)
	assert.Less(t, p, 4*time.Second)
	assert.Equal(t, 6*time.Second, advisedTimeout(2*time.Second))
	assert.Zero(t, testing.AllocsPerRun(100, func() { h.ObserveRelease(ReleaseEvent{Lane: Long, Hold: time.Second}) }))
}
