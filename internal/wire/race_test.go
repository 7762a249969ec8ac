//go:build race

package wire_test

// raceEnabled says whether this test binary was built with -race, under which sync.Pool drops
// items at random (so a pooled buffer is allocated again now and then).
const raceEnabled = true
