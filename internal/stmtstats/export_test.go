package stmtstats

// NoRelative turns the relative rule off, for tests of the fraction alone.
func NoRelative(t *Table) { t.relativeDisabledTest = true }
