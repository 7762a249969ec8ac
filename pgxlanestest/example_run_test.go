package pgxlanestest_test

import "testing"

// TestExample runs the test of the package's Example.
func TestExample(t *testing.T) { lookupsStayFastDuringTransferStorm(t) }
