// Package race says whether the binary was built with the race detector, for the tests whose
// checks it changes: allocation counts (sync.Pool drops items at random under -race) and the
// flags of test binaries built from a test.
package race
