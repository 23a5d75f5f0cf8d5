//go:build !race

package exportertest

// RaceEnabled: see race_on.go.
const RaceEnabled = false
