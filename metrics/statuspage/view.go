package statuspage

import (
	"time"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// page is what the HTML template renders and what ?format=json writes. Durations are in
// milliseconds in the JSON; the fields tagged "-" are the HTML's formatting.
type page struct {
	Name           string         `json:"pool"`
	Taken          string         `json:"taken"`
	Lanes          []laneView     `json:"lanes"`
	Leases         []leaseView    `json:"leases"`
	HeldLeases     int            `json:"held_leases"` // Tx and Long leases held now; Leases lists the longest-held
	LockLookup     bool           `json:"-"`
	LockWaits      []lockWaitView `json:"lock_waits"`
	LockWaitsError string         `json:"lock_waits_error,omitempty"`
	Learning       learningView   `json:"learning"`
	Statements     []stmtView     `json:"statements"`
	Actions        []actionView   `json:"budget_actions"`
	ActionsTotal   int64          `json:"budget_actions_total"`
	MoreActions    bool           `json:"-"` // ActionsTotal > len(Actions)
	RefreshS       int            `json:"-"`
}

type laneView struct {
	Lane             string  `json:"lane"`
	InUse            int     `json:"in_use"`
	Borrowed         int     `json:"borrowed"`
	Cleaning         int     `json:"cleaning"`
	Reserved         int     `json:"reserved"`
	MaxConns         int     `json:"max_conns"`
	Waiting          int     `json:"waiting"`
	MaxWaiters       int     `json:"max_waiters"`
	OldestWaitMS     float64 `json:"oldest_wait_ms"`
	AcquireTimeoutMS float64 `json:"acquire_timeout_ms"`
	Timeouts         int64   `json:"timeouts_total"`
	Rejections       int64   `json:"rejections_total"`

	// For the HTML: the bar's parts in percent of the cap, the reserve's mark, and the oldest
	// wait's share of the acquire timeout.
	ReservePct  float64 `json:"-"`
	OwnPct      float64 `json:"-"`
	BorrowedPct float64 `json:"-"`
	OldestWait  string  `json:"-"`
	Timeout     string  `json:"-"`
	WaitLevel   string  `json:"-"` // "", "warn" (past half the acquire timeout), "bad" (past 90 %)
}

func newLaneView(l pgxlanes.LaneStat, acquireTimeout time.Duration) laneView {
	v := laneView{Lane: l.Lane.String(), InUse: l.InUse, Borrowed: l.Borrowed, Cleaning: l.Cleaning, Reserved: l.Reserved,
		MaxConns: l.MaxConns, Waiting: l.Waiting, MaxWaiters: l.MaxWaiters, OldestWaitMS: ms(l.OldestWait),
		AcquireTimeoutMS: ms(acquireTimeout), Timeouts: l.Timeouts, Rejections: l.Rejections,
		OldestWait: fmtDur(l.OldestWait), Timeout: fmtDur(acquireTimeout)}
	if l.MaxConns > 0 {
		c := float64(l.MaxConns)
		v.ReservePct = 100 * float64(min(l.Reserved, l.MaxConns)) / c
		v.OwnPct = 100 * float64(min(l.InUse-l.Borrowed, l.MaxConns)) / c
		v.BorrowedPct = 100 * float64(min(l.Borrowed, l.MaxConns)) / c
	}
	if acquireTimeout > 0 {
		switch share := float64(l.OldestWait) / float64(acquireTimeout); {
		case share >= 0.9:
			v.WaitLevel = "bad"
		case share >= 0.5:
			v.WaitLevel = "warn"
		}
	}
	return v
}

type leaseView struct {
	Lane      string  `json:"lane"`
	Tag       string  `json:"tag"`
	Kind      string  `json:"kind"`
	PID       uint32  `json:"pid"`
	AgeMS     float64 `json:"age_ms"`
	BudgetMS  float64 `json:"budget_ms"` // 0: no budget
	OverAt    string  `json:"over_budget"`
	Flagged   bool    `json:"flagged"`
	Violation string  `json:"action_taken,omitempty"`
	CallSite  string  `json:"call_site,omitempty"`

	Age    string `json:"-"`
	Budget string `json:"-"`
	Level  string `json:"-"` // "", "warn" (past half its budget), "bad" (over it)
	Pct    int    `json:"-"` // age in percent of the budget, capped at 9999
}

func newLeaseView(l pgxlanes.LeaseStatus) leaseView {
	v := leaseView{Lane: l.Lane.String(), Tag: l.Tag, Kind: l.Kind, PID: l.PID, AgeMS: ms(l.Age), BudgetMS: ms(l.Budget),
		Flagged: l.Flagged, Violation: l.Violation, CallSite: l.CallSite, Age: fmtDur(l.Age), Budget: "none"}
	if l.Budget > 0 {
		v.Budget = fmtDur(l.Budget)
		v.OverAt = l.Action.String()
		share := float64(l.Age) / float64(l.Budget)
		v.Pct = int(min(share*100, 9999))
		switch {
		case share >= 1:
			v.Level = "bad"
		case share >= 0.5:
			v.Level = "warn"
		}
	}
	return v
}

type lockWaitView struct {
	Waiter          uint32     `json:"waiter_pid"`
	WaitedMS        float64    `json:"waited_ms"`
	WaiterLease     *leaseView `json:"waiter_lease,omitempty"`
	Holder          uint32     `json:"holder_pid"`
	HolderState     string     `json:"holder_state"`
	HolderXactAgeMS float64    `json:"holder_xact_age_ms"`
	HolderLease     *leaseView `json:"holder_lease,omitempty"`
}

// Waited and HolderXactAge format for the HTML.
func (v lockWaitView) Waited() string {
	return fmtDur(time.Duration(v.WaitedMS * float64(time.Millisecond)))
}
func (v lockWaitView) HolderXactAge() string {
	return fmtDur(time.Duration(v.HolderXactAgeMS * float64(time.Millisecond)))
}

type learningView struct {
	On          bool    `json:"on"`
	ThresholdMS float64 `json:"threshold_ms"`
	Demoted     int     `json:"demoted_now"`
	Demotions   int64   `json:"demotions_total"`
	Promotions  int64   `json:"promotions_total"`
	Tracked     int     `json:"tracked"`
}

// Threshold formats for the HTML.
func (v learningView) Threshold() string {
	return fmtDur(time.Duration(v.ThresholdMS * float64(time.Millisecond)))
}

type stmtView struct {
	At      string `json:"at"`
	Ago     string `json:"-"`
	SQL     string `json:"sql"`
	Demoted bool   `json:"demoted"`
}

type actionView struct {
	At        string  `json:"at"`
	Ago       string  `json:"-"`
	Lane      string  `json:"lane"`
	Tag       string  `json:"tag"`
	Action    string  `json:"action"` // warning, flag, cancel or terminate
	PID       uint32  `json:"pid"`
	BudgetMS  float64 `json:"budget_ms"`
	ElapsedMS float64 `json:"elapsed_ms"`
	CallSite  string  `json:"call_site,omitempty"`
	Err       string  `json:"error,omitempty"`
}

// Budget and Elapsed format for the HTML.
func (v actionView) Budget() string {
	return fmtDur(time.Duration(v.BudgetMS * float64(time.Millisecond)))
}
func (v actionView) Elapsed() string {
	return fmtDur(time.Duration(v.ElapsedMS * float64(time.Millisecond)))
}
