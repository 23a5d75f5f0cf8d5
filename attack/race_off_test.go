//go:build !race

package attack

// raceEnabled: see race_on_test.go.
const raceEnabled = false
