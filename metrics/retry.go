package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// retryMetrics count the attempts of pgxlanes.RetryTx, fed by the observer's ObserveRetry. Their
// series of every lane and tag value (and of the default codes and every reason) exist from the
// start at 0; a code the application added to RetryOptions.RetryCodes gets its series at its
// first retry. The codes are bounded by the application's options, never by the traffic.
type retryMetrics struct {
	attempts, retries, gaveUp, unknown *prometheus.CounterVec
}

// retryCodes are the codes whose series exist from the start.
var retryCodes = append(pgxlanes.DefaultRetryCodes(), pgxlanes.RetryCodeConn)

var retryReasons = []string{pgxlanes.RetryReasonMaxAttempts, pgxlanes.RetryReasonMaxElapsed,
	pgxlanes.RetryReasonDeadline, pgxlanes.RetryReasonCanceled}

// newRetryMetrics makes the counters with the histograms' labels (lane, and tag with WithTags),
// and the series of every lane and tag value.
func newRetryMetrics(lanes []pgxlanes.Lane, labels, tagValues []string, constLabels prometheus.Labels) *retryMetrics {
	vec := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: constLabels},
			append(append([]string(nil), labels...), extra...))
	}
	m := &retryMetrics{
		attempts: vec("pgxlanes_retry_attempts_total",
			"Transactions run by RetryTx, each attempt counted, the first included."),
		retries: vec("pgxlanes_retry_retries_total",
			"Attempts of RetryTx that failed with a retryable error and were run again, by the error's code: a SQLSTATE, conn, acquire_timeout or lane_full.", "code"),
		gaveUp: vec("pgxlanes_retry_gave_up_total",
			"Calls of RetryTx that returned a retryable error because a cap stopped them, by reason: max_attempts, max_elapsed, deadline, canceled.", "reason"),
		unknown: vec("pgxlanes_retry_commit_unknown_total",
			"Calls of RetryTx whose Commit failed with an unknown outcome (connection lost or ctx ended during COMMIT): returned, never retried."),
	}
	for _, l := range lanes {
		for _, tv := range tagValues {
			lv := []string{l.String()}
			if len(labels) > 1 {
				lv = append(lv, tv)
			}
			m.attempts.WithLabelValues(lv...)
			m.unknown.WithLabelValues(lv...)
			for _, c := range retryCodes {
				m.retries.WithLabelValues(append(lv, c)...)
			}
			for _, r := range retryReasons {
				m.gaveUp.WithLabelValues(append(lv, r)...)
			}
		}
	}
	return m
}

func (m *retryMetrics) describe(ch chan<- *prometheus.Desc) {
	m.attempts.Describe(ch)
	m.retries.Describe(ch)
	m.gaveUp.Describe(ch)
	m.unknown.Describe(ch)
}

func (m *retryMetrics) collect(ch chan<- prometheus.Metric) {
	m.attempts.Collect(ch)
	m.retries.Collect(ch)
	m.gaveUp.Collect(ch)
	m.unknown.Collect(ch)
}

// ObserveRetry counts one attempt of RetryTx. It is off the hot path (one event per transaction
// attempt, which took round trips), so it resolves its series by label values.
func (ob *observer) ObserveRetry(e pgxlanes.RetryEvent) {
	if int(e.Lane) >= len(ob.series) {
		return
	}
	lv := []string{e.Lane.String()}
	if ob.tagIndex != nil {
		lv = append(lv, ob.tagValues[ob.tagSlot(e.Tag)])
	}
	m := ob.retry
	m.attempts.WithLabelValues(lv...).Inc()
	switch e.Outcome {
	case pgxlanes.RetryWillRetry:
		m.retries.WithLabelValues(append(lv, e.Code)...).Inc()
	case pgxlanes.RetryGaveUp:
		m.gaveUp.WithLabelValues(append(lv, e.Reason)...).Inc()
	case pgxlanes.RetryCommitUnknown:
		m.unknown.WithLabelValues(lv...).Inc()
	}
}

var _ pgxlanes.RetryObserver = (*observer)(nil)
