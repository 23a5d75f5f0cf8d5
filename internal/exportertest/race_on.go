//go:build race

package exportertest

// RaceEnabled says whether this program has the race detector; a test
// binary that has it runs an exporter built with it too.
const RaceEnabled = true
