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
//
// A label value must be valid UTF-8. A tag that is not (from a tag list read from configuration,
// say) gets as its label value the tag with each invalid byte sequence replaced by U+FFFD
// (strings.ToValidUTF8), and a call's tag is matched by its label value the same way: calls
// tagged with that tag are counted under that value, with no panic and no sample lost. Tags whose
// label values are the same share their series; so do the tags "none" and "other", with the calls
// without a tag and those whose tag is not on the list (name a tag otherwise to count it apart).
func WithTags(tags ...string) Option {
	return func(o *options) { o.tags = append(o.tags, tags...) }
}
