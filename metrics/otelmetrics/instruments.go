package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgxlanes/pgxlanes/pgxlanes"
)

// ScopeName is the name of the meter the instruments are made with.
const ScopeName = "github.com/pgxlanes/pgxlanes/metrics/otelmetrics"

// Attribute keys. PoolNameKey, StateKey and ErrorTypeKey are the conventions'; LaneKey is
// pgxlanes'.
const (
	PoolNameKey  = attribute.Key("db.client.connection.pool.name")
	StateKey     = attribute.Key("db.client.connection.state")
	ErrorTypeKey = attribute.Key("error.type")
	LaneKey      = attribute.Key("pgxlanes.lane")
)

// The instruments' names, units and descriptions, as the conventions define them.
const (
	countName, countUnit, countDesc       = "db.client.connection.count", "{connection}", "The number of connections that are currently in state described by the `state` attribute."
	idleMaxName, idleMaxDesc              = "db.client.connection.idle.max", "The maximum number of idle open connections allowed."
	idleMinName, idleMinDesc              = "db.client.connection.idle.min", "The minimum number of idle open connections allowed."
	maxName, maxDesc                      = "db.client.connection.max", "The maximum number of open connections allowed."
	pendingName, pendingUnit, pendingDesc = "db.client.connection.pending_requests", "{request}", "The number of current pending requests for an open connection."
	timeoutsName, timeoutsUnit            = "db.client.connection.timeouts", "{timeout}"
	timeoutsDesc                          = "The number of connection timeouts that have occurred trying to obtain a connection from the pool."
	createName, createDesc                = "db.client.connection.create_time", "The time it took to create a new connection."
	waitName, waitDesc                    = "db.client.connection.wait_time", "The time it took to obtain an open connection from the pool."
	useName, useDesc                      = "db.client.connection.use_time", "The time between borrowing a connection and returning it to the pool."
	seconds                               = "s"

	// pgxlanes' own, outside the conventions.
	holdP99Name, holdP99Desc = "pgxlanes.lane.hold.p99", "The 99th percentile of the lane's hold times over the last one to two minutes."
	advisedName, advisedDesc = "pgxlanes.lane.advised_timeout", "The timeout the design notes advise for the lane's work: 3 × its observed hold p99."
)

// Bucket boundaries of the histograms, in seconds, given to the SDK as advice: those of the
// Prometheus package, from 100 µs (a free connection) to 30 s, and for use_time on to 15 minutes
// (a Long lane lease). A View can override them.
var (
	waitBuckets   = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	useBuckets    = append(append([]float64(nil), waitBuckets...), 60, 300, 900)
	createBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
)

// errorTypes are the values of error.type on a failed acquire, by outcome (see outcome).
var errorTypes = [...]string{"", "timeout", "lane_full", "canceled", "_OTHER"}

// outcome returns the index in errorTypes of an acquire's error.
func outcome(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, pgxlanes.ErrAcquireTimeout):
		return 1
	case errors.Is(err, pgxlanes.ErrLaneFull):
		return 2
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return 3
	}
	return 4
}

// histogram makes a float64 histogram in seconds.
func histogram(m metric.Meter, name, desc string, buckets []float64) (metric.Float64Histogram, error) {
	h, err := m.Float64Histogram(name, metric.WithUnit(seconds), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(buckets...))
	if err != nil {
		return nil, fmt.Errorf("otelmetrics: %s: %w", name, err)
	}
	return h, nil
}

// defaultPoolName is the name the conventions ask for when the pool has none:
// server.address:server.port/db.namespace.
func defaultPoolName(host string, port uint16, database string) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port))) + "/" + database
}
