package pgxlanestest

import "time"

// SetCloseTimeout sets the bound on a pool's Close at the end of a test, and returns a func that
// restores it.
func SetCloseTimeout(d time.Duration) (restore func()) {
	old := closeTimeout
	closeTimeout = d
	return func() { closeTimeout = old }
}
