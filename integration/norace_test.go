//go:build !race

package integration

// raceFlags: the tests run without the race detector, and so does the
// service's binary.
var raceFlags []string
