//go:build !race

package conformance

// raceEnabled says whether this test binary was built with -race; the test binaries it builds
// follow it.
const raceEnabled = false
