//go:build race

package main

// raceEnabled: the race detector multiplies memory use, so memory figures
// are logged, not checked.
const raceEnabled = true
