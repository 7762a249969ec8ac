package pgxlanes

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/pgxlanes/pgxlanes/reserve"
)

// Priority orders the callers waiting in one lane: a freed connection goes to the highest
// priority waiting, and among equals to the first that came. Ageing bounds every wait: a caller
// that has waited its lane's PriorityAge is served before every caller that came after it,
// whatever their priority, so low-priority work is delayed, never starved (docs/design.md
// proves the bound). A priority orders a lane's queue, and a negative one keeps a caller off the
// lane's last connections (LaneConfig.PriorityHeadroom) until it has waited PriorityAge: it never
// lets a lane take more than its cap or another lane's reserve, and the lane's acquire timeout
// and queue bound hold for every caller. Use the named levels; any int works, larger first.
type Priority int

// The named priority levels. The gaps leave room for levels in between; metrics group every
// priority into the level at or below it (see Level).
const (
	PriorityLow      Priority = -10 // background work: batch jobs, cache warm-up, reports that can wait
	PriorityNormal   Priority = 0   // the default
	PriorityHigh     Priority = 10  // user-facing requests that should not wait behind background work
	PriorityCritical Priority = 20  // checkout, login, health checks
)

// Level returns the named level p belongs to, as metrics label it: "low" below 0, "normal" from
// 0 to below PriorityHigh, "high" below PriorityCritical, "critical" from there up.
func (p Priority) Level() string {
	switch {
	case p < PriorityNormal:
		return "low"
	case p < PriorityHigh:
		return "normal"
	case p < PriorityCritical:
		return "high"
	}
	return "critical"
}

// String returns the level's name for a named level, the number otherwise.
func (p Priority) String() string {
	switch p {
	case PriorityLow, PriorityNormal, PriorityHigh, PriorityCritical:
		return p.Level()
	}
	return strconv.Itoa(int(p))
}

// PriorityLevels lists the level names Level returns, lowest first.
func PriorityLevels() []string { return []string{"low", "normal", "high", "critical"} }

// WithPriority returns a context whose calls wait with priority p in their lane's queue. It
// changes the order in which waiters of one lane are served, and, for a negative p, keeps the
// call off the lane's PriorityHeadroom until it has waited the lane's PriorityAge; otherwise a
// call that finds a free connection takes it whatever its priority.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return withAnnotations(ctx, func(a *Annotations) { a.Priority = p })
}

// Defaults of LaneConfig.PriorityAge when the lane has no acquire timeout; otherwise the default
// is half the acquire timeout (these same values for the default timeouts).
var priorityAgeDefaults = [numLanes]time.Duration{Short: 500 * time.Millisecond, Tx: 5 * time.Second, Long: 15 * time.Second}

// resolvePriority fills in the lane's PriorityAge default: half its acquire timeout. The age is
// how long a caller may be overtaken. Longer than the acquire timeout, overtaking would end in a
// timeout, which is starvation by another name; much shorter, ageing serves the low-priority
// queue in arrival order as soon as it is that deep, and high priorities stop helping exactly
// under the overload they are for (with Short's 1s timeout, a tenth would give up at a queue of
// 100ms). Half leaves a caller moved to the front by ageing the other half of its timeout for
// the callers that came before it (docs/design.md, "Priorities and ageing"). A fixed default
// per lane without an acquire timeout.
//
// It also fills in PriorityHeadroom: by default one connection in Short and Tx, when the lane
// orders by priority and its cap is at least 2 (docs/design.md, "The headroom").
func (lc *LaneConfig) resolvePriority(l Lane) {
	if lc.PriorityAge == 0 {
		lc.PriorityAge = priorityAgeDefaults[l]
		if lc.AcquireTimeout > 0 {
			lc.PriorityAge = lc.AcquireTimeout / 2
		}
	}
	if lc.PriorityHeadroom == 0 {
		lc.PriorityHeadroom = Off
		if l != Long && lc.PriorityAge > 0 && lc.MaxConns >= 2 {
			lc.PriorityHeadroom = 1
		}
	}
}

// checkPriority validates the priority and tag-share settings; bad names the field.
func (lc *LaneConfig) checkPriority(l Lane, bad func(field, format string, args ...any) error) error {
	if lc.PriorityAge < 0 && lc.PriorityAge != Off {
		return bad("PriorityAge", "must be positive, zero for the default, or Off; got %v", lc.PriorityAge)
	}
	if l != Tx && (lc.MaxTagShare != 0 || lc.TagShareDryRun) {
		field := "MaxTagShare"
		if lc.MaxTagShare == 0 {
			field = "TagShareDryRun"
		}
		return bad(field, "is Tx's alone: Short's and Long's work is bounded by their own caps and timeouts")
	}
	if s := lc.MaxTagShare; s != Off && (s < 0 || s > 1 || math.IsNaN(s)) {
		return bad("MaxTagShare", "must be a fraction of Tx's cap above 0 and at most 1, zero or Off for none; got %v", s)
	}
	if lc.TagShareDryRun && lc.MaxTagShare <= 0 {
		return bad("TagShareDryRun", "needs MaxTagShare (lane_tx_max_tag_share): it reports what that share would refuse")
	}
	return nil
}

// tagShareSlots is the most connections of the lane one tag may hold while another tag waits,
// for reserve: the share of the lane's cap, at least one; 0 for none.
func (lc *LaneConfig) tagShareSlots() int {
	if lc.MaxTagShare <= 0 {
		return 0
	}
	return max(1, int(lc.MaxTagShare*float64(lc.MaxConns)))
}

// setShareParam parses lane_tx_max_tag_share (a fraction; 0 for none) and
// lane_tx_tag_share_dry_run (true or false).
func setShareParam(lc *LaneConfig, key, setting, v string) error {
	if setting == "tag_share_dry_run" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("pgxlanes: DSN parameter %s: %q is not true or false", key, v)
		}
		lc.TagShareDryRun = on
		return nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > 1 {
		return fmt.Errorf("pgxlanes: DSN parameter %s: %q is not a fraction from 0 to 1 (0.5 is half of Tx's cap; 0 turns it off)", key, v)
	}
	if f == 0 {
		f = Off
	}
	lc.MaxTagShare = f
	return nil
}

// shareLog rate-limits the log lines of the tag share to one a second per pool.
type shareLog struct {
	last atomic.Int64 // UnixNano of the last line
}

// heldBack logs that a caller of tag was passed over in lane l because its tag held the lane's
// share (in dry run: would have been), at most once a second. The count is in LaneStat.
func (p *Pool) heldBack(rt route, waited time.Duration) {
	now := time.Now().UnixNano()
	last := p.shareLog.last.Load()
	if now-last < int64(time.Second) || !p.shareLog.last.CompareAndSwap(last, now) {
		return
	}
	lc := &p.lanes[rt.lane].cfg
	msg := "pgxlanes: caller held back by the tag share: its tag held its share of the lane while other tags waited"
	if lc.TagShareDryRun {
		msg = "pgxlanes: dry run: the tag share would have held this caller back: its tag held its share of the lane while other tags waited"
	}
	p.obs.logger.LogAttrs(context.Background(), slog.LevelWarn, msg, slog.String("lane", rt.lane.String()), slog.String("tag", rt.tag),
		slog.Float64("max_tag_share", lc.MaxTagShare), slog.Int("max_tag_conns", lc.tagShareSlots()), slog.Duration("waited", waited))
}

// caller is what reserve needs to know of a call to order its lane's queue.
func (rt route) caller() reserve.Caller {
	return reserve.Caller{Priority: int(rt.prio), Tag: rt.tag}
}
