package otelmetrics

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// Attribute keys of the retry counters: the code a retried error had (a SQLSTATE, conn,
// acquire_timeout, lane_full) and why RetryTx gave up.
const (
	RetryCodeKey   = attribute.Key("pgxlanes.retry.code")
	RetryReasonKey = attribute.Key("pgxlanes.retry.reason")
)

// The retry counters' names. The conventions have none for retries, so they are pgxlanes'.
const (
	retryAttemptsName = "pgxlanes.retry.attempts"
	retryRetriesName  = "pgxlanes.retry.retries"
	retryGaveUpName   = "pgxlanes.retry.gave_up"
	retryUnknownName  = "pgxlanes.retry.commit_unknown"
)

// retryCounters count pgxlanes.RetryTx's attempts, per lane (no tag: OpenTelemetry has no
// allow-list here, and a tag must not raise the number of series). The per-lane options are made
// in Register; a code or reason adds one attribute to them per event, which is off the hot path
// (one event per transaction attempt).
type retryCounters struct {
	attempts, retries, gaveUp, unknown metric.Int64Counter
	lane                               [][]attribute.KeyValue // per lane: the pool name and the lane
	laneOpts                           []metric.AddOption
}

func newRetryCounters(m metric.Meter, name attribute.KeyValue, lanes []pgxlanes.Lane) (*retryCounters, error) {
	var errs []error
	counter := func(n, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(n, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, fmt.Errorf("otelmetrics: %s: %w", n, err))
		}
		return c
	}
	r := &retryCounters{
		attempts: counter(retryAttemptsName, "{attempt}", "Transactions run by RetryTx, every attempt counted, the first included."),
		retries:  counter(retryRetriesName, "{attempt}", "Attempts of RetryTx that failed with a retryable error and ran again, by pgxlanes.retry.code."),
		gaveUp:   counter(retryGaveUpName, "{call}", "Calls of RetryTx stopped by a cap with a retryable error, by pgxlanes.retry.reason."),
		unknown:  counter(retryUnknownName, "{call}", "Calls of RetryTx whose COMMIT had an unknown outcome: returned, never retried."),
	}
	for _, l := range lanes {
		kvs := []attribute.KeyValue{name, LaneKey.String(l.String())}
		r.lane = append(r.lane, kvs)
		r.laneOpts = append(r.laneOpts, metric.WithAttributeSet(attribute.NewSet(kvs...)))
	}
	return r, errors.Join(errs...)
}

// ObserveRetry counts one attempt of RetryTx.
func (ob *observer) ObserveRetry(e pgxlanes.RetryEvent) {
	r := ob.retry
	if r == nil || int(e.Lane) >= len(r.lane) {
		return
	}
	ctx := context.Background()
	r.attempts.Add(ctx, 1, r.laneOpts[e.Lane])
	with := func(kv attribute.KeyValue) metric.AddOption {
		return metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue(nil), r.lane[e.Lane]...), kv)...))
	}
	switch e.Outcome {
	case pgxlanes.RetryWillRetry:
		r.retries.Add(ctx, 1, with(RetryCodeKey.String(e.Code)))
	case pgxlanes.RetryGaveUp:
		r.gaveUp.Add(ctx, 1, with(RetryReasonKey.String(e.Reason)))
	case pgxlanes.RetryCommitUnknown:
		r.unknown.Add(ctx, 1, r.laneOpts[e.Lane])
	}
}

var _ pgxlanes.RetryObserver = (*observer)(nil)
