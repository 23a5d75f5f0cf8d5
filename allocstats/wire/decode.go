package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Message types as they appear in the type label of
// gpumem_allocstats_messages_total. A type the daemon does not know is
// counted as TypeUnknown, never under the client's string.
const (
	TypeHello   = "hello"
	TypeStats   = "stats"
	TypeOOM     = "oom"
	TypeUnknown = "unknown"
)

// Results as they appear in the result label of
// gpumem_allocstats_messages_total.
const (
	ResultOK        = "ok"
	ResultMalformed = "malformed" // not JSON, not an object, no string "type"
	ResultRejected  = "rejected"  // valid JSON that breaks the protocol
	ResultOversize  = "oversize"  // a line over the size limit
)

// ProtocolVersion is the only value of "v" the daemon accepts.
const ProtocolVersion = 1

// maxTextLen bounds the free-text fields of hello after sanitising.
const maxTextLen = 64

// Optional is a value that a client may leave out. OK is false when the
// field was absent (or null); no series is exported for it then.
type Optional struct {
	V  uint64
	OK bool
}

// Some returns a present Optional holding v.
func Some(v uint64) Optional { return Optional{V: v, OK: true} }

// Ptr returns a pointer to the value, or nil when it is absent: the shape
// JSON output with omitempty wants.
func (o Optional) Ptr() *uint64 {
	if !o.OK {
		return nil
	}
	v := o.V
	return &v
}

// DeviceReport is one decoded entry of a stats message: the allocator state
// of one device in the sending process.
type DeviceReport struct {
	UUID          string // normalised with NormalizeUUID
	Reserved      uint64
	Active        Optional
	Allocated     Optional
	InactiveSplit Optional
	PeakReserved  Optional
	PeakActive    Optional
	Limit         Optional
	AllocRetries  Optional // raw client counter, may reset
	OOMs          Optional // raw client counter, may reset
	// At is when this state was sampled: it places the sample in the
	// window of the floor of active memory. Zero means when the report
	// was received. The wire protocol carries no time, so DecodeLine
	// leaves it zero; a producer that hands reports to the store directly
	// and samples on a clock of its own sets it.
	At time.Time
}

// Hello is a decoded hello message; its strings are sanitised (printable
// ASCII, at most 64 characters).
type Hello struct {
	Framework        string
	FrameworkVersion string
	Client           string
	// WarnBefore is the estimated time to OOM (seconds) under which the
	// client asks to be sent a warning message; absent: the daemon's
	// default (--allocstats.warn-before); 0: no warnings.
	WarnBefore Optional
}

// OOMMessage is a decoded oom message.
type OOMMessage struct {
	UUID           string // normalised
	RequestedBytes uint64
	LimitBytes     Optional
	FreeBytes      Optional
}

// Message is one decoded, validated line. Type says which of Hello, Devices
// or OOM is filled.
type Message struct {
	Type    string
	Hello   Hello
	Devices []DeviceReport
	OOM     OOMMessage
}

// DecodeError says why a line was not accepted, with the labels it is
// counted under.
type DecodeError struct {
	Type   string // TypeHello, TypeStats, TypeOOM or TypeUnknown
	Result string // ResultMalformed or ResultRejected
	Reason string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("%s %s message: %s", e.Result, e.Type, e.Reason)
}

func malformed(format string, args ...any) *DecodeError {
	return &DecodeError{Type: TypeUnknown, Result: ResultMalformed, Reason: fmt.Sprintf(format, args...)}
}

func rejected(typ, format string, args ...any) *DecodeError {
	return &DecodeError{Type: typ, Result: ResultRejected, Reason: fmt.Sprintf(format, args...)}
}

// wireMessage holds the fields of every message type, undecoded but for the
// structure of devices. Decoding into a struct in one pass is about three
// times as fast as into maps; the price is that encoding/json also matches
// field names case-insensitively, which the protocol leaves unspecified
// (clients must use the lower-case names).
type wireMessage struct {
	V                json.RawMessage `json:"v"`
	Type             json.RawMessage `json:"type"`
	Framework        json.RawMessage `json:"framework"`
	FrameworkVersion json.RawMessage `json:"framework_version"`
	Client           json.RawMessage `json:"client"`
	WarnBefore       json.RawMessage `json:"warn_before_seconds"`
	Devices          *[]wireDevice   `json:"devices"`
	UUID             json.RawMessage `json:"uuid"`
	RequestedBytes   json.RawMessage `json:"requested_bytes"`
	LimitBytes       json.RawMessage `json:"limit_bytes"`
	FreeBytes        json.RawMessage `json:"free_bytes"`
}

// wireDevice is one entry of a stats message, undecoded.
type wireDevice struct {
	UUID          json.RawMessage `json:"uuid"`
	Reserved      json.RawMessage `json:"reserved_bytes"`
	Active        json.RawMessage `json:"active_bytes"`
	Allocated     json.RawMessage `json:"allocated_bytes"`
	InactiveSplit json.RawMessage `json:"inactive_split_bytes"`
	PeakReserved  json.RawMessage `json:"peak_reserved_bytes"`
	PeakActive    json.RawMessage `json:"peak_active_bytes"`
	Limit         json.RawMessage `json:"limit_bytes"`
	AllocRetries  json.RawMessage `json:"alloc_retries"`
	OOMs          json.RawMessage `json:"ooms"`
}

// DecodeLine decodes and validates one line (without its newline). A stats
// message is validated entirely: any invalid entry, or more than maxDevices
// entries (when maxDevices > 0), rejects the whole line. The error, when
// not nil, is a *DecodeError. DecodeLine never panics and does not check
// UUIDs against NVML; the server does that.
func DecodeLine(line []byte, maxDevices int) (Message, error) {
	if !utf8.Valid(line) {
		return Message{}, malformed("line is not valid UTF-8")
	}
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return Message{}, malformed("not valid JSON")
		}
		return Message{}, malformed("not a JSON object")
	}
	var w wireMessage
	var err error
	if !scanWire(trimmed, &w) {
		// Outside the fast path's shape (scan.go): encoding/json decides.
		w, err = unmarshalWire(trimmed)
	}
	// Every field but devices is raw, so a type error comes from devices;
	// Unmarshal still fills the other fields. It matters only for stats.
	badDevices := false
	if err != nil {
		var typeErr *json.UnmarshalTypeError
		badDevices = errors.As(err, &typeErr)
	}
	if err != nil && !badDevices {
		return Message{}, malformed("not a JSON object: %v", err)
	}
	if absent(w.Type) {
		return Message{}, malformed(`missing "type"`)
	}
	typ, ok := rawString(w.Type)
	if !ok {
		return Message{}, malformed(`"type" is not a string`)
	}
	label := typeLabel(typ)
	if absent(w.V) {
		return Message{}, rejected(label, `missing "v"`)
	}
	if v, err := parseUint(w.V); err != nil || v != ProtocolVersion {
		return Message{}, rejected(label, `unsupported protocol version %.20q, want "v":1`, w.V)
	}
	switch label {
	case TypeHello:
		return decodeHello(&w)
	case TypeStats:
		if badDevices {
			return Message{}, rejected(TypeStats, `"devices" is not an array of objects`)
		}
		return decodeStats(&w, maxDevices)
	case TypeOOM:
		return decodeOOM(&w)
	default:
		return Message{}, rejected(TypeUnknown, "unknown message type %.40q", typ)
	}
}

// unmarshalWire is the slow path of DecodeLine: its own variable, so that
// the fast path's stays off the heap.
func unmarshalWire(line []byte) (wireMessage, error) {
	var w wireMessage
	err := json.Unmarshal(line, &w)
	return w, err
}

func typeLabel(typ string) string {
	switch typ {
	case TypeHello, TypeStats, TypeOOM:
		return typ
	}
	return TypeUnknown
}

func decodeHello(w *wireMessage) (Message, error) {
	msg := Message{Type: TypeHello}
	for _, f := range [...]struct {
		name string
		raw  json.RawMessage
		dst  *string
	}{
		{"framework", w.Framework, &msg.Hello.Framework},
		{"framework_version", w.FrameworkVersion, &msg.Hello.FrameworkVersion},
		{"client", w.Client, &msg.Hello.Client},
	} {
		if absent(f.raw) {
			continue
		}
		s, ok := rawString(f.raw)
		if !ok {
			return Message{}, rejected(TypeHello, "%q is not a string", f.name)
		}
		*f.dst = Sanitize(s)
	}
	var err error
	if msg.Hello.WarnBefore, err = optionalUint("warn_before_seconds", w.WarnBefore); err != nil {
		return Message{}, rejected(TypeHello, "%v", err)
	}
	return msg, nil
}

func decodeStats(w *wireMessage, maxDevices int) (Message, error) {
	if w.Devices == nil {
		return Message{}, rejected(TypeStats, `missing "devices"`)
	}
	entries := *w.Devices
	if maxDevices > 0 && len(entries) > maxDevices {
		return Message{}, rejected(TypeStats, "%d devices in one message, the limit is %d", len(entries), maxDevices)
	}
	msg := Message{Type: TypeStats, Devices: make([]DeviceReport, 0, len(entries))}
	for i := range entries {
		d, err := decodeDevice(&entries[i])
		if err != nil {
			return Message{}, rejected(TypeStats, "devices[%d]: %v", i, err)
		}
		for j := range msg.Devices {
			if msg.Devices[j].UUID == d.UUID {
				return Message{}, rejected(TypeStats, "devices[%d]: device %s listed twice", i, d.UUID)
			}
		}
		msg.Devices = append(msg.Devices, d)
	}
	return msg, nil
}

func decodeDevice(w *wireDevice) (DeviceReport, error) {
	var d DeviceReport
	var err error
	if d.UUID, err = uuidField("uuid", w.UUID); err != nil {
		return DeviceReport{}, err
	}
	if d.Reserved, err = requiredUint("reserved_bytes", w.Reserved); err != nil {
		return DeviceReport{}, err
	}
	// One call per field, in this order (the first bad field is the one
	// reported): a table of pointers into d would move d to the heap.
	if d.Active, err = optionalUint("active_bytes", w.Active); err != nil {
		return DeviceReport{}, err
	}
	if d.Allocated, err = optionalUint("allocated_bytes", w.Allocated); err != nil {
		return DeviceReport{}, err
	}
	if d.InactiveSplit, err = optionalUint("inactive_split_bytes", w.InactiveSplit); err != nil {
		return DeviceReport{}, err
	}
	if d.PeakReserved, err = optionalUint("peak_reserved_bytes", w.PeakReserved); err != nil {
		return DeviceReport{}, err
	}
	if d.PeakActive, err = optionalUint("peak_active_bytes", w.PeakActive); err != nil {
		return DeviceReport{}, err
	}
	if d.Limit, err = optionalUint("limit_bytes", w.Limit); err != nil {
		return DeviceReport{}, err
	}
	if d.AllocRetries, err = optionalUint("alloc_retries", w.AllocRetries); err != nil {
		return DeviceReport{}, err
	}
	if d.OOMs, err = optionalUint("ooms", w.OOMs); err != nil {
		return DeviceReport{}, err
	}
	return d, nil
}

func decodeOOM(w *wireMessage) (Message, error) {
	msg := Message{Type: TypeOOM}
	var err error
	if msg.OOM.UUID, err = uuidField("uuid", w.UUID); err != nil {
		return Message{}, rejected(TypeOOM, "%v", err)
	}
	if msg.OOM.RequestedBytes, err = requiredUint("requested_bytes", w.RequestedBytes); err != nil {
		return Message{}, rejected(TypeOOM, "%v", err)
	}
	if msg.OOM.LimitBytes, err = optionalUint("limit_bytes", w.LimitBytes); err != nil {
		return Message{}, rejected(TypeOOM, "%v", err)
	}
	if msg.OOM.FreeBytes, err = optionalUint("free_bytes", w.FreeBytes); err != nil {
		return Message{}, rejected(TypeOOM, "%v", err)
	}
	return msg, nil
}

func uuidField(name string, raw json.RawMessage) (string, error) {
	if absent(raw) {
		return "", fmt.Errorf("missing %q", name)
	}
	s, ok := rawString(raw)
	if !ok {
		return "", fmt.Errorf("%q is not a string", name)
	}
	uuid, ok := NormalizeUUID(s)
	if !ok || !printableASCII(uuid) {
		return "", fmt.Errorf("%q is not a GPU or MIG UUID: %.60q", name, s)
	}
	return uuid, nil
}

func requiredUint(name string, raw json.RawMessage) (uint64, error) {
	if absent(raw) {
		return 0, fmt.Errorf("missing %q", name)
	}
	v, err := parseUint(raw)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", name, err)
	}
	return v, nil
}

func optionalUint(name string, raw json.RawMessage) (Optional, error) {
	if absent(raw) {
		return Optional{}, nil
	}
	v, err := parseUint(raw)
	if err != nil {
		return Optional{}, fmt.Errorf("%q: %w", name, err)
	}
	return Some(v), nil
}

// absent reports whether a field was left out or null.
func absent(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// rawString decodes a JSON string from an already validated line; false if
// raw is not a string. Strings without escapes are taken as they are.
func rawString(raw json.RawMessage) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// parseUint accepts only a plain JSON integer literal that fits in uint64:
// no sign, fraction, exponent or quotes.
func parseUint(raw json.RawMessage) (uint64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, fmt.Errorf("empty value")
	}
	var v uint64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%.30q is not a non-negative integer", raw)
		}
		d := uint64(c - '0')
		if v > (^uint64(0)-d)/10 {
			return 0, fmt.Errorf("%.30q does not fit in 64 bits", raw)
		}
		v = v*10 + d
	}
	return v, nil
}

// Sanitize keeps a client-supplied string safe for logs and label values:
// characters outside printable ASCII become '?', and it is cut to 64
// characters.
func Sanitize(s string) string {
	out := make([]byte, 0, min(len(s), maxTextLen))
	for _, r := range s {
		if len(out) == maxTextLen {
			break
		}
		if r >= 0x20 && r < 0x7f {
			out = append(out, byte(r))
		} else {
			out = append(out, '?')
		}
	}
	return string(out)
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
