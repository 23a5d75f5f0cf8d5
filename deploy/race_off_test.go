//go:build !race

package deploy

// raceEnabled: this test binary has no race detector, nor has the exporter
// it builds.
const raceEnabled = false
