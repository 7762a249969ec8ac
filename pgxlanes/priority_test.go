package pgxlanes

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWithPriority(t *testing.T) {
	ctx := context.Background()
	assert.Equal(t, PriorityNormal, AnnotationsFrom(ctx).Priority, "the default")
	ctx = WithTag(WithPriority(ctx, PriorityHigh), "checkout")
	a := AnnotationsFrom(ctx)
	assert.Equal(t, PriorityHigh, a.Priority)
	assert.Equal(t, "checkout", a.Tag, "annotations keep each other")
	assert.Equal(t, PriorityLow, AnnotationsFrom(WithPriority(ctx, PriorityLow)).Priority, "the innermost wins")

	var rt route
	require.NoError(t, (&Pool{}).route(WithPriority(context.Background(), PriorityCritical), Short, "", &rt))
	assert.Equal(t, int(PriorityCritical), rt.caller().Priority, "the call passes its priority to the reserve")
}

func TestPriorityLevel(t *testing.T) {
	for p, want := range map[Priority]string{
		-1000: "low", PriorityLow: "low", -1: "low", PriorityNormal: "normal", 9: "normal",
		PriorityHigh: "high", 19: "high", PriorityCritical: "critical", 1000: "critical",
	} {
		assert.Equal(t, want, p.Level(), "priority %d", p)
	}
	assert.Equal(t, "high", PriorityHigh.String())
	assert.Equal(t, "5", Priority(5).String())
	assert.Equal(t, []string{"low", "normal", "high", "critical"}, PriorityLevels())
}

func TestPriorityConfig(t *testing.T) {
	r := resolved(t, "postgres://localhost/db?pool_max_conns=10")
	assert.Equal(t, 500*time.Millisecond, r.Short.PriorityAge, "half the 1s acquire timeout")
	assert.Equal(t, 5*time.Second, r.Tx.PriorityAge)
	assert.Equal(t, 15*time.Second, r.Long.PriorityAge)
	assert.Zero(t, r.Tx.MaxTagShare, "no tag share by default")
	assert.Zero(t, r.Tx.tagShareSlots())
	assert.Equal(t, 1, r.Short.PriorityHeadroom, "Short keeps one connection from low priorities")
	assert.Equal(t, 1, r.Tx.PriorityHeadroom)
	assert.Equal(t, Off, r.Long.PriorityHeadroom, "none in Long")
	rc := r.reserveConfig([]Lane{Short, Tx, Long}, 10)
	assert.Equal(t, []int{1, 1, 0}, []int{rc.Lanes[Short].PriorityHeadroom, rc.Lanes[Tx].PriorityHeadroom, rc.Lanes[Long].PriorityHeadroom})

	r = resolved(t, "postgres://localhost/db?pool_max_conns=10&lane_short_priority_headroom=3&lane_tx_priority_age=0&lane_long_priority_headroom=1")
	assert.Equal(t, 3, r.Short.PriorityHeadroom)
	assert.Equal(t, Off, r.Tx.PriorityHeadroom, "no headroom without priorities")
	assert.Equal(t, 1, r.Long.PriorityHeadroom)
	r = resolved(t, "postgres://localhost/db?pool_max_conns=1")
	assert.Equal(t, Off, r.Short.PriorityHeadroom, "a lane of one connection keeps it for everyone")

	r = resolved(t, "postgres://localhost/db?pool_max_conns=10&lane_short_acquire_timeout=300ms&lane_tx_priority_age=0"+
		"&lane_long_acquire_timeout=0&lane_tx_max_tag_share=0.5&lane_tx_tag_share_dry_run=true")
	assert.Equal(t, 150*time.Millisecond, r.Short.PriorityAge, "follows the acquire timeout")
	assert.Equal(t, time.Duration(Off), r.Tx.PriorityAge, "0 turns ageing and priorities off: FIFO")
	assert.Equal(t, 15*time.Second, r.Long.PriorityAge, "no acquire timeout: the fixed default")
	assert.Equal(t, 0.5, r.Tx.MaxTagShare)
	assert.True(t, r.Tx.TagShareDryRun)
	rc = r.reserveConfig([]Lane{Short, Tx, Long}, 10)
	assert.Equal(t, r.Tx.MaxConns/2, rc.Lanes[Tx].MaxTagShare, "half of Tx's cap")
	assert.Zero(t, rc.Lanes[Tx].PriorityAge, "FIFO")
	assert.Equal(t, 150*time.Millisecond, rc.Lanes[Short].PriorityAge)

	r = resolved(t, "postgres://localhost/db?pool_max_conns=10&lane_tx_max_tag_share=0.01")
	assert.Equal(t, 1, r.Tx.tagShareSlots(), "at least one connection")
}

func TestPriorityConfigErrors(t *testing.T) {
	for dsn, want := range map[string]string{
		"lane_short_max_tag_share=0.5":                       "pgxlanes: short lane: MaxTagShare (lane_short_max_tag_share) is Tx's alone",
		"lane_long_tag_share_dry_run=1":                      "pgxlanes: long lane: TagShareDryRun (lane_long_tag_share_dry_run) is Tx's alone",
		"lane_tx_max_tag_share=1.5":                          `pgxlanes: DSN parameter lane_tx_max_tag_share: "1.5" is not a fraction from 0 to 1`,
		"lane_tx_max_tag_share=half":                         `pgxlanes: DSN parameter lane_tx_max_tag_share: "half" is not a fraction from 0 to 1`,
		"lane_tx_tag_share_dry_run=yes!":                     `pgxlanes: DSN parameter lane_tx_tag_share_dry_run: "yes!" is not true or false`,
		"lane_tx_tag_share_dry_run=true":                     "pgxlanes: tx lane: TagShareDryRun (lane_tx_tag_share_dry_run) needs MaxTagShare (lane_tx_max_tag_share)",
		"lane_short_priority_age=5":                          `pgxlanes: DSN parameter lane_short_priority_age: "5" has no unit`,
		"pool_max_conns=8&lane_short_priority_headroom=8":    `pgxlanes: short lane: PriorityHeadroom (lane_short_priority_headroom) 8 leaves callers of negative priority none of the lane's 8 slots`,
		"lane_tx_priority_age=0&lane_tx_priority_headroom=2": `pgxlanes: tx lane: PriorityHeadroom (lane_tx_priority_headroom) needs PriorityAge`,
		"lane_long_priority_headroom=x":                      `pgxlanes: DSN parameter lane_long_priority_headroom`,
	} {
		c, err := ParseConfig("postgres://localhost/db?" + dsn)
		if err == nil {
			_, err = c.resolve()
		}
		require.Error(t, err, dsn)
		assert.Contains(t, err.Error(), want, dsn)
	}
	c, err := ParseConfig("postgres://localhost/db")
	require.NoError(t, err)
	for _, mod := range []func(*Config){
		func(c *Config) { c.Tx.MaxTagShare = -0.5 },
		func(c *Config) { c.Tx.PriorityAge = -time.Second },
		func(c *Config) { c.Tx.PriorityHeadroom = -2 },
	} {
		cc := c.Copy()
		mod(cc)
		_, err := cc.resolve()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "pgxlanes: tx lane: ")
	}
}
