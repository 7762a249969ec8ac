package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Tag label values for calls without a tag and for tags outside the allow-list.
const (
	tagNone  = "none"
	tagOther = "other"
)

// actions are the budget actions, in the order of their series in laneSeries.violations.
var actions = [...]pgxlanes.Action{pgxlanes.ActionFlag, pgxlanes.ActionCancel, pgxlanes.ActionTerminate}

// observer turns the pool's events into histogram observations and counter increments. Every
// series it touches on the hot path is resolved in newObserver, so an event costs a few atomic
// adds and no allocation.
type observer struct {
	// tagIndex maps an allow-listed tag to its index in series[lane]; nil when the metrics have
	// no tag label, in which case every event uses index 0.
	tagIndex map[string]int
	// series[lane][tag] holds the resolved series of one lane and tag value.
	series [][]laneSeries

	wait, hold                                     *prometheus.HistogramVec
	acquires, timeouts, rejections, cancels, fails *prometheus.CounterVec
	warnings, violations                           *prometheus.CounterVec
}

// laneSeries are the series of one lane and tag value.
type laneSeries struct {
	wait, hold prometheus.Observer

	acquires, timeouts, rejections, cancels, fails prometheus.Counter
	warnings                                       prometheus.Counter
	violations                                     [len(actions)]prometheus.Counter
}

// waitBuckets resolve acquire waits from 100 µs (a free connection) to 30 s (beyond any sane
// acquire timeout).
var waitBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// holdBuckets are waitBuckets plus minutes, because a Long lane lease may last that long.
var holdBuckets = append(append([]float64(nil), waitBuckets...), 60, 300, 900)

// histogramOpts returns the options of a histogram with both classic buckets and a native
// histogram: a native bucket is at most 10 % wide, and at most 160 buckets are kept.
func histogramOpts(name, help string, buckets []float64, constLabels prometheus.Labels) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{
		Name: name, Help: help, ConstLabels: constLabels, Buckets: buckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}
}

func newObserver(lanes []pgxlanes.Lane, o *options, constLabels prometheus.Labels) *observer {
	labels := []string{"lane"}
	tagValues := []string{""}
	var tagIndex map[string]int
	if len(o.tags) > 0 {
		labels = append(labels, "tag")
		tagValues = []string{tagNone, tagOther}
		tagIndex = map[string]int{tagNone: 0, tagOther: 1}
		for _, t := range o.tags {
			if _, dup := tagIndex[t]; dup || t == "" {
				continue
			}
			tagIndex[t] = len(tagValues)
			tagValues = append(tagValues, t)
		}
	}
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: constLabels},
			append(append([]string(nil), labels...), extra...))
	}
	ob := &observer{
		tagIndex: tagIndex,
		wait: prometheus.NewHistogramVec(histogramOpts("pgxlanes_acquire_wait_seconds",
			"Time from the call to a ready connection, of every acquire: successful, timed out, rejected or cancelled.",
			waitBuckets, constLabels), labels),
		hold: prometheus.NewHistogramVec(histogramOpts("pgxlanes_hold_seconds",
			"Time a lease held its connection, from ready to released (rows closed, transaction ended, connection released).",
			holdBuckets, constLabels), labels),
		acquires:   counter("pgxlanes_acquires_total", "Successful acquires."),
		timeouts:   counter("pgxlanes_acquire_timeouts_total", "Acquires that failed because the lane's acquire timeout ran out (ErrAcquireTimeout)."),
		rejections: counter("pgxlanes_acquire_rejections_total", "Acquires refused at once because the lane's wait queue was full (ErrLaneFull)."),
		cancels:    counter("pgxlanes_acquire_cancellations_total", "Acquires abandoned because the caller's context was cancelled or its deadline passed."),
		fails:      counter("pgxlanes_acquire_errors_total", "Acquires that failed for any other reason: pool closed, connection or session setup error."),
		warnings:   counter("pgxlanes_budget_warnings_total", "Leases that passed half their budget, a warning before they are cancelled or terminated at the budget."),
		violations: counter("pgxlanes_budget_violations_total", "Leases that exceeded their budget, by the action taken (flag, cancel, terminate)."+
			" A lease that is cancelled and later terminated counts once for each.", "action"),
	}
	ob.series = make([][]laneSeries, len(lanes))
	for _, l := range lanes {
		ob.series[l] = make([]laneSeries, len(tagValues))
		for ti, tv := range tagValues {
			lv := []string{l.String()}
			if tagIndex != nil {
				lv = append(lv, tv)
			}
			s := &ob.series[l][ti]
			s.wait = ob.wait.WithLabelValues(lv...)
			s.hold = ob.hold.WithLabelValues(lv...)
			s.acquires = ob.acquires.WithLabelValues(lv...)
			s.timeouts = ob.timeouts.WithLabelValues(lv...)
			s.rejections = ob.rejections.WithLabelValues(lv...)
			s.cancels = ob.cancels.WithLabelValues(lv...)
			s.fails = ob.fails.WithLabelValues(lv...)
			s.warnings = ob.warnings.WithLabelValues(lv...)
			for ai, a := range actions {
				s.violations[ai] = ob.violations.WithLabelValues(append(lv, a.String())...)
			}
		}
	}
	return ob
}

// collectors are the vectors the observer feeds, for the collector's Describe and Collect.
func (ob *observer) collectors() []prometheus.Collector {
	return []prometheus.Collector{ob.wait, ob.hold, ob.acquires, ob.timeouts, ob.rejections, ob.cancels, ob.fails,
		ob.warnings, ob.violations}
}

// lookup returns the series of lane l and tag, or nil for a lane the collector does not know
// (the pool never reports one).
func (ob *observer) lookup(l pgxlanes.Lane, tag string) *laneSeries {
	if int(l) >= len(ob.series) {
		return nil
	}
	ti := 0
	if ob.tagIndex != nil && tag != "" {
		i, ok := ob.tagIndex[tag]
		if !ok {
			i = 1 // other
		}
		ti = i
	}
	return &ob.series[l][ti]
}

// ObserveAcquire records the wait of every acquire and counts its outcome.
func (ob *observer) ObserveAcquire(e pgxlanes.AcquireEvent) {
	s := ob.lookup(e.Lane, e.Tag)
	if s == nil {
		return
	}
	s.wait.Observe(e.Wait.Seconds())
	switch err := e.Err; {
	case err == nil:
		s.acquires.Inc()
	case errors.Is(err, pgxlanes.ErrAcquireTimeout):
		s.timeouts.Inc()
	case errors.Is(err, pgxlanes.ErrLaneFull):
		s.rejections.Inc()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		s.cancels.Inc()
	default:
		s.fails.Inc()
	}
}

// ObserveRelease records the hold time of a lease.
func (ob *observer) ObserveRelease(e pgxlanes.ReleaseEvent) {
	if s := ob.lookup(e.Lane, e.Tag); s != nil {
		s.hold.Observe(e.Hold.Seconds())
	}
}

// ObserveViolation counts a budget violation by its action. The pool also reports the warning
// a lease of a cancel or terminate lane gets at half its budget (Violation.Warning): that one is
// counted as a warning, not a violation, so that a violation counts a lease over its budget.
func (ob *observer) ObserveViolation(v pgxlanes.Violation) {
	s := ob.lookup(v.Lane, v.Tag)
	if s == nil {
		return
	}
	if v.Warning {
		s.warnings.Inc()
		return
	}
	for i, a := range actions {
		if a == v.Action {
			s.violations[i].Inc()
			return
		}
	}
	// An action added to pgxlanes after this package was written: count it all the same, on the
	// slow path (violations are rare).
	lv := []string{v.Lane.String()}
	if ob.tagIndex != nil {
		lv = append(lv, ob.tagValue(v.Tag))
	}
	ob.violations.WithLabelValues(append(lv, v.Action.String())...).Inc()
}

// tagValue returns the label value for tag.
func (ob *observer) tagValue(tag string) string {
	if tag == "" {
		return tagNone
	}
	if _, ok := ob.tagIndex[tag]; ok {
		return tag
	}
	return tagOther
}

var (
	_ pgxlanes.Observer          = (*observer)(nil)
	_ pgxlanes.ViolationObserver = (*observer)(nil)
)
