//go:build race

package deploy

// raceEnabled: this test binary has the race detector, so the exporter it
// builds has it too (and shares the cached build of the other tests).
const raceEnabled = true
