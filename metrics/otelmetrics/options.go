package otelmetrics

import (
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

// Option configures Register and NewConnectTracer.
type Option func(*options) error

type options struct {
	provider metric.MeterProvider
	poolName string
}

// WithMeterProvider sets the MeterProvider the instruments are made with. Default: the global
// one, otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) error {
		if mp == nil {
			return errors.New("otelmetrics: WithMeterProvider: the MeterProvider is nil")
		}
		o.provider = mp
		return nil
	}
}

// WithPoolName sets db.client.connection.pool.name, which the conventions require to be unique
// within the application. Default: "host:port/database" of the pool's configuration.
func WithPoolName(name string) Option {
	return func(o *options) error {
		if name == "" {
			return errors.New("otelmetrics: WithPoolName: the name is empty")
		}
		o.poolName = name
		return nil
	}
}

func newOptions(opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		if opt == nil {
			return o, errors.New("otelmetrics: an Option is nil")
		}
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	if o.provider == nil {
		o.provider = otel.GetMeterProvider()
	}
	return o, nil
}
