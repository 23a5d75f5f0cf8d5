//go:build race

package prometheus

// raceEnabled: the test binary was built with -race.
const raceEnabled = true
