// Package wire decodes the lines of the allocator-statistics protocol
// (docs/protocol.md): one JSON object per line, from a client that is not
// trusted. DecodeLine reads a line through a fast path of its own
// (scan.go) and gives any other line to encoding/json, with the same
// result either way; NormalizeUUID spells a device UUID as NVML does;
// DefaultSocketDir and SocketName say where clients find the socket.
//
// It depends on the standard library only, so that fuzzing it (make test
// runs FuzzDecodeLine and FuzzScanWire for a count of inputs) compiles
// little besides it.
package wire
