package metrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"

	"github.com/pgxlanes/pgxlanes/metrics"
	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// TestObserveByPriority: every acquire lands in the series of its lane and priority level, and
// any priority maps to one of the four levels, so the label set stays bounded.
func TestObserveByPriority(t *testing.T) {
	pool := newPool(t, offlineDSN)
	c, obs := metrics.NewCollectorWithObserver(pool, metrics.WithTags("checkout"))
	reg := registry(t, c)
	for _, p := range []pgxlanes.Priority{-1000, pgxlanes.PriorityLow, pgxlanes.PriorityNormal, 5,
		pgxlanes.PriorityHigh, pgxlanes.PriorityHigh, pgxlanes.PriorityCritical, 1 << 40} {
		obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Short, Tag: "checkout", Priority: p, Wait: time.Millisecond})
	}
	obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Tx, Priority: pgxlanes.PriorityHigh, Wait: time.Second})
	for level, want := range map[string]uint64{"low": 2, "normal": 2, "high": 2, "critical": 2} {
		n, s := histogram(t, reg, "pgxlanes_acquire_wait_by_priority_seconds", map[string]string{"lane": "short", "priority": level})
		assert.Equal(t, want, n, "short, %s", level)
		assert.InDelta(t, float64(want)*0.001, s, 1e-9, "short, %s", level)
	}
	n, _ := histogram(t, reg, "pgxlanes_acquire_wait_by_priority_seconds", map[string]string{"lane": "tx", "priority": "high"})
	assert.Equal(t, uint64(1), n)
	assert.Equal(t, 12, testutil.CollectAndCount(c, "pgxlanes_acquire_wait_by_priority_seconds"), "3 lanes × 4 levels, from the start")

	f := func() {
		obs.ObserveAcquire(pgxlanes.AcquireEvent{Lane: pgxlanes.Long, Priority: pgxlanes.PriorityCritical, Wait: time.Millisecond})
	}
	assert.Zero(t, testing.AllocsPerRun(100, f), "allocations per event")
}

// TestPriorityCountersFromZero: the aged-grant and tag-share counters exist for every lane at 0,
// and the priority age gauge shows the lanes' resolved settings.
func TestPriorityCountersFromZero(t *testing.T) {
	pool := newPool(t, withParams(t, offlineDSN, "lane_short_priority_age=50ms", "lane_tx_priority_age=0"))
	reg := registry(t, metrics.NewCollector(pool))
	for _, l := range pgxlanes.Lanes() {
		assert.Zero(t, value(t, reg, "pgxlanes_aged_grants_total", lane(l)), l.String())
		assert.Zero(t, value(t, reg, "pgxlanes_tag_share_refusals_total", lane(l)), l.String())
	}
	assert.Equal(t, 0.05, value(t, reg, "pgxlanes_lane_priority_age_seconds", lane(pgxlanes.Short)))
	assert.Zero(t, value(t, reg, "pgxlanes_lane_priority_age_seconds", lane(pgxlanes.Tx)), "off: FIFO")
	assert.Equal(t, 15.0, value(t, reg, "pgxlanes_lane_priority_age_seconds", lane(pgxlanes.Long)), "half of 30s")
}
