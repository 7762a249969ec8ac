package reserve_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgxlanes/pgxlanes/reserve"
)

func TestLaneHandles(t *testing.T) {
	p, err := reserve.New(reserve.Config{Size: 2, Lanes: []reserve.LaneConfig{
		{Name: "fast", Reserved: 1, Bounded: true},
		{Name: "slow"},
	}})
	require.NoError(t, err)
	fast, ok := p.Lane("fast")
	require.True(t, ok)
	slow, ok := p.Lane("slow")
	require.True(t, ok)
	_, ok = p.Lane("nope")
	assert.False(t, ok)
	assert.Equal(t, "fast", fast.Name())
	assert.Equal(t, 1, slow.Index())
	require.Len(t, p.Lanes(), 2)
	assert.Equal(t, "slow", p.Lanes()[1].Name())

	s, err := slow.Acquire(context.Background())
	require.NoError(t, err)
	_, ok = slow.TryAcquire()
	assert.False(t, ok, "slow may not take fast's reserve")
	f, ok := fast.TryAcquire()
	require.True(t, ok)
	assert.Equal(t, 1, fast.Stat().InUse)
	s.Release()
	f.Release()
	assert.Zero(t, fast.Stat().InUse+slow.Stat().InUse)
	assert.Panics(t, func() { s.Release() }, "a second release is a bug")
	assert.Panics(t, func() { reserve.Slot{}.Release() })
}

func TestReleaseOnAnotherPoolPanics(t *testing.T) {
	cfg := reserve.Config{Size: 1, Lanes: []reserve.LaneConfig{{Name: "a"}}}
	p1, err := reserve.New(cfg)
	require.NoError(t, err)
	p2, err := reserve.New(cfg)
	require.NoError(t, err)
	s, err := p1.Acquire(context.Background(), 0)
	require.NoError(t, err)
	assert.Panics(t, func() { p2.Release(s) })
	p1.Release(s)
}
