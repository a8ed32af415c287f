//go:build race

package integration

// raceFlags builds the service's binary the way the tests themselves were
// built: with the race detector under go test -race.
var raceFlags = []string{"-race"}
