package wire

import "encoding/json"

// A fast path for DecodeLine: scanWire fills a wireMessage from the lines
// clients actually send, without encoding/json's validation pass and
// reflection (three quarters of the ingest CPU before). It accepts only a
// narrow shape and gives up on anything else, which then goes through
// json.Unmarshal as before: so for every line, DecodeLine's result is the
// one encoding/json's gives (FuzzScanWire checks it).
//
// The shape: one object; keys written exactly as the protocol names them
// (no escape, each at most once); values that are strings without escapes
// or control characters, plain non-negative integers without a leading
// zero, or null; and "devices", an array of objects of the same kind. JSON
// whitespace may stand between tokens. Unknown keys, other spellings of a
// key (encoding/json matches them case-insensitively), duplicates,
// escapes, booleans, fractions, signs, exponents and nested values leave
// the fast path.

// scanner reads one line; ok turns false, for good, at the first thing
// outside the shape.
type scanner struct {
	b   []byte
	i   int
	bad bool
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next byte after whitespace, or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// expect consumes c after whitespace.
func (s *scanner) expect(c byte) bool {
	if s.peek() != c {
		s.bad = true
		return false
	}
	s.i++
	return true
}

// key reads a key without escapes and the colon after it.
func (s *scanner) key() []byte {
	if s.peek() != '"' {
		s.bad = true
		return nil
	}
	start := s.i + 1
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			if !s.expect(':') {
				return nil
			}
			return s.b[start:j]
		case c == '\\' || c < 0x20:
			s.bad = true
			return nil
		}
	}
	s.bad = true
	return nil
}

// value reads a string without escapes, a plain non-negative integer or
// null, and returns its bytes as json.RawMessage holds them.
func (s *scanner) value() []byte {
	switch c := s.peek(); {
	case c == '"':
		start := s.i
		for j := start + 1; j < len(s.b); j++ {
			switch c := s.b[j]; {
			case c == '"':
				s.i = j + 1
				return s.b[start:s.i]
			case c == '\\' || c < 0x20:
				s.bad = true
				return nil
			}
		}
	case c >= '0' && c <= '9':
		start := s.i
		j := start
		for j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9' {
			j++
		}
		if s.b[start] == '0' && j-start > 1 {
			break // a leading zero is not JSON
		}
		if j < len(s.b) {
			switch s.b[j] {
			case ' ', '\t', '\n', '\r', ',', '}', ']':
			default:
				s.bad = true // a fraction, an exponent or garbage
				return nil
			}
		}
		s.i = j
		return s.b[start:j]
	case c == 'n':
		if len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
			s.i += 4
			return s.b[s.i-4 : s.i]
		}
	}
	s.bad = true
	return nil
}

// members reads the members of an object after its '{' (and the '}'),
// calling member for each key; member reads the value. It stops at the
// first thing outside the shape.
func (s *scanner) members(member func(key []byte)) {
	if s.peek() == '}' {
		s.i++
		return
	}
	for !s.bad {
		k := s.key()
		if s.bad {
			return
		}
		if member(k); s.bad {
			return
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return
		default:
			s.bad = true
		}
	}
}

// flat reads a flat value into dst, which must not be set yet (a key
// seen twice leaves the fast path); dst nil is an unknown key, or another
// spelling of a known one, which leaves it too.
func (s *scanner) flat(dst *json.RawMessage) {
	if dst == nil || *dst != nil {
		s.bad = true
		return
	}
	*dst = s.value()
}

// scanWire fills w from line, which starts with '{', as json.Unmarshal
// would; false when line is outside the fast path's shape (w is then
// garbage).
func scanWire(line []byte, w *wireMessage) bool {
	s := scanner{b: line}
	if !s.expect('{') {
		return false
	}
	devicesSeen := false
	s.members(func(k []byte) {
		if string(k) == "devices" {
			if devicesSeen {
				s.bad = true
				return
			}
			devicesSeen = true
			s.devices(w)
			return
		}
		s.flat(w.field(k))
	})
	if s.bad {
		return false
	}
	s.ws()
	return s.i == len(s.b)
}

// field returns the field of w that key names exactly, or nil.
func (w *wireMessage) field(k []byte) *json.RawMessage {
	switch string(k) {
	case "v":
		return &w.V
	case "type":
		return &w.Type
	case "framework":
		return &w.Framework
	case "framework_version":
		return &w.FrameworkVersion
	case "client":
		return &w.Client
	case "warn_before_seconds":
		return &w.WarnBefore
	case "uuid":
		return &w.UUID
	case "requested_bytes":
		return &w.RequestedBytes
	case "limit_bytes":
		return &w.LimitBytes
	case "free_bytes":
		return &w.FreeBytes
	}
	return nil
}

// field returns the field of d that key names exactly, or nil.
func (d *wireDevice) field(k []byte) *json.RawMessage {
	switch string(k) {
	case "uuid":
		return &d.UUID
	case "reserved_bytes":
		return &d.Reserved
	case "active_bytes":
		return &d.Active
	case "allocated_bytes":
		return &d.Allocated
	case "inactive_split_bytes":
		return &d.InactiveSplit
	case "peak_reserved_bytes":
		return &d.PeakReserved
	case "peak_active_bytes":
		return &d.PeakActive
	case "limit_bytes":
		return &d.Limit
	case "alloc_retries":
		return &d.AllocRetries
	case "ooms":
		return &d.OOMs
	}
	return nil
}

// devices reads the value of "devices": null or an array of objects.
func (s *scanner) devices(w *wireMessage) {
	switch s.peek() {
	case 'n':
		if s.value(); !s.bad {
			w.Devices = nil
		}
		return
	case '[':
		s.i++
	default:
		s.bad = true
		return
	}
	devs := make([]wireDevice, 0, 1)
	if s.peek() == ']' {
		s.i++
		w.Devices = &devs
		return
	}
	for !s.bad {
		if !s.expect('{') {
			return
		}
		devs = append(devs, wireDevice{})
		d := &devs[len(devs)-1]
		s.members(func(k []byte) { s.flat(d.field(k)) })
		if s.bad {
			return
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			w.Devices = &devs
			return
		default:
			s.bad = true
		}
	}
}
