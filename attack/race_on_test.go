//go:build race

package attack

// raceEnabled: this test binary has the race detector, so the exporter it
// builds has it too.
const raceEnabled = true
