package metrics

// Option configures NewCollector.
type Option func(*options)

type options struct {
	poolName string
	tags     []string
}

// WithPoolName sets the value of the constant label pool on every metric, so that several pools
// can be registered with one registry. Default "default".
func WithPoolName(name string) Option {
	return func(o *options) { o.poolName = name }
}

// WithTags adds a tag label to the two histograms (acquire wait, hold time) and to RetryTx's
// counters (pgxlanes_retry_*): a call tagged with
// pgxlanes.WithTag gets its tag as the label value when the tag is in this allow-list, "other"
// when it is not, and "none" when it has no tag. The list is fixed here so that no caller can
// raise the number of series. Counts per tag are the histograms' _count series; the counters,
// read from the pool's Stat, are per lane only. Without WithTags (or with an empty list) no
// metric has a tag label.
func WithTags(tags ...string) Option {
	return func(o *options) { o.tags = append(o.tags, tags...) }
}
