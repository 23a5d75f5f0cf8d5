package wire

import (
	"encoding/json"
	"fmt"
)

// TypeWarning is the daemon's message to a client whose process it
// foresees running out of memory: never sent by a client.
const TypeWarning = "warning"

// Warning is the daemon's warning to a process that, at its current climb
// of active memory, would run out of memory soon. A client that does not
// know the type ignores it; a daemon that does not foresee sends none.
type Warning struct {
	V    int    `json:"v"`
	Type string `json:"type"`
	GPU  string `json:"gpu"`
	UUID string `json:"uuid"`
	// ETASeconds is the estimated time until active memory reaches the
	// ceiling at the current climb.
	ETASeconds float64 `json:"eta_seconds"`
	// ClimbBytesPerMinute is how fast active memory climbs: its floor (a
	// leak) or the peak of its steps (a growing batch).
	ClimbBytesPerMinute uint64 `json:"climb_bytes_per_minute"`
	// ActiveBytes is the peak of active memory now, CeilingBytes what the
	// allocator can hold at most (its limit, or what it holds plus the
	// GPU's free memory) and Ceiling which of the two: "limit" or "gpu".
	ActiveBytes  uint64 `json:"active_bytes"`
	CeilingBytes uint64 `json:"ceiling_bytes"`
	Ceiling      string `json:"ceiling"`
	// ClimbSeconds is how long the climb has been measured.
	ClimbSeconds float64 `json:"climb_seconds"`
	// Cause is from the verdicts' set: "leak" (the floor climbs) or
	// "growth" (the peak climbs over a flat floor).
	Cause   string `json:"cause"`
	Summary string `json:"summary"`
	Remedy  string `json:"remedy"`
}

// Line encodes w as one protocol line, newline included, with "v" and
// "type" set.
func (w Warning) Line() ([]byte, error) {
	w.V, w.Type = ProtocolVersion, TypeWarning
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("encoding a warning: %w", err)
	}
	return append(b, '\n'), nil
}
