package metrics

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Tag label values for calls without a tag and for tags outside the allow-list.
const (
	tagNone  = "none"
	tagOther = "other"
)

// observer turns the pool's acquire and release events into the two histograms, the only
// metrics a Stat snapshot cannot give. Every series it touches on the hot path is resolved in
// newObserver, so an event costs a map lookup (with tags), a few atomic adds and no allocation.
type observer struct {
	// tagIndex maps the label value of an allow-listed tag (tagLabel) to its index in
	// series[lane] and tagValues; nil when the histograms have no tag label, in which case every
	// event uses index 0.
	tagIndex  map[string]int
	tagValues []string // the tag label values, by index
	// series[lane][tag] holds the resolved series of one lane and tag value.
	series [][]laneSeries
	// byPriority[lane][level] is the wait series of one lane and priority level
	// (pgxlanes.Priority.Level, in the order of pgxlanes.PriorityLevels).
	byPriority [][]prometheus.Observer

	wait, hold, prio *prometheus.HistogramVec
	retry            *retryMetrics // RetryTx's counters (retry.go)
}

// laneSeries are the series of one lane and tag value.
type laneSeries struct {
	wait, hold prometheus.Observer
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
			t = tagLabel(t)
			if _, dup := tagIndex[t]; dup || t == "" {
				continue
			}
			tagIndex[t] = len(tagValues)
			tagValues = append(tagValues, t)
		}
	}
	ob := &observer{
		tagIndex:  tagIndex,
		tagValues: tagValues,
		wait: prometheus.NewHistogramVec(histogramOpts("pgxlanes_acquire_wait_seconds",
			"Time from the call to a ready connection, of every acquire: successful, timed out, rejected or cancelled.",
			waitBuckets, constLabels), labels),
		hold: prometheus.NewHistogramVec(histogramOpts("pgxlanes_hold_seconds",
			"Time a lease held its connection, from ready to released (rows closed, transaction ended, connection released).",
			holdBuckets, constLabels), labels),
		prio: prometheus.NewHistogramVec(histogramOpts("pgxlanes_acquire_wait_by_priority_seconds",
			"Time from the call to a ready connection, of every acquire, by the call's priority level (WithPriority): low, normal, high, critical.",
			waitBuckets, constLabels), []string{"lane", "priority"}),
	}
	levels := pgxlanes.PriorityLevels()
	ob.byPriority = make([][]prometheus.Observer, len(lanes))
	for _, l := range lanes {
		ob.byPriority[l] = make([]prometheus.Observer, len(levels))
		for i, lv := range levels {
			ob.byPriority[l][i] = ob.prio.WithLabelValues(l.String(), lv)
		}
	}
	ob.series = make([][]laneSeries, len(lanes))
	for _, l := range lanes {
		ob.series[l] = make([]laneSeries, len(tagValues))
		for ti, tv := range tagValues {
			lv := []string{l.String()}
			if tagIndex != nil {
				lv = append(lv, tv)
			}
			ob.series[l][ti] = laneSeries{wait: ob.wait.WithLabelValues(lv...), hold: ob.hold.WithLabelValues(lv...)}
		}
	}
	ob.retry = newRetryMetrics(lanes, labels, tagValues, constLabels)
	return ob
}

// tagLabel is the label value of an allow-listed tag or of a call's tag: the tag, with every
// byte sequence that is not valid UTF-8 replaced by U+FFFD (Prometheus panics on a label value
// that is not valid UTF-8).
func tagLabel(tag string) string {
	if utf8.ValidString(tag) {
		return tag
	}
	return strings.ToValidUTF8(tag, "\uFFFD")
}

// tagSlot returns the index in series[lane] and tagValues of a call's tag: 0 (none, or the only
// series without a tag label) for no tag, the tag's own for an allow-listed one, 1 (other) for
// any other.
func (ob *observer) tagSlot(tag string) int {
	if ob.tagIndex == nil || tag == "" {
		return 0
	}
	if i, ok := ob.tagIndex[tag]; ok {
		return i
	}
	if !utf8.ValidString(tag) { // matched by its label value, as the allow-list was
		if i, ok := ob.tagIndex[tagLabel(tag)]; ok {
			return i
		}
	}
	return 1 // other
}

// lookup returns the series of lane l and tag, or nil for a lane the collector does not know
// (the pool never reports one).
func (ob *observer) lookup(l pgxlanes.Lane, tag string) *laneSeries {
	if int(l) >= len(ob.series) {
		return nil
	}
	return &ob.series[l][ob.tagSlot(tag)]
}

// ObserveAcquire records the wait of every acquire, whatever its outcome: leaving the failures
// out would hide starvation. The outcomes are counted by the pool (LaneStat).
func (ob *observer) ObserveAcquire(e pgxlanes.AcquireEvent) {
	if s := ob.lookup(e.Lane, e.Tag); s != nil {
		s.wait.Observe(e.Wait.Seconds())
		ob.byPriority[e.Lane][levelIndex(e.Priority)].Observe(e.Wait.Seconds())
	}
}

// levelIndex is the index of p's level in pgxlanes.PriorityLevels.
func levelIndex(p pgxlanes.Priority) int {
	switch {
	case p < pgxlanes.PriorityNormal:
		return 0
	case p < pgxlanes.PriorityHigh:
		return 1
	case p < pgxlanes.PriorityCritical:
		return 2
	}
	return 3
}

// ObserveRelease records the hold time of a lease.
func (ob *observer) ObserveRelease(e pgxlanes.ReleaseEvent) {
	if s := ob.lookup(e.Lane, e.Tag); s != nil {
		s.hold.Observe(e.Hold.Seconds())
	}
}

var _ pgxlanes.Observer = (*observer)(nil)
