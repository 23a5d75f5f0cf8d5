//go:build race

package e2e

// raceEnabled: this test binary has the race detector, so the exporter it
// builds for exporterCommand has it too.
const raceEnabled = true
