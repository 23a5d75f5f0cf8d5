package wire

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

const (
	testUUID      = "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	testUUIDBare  = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	testUUIDHex   = "0A1B2C3D4E5F6789ABCDEF0123456789"
	testUUID2     = "GPU-11111111-2222-3333-4444-555555555555"
	testMIGUUID   = "MIG-2f6f4d5e-3c2b-5a1f-9e8d-7c6b5a4f3e2d"
	unknownUUID   = "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"
	maxUint64Text = "18446744073709551615"
)

func TestDecodeLineAccepts(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Message
	}{
		{
			name: "hello with every field",
			line: `{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"gpumem-python/0.1.0"}`,
			want: Message{Type: TypeHello, Hello: Hello{Framework: "pytorch", FrameworkVersion: "2.11.0", Client: "gpumem-python/0.1.0"}},
		},
		{
			name: "hello with no optional field",
			line: `{"v":1,"type":"hello"}`,
			want: Message{Type: TypeHello},
		},
		{
			name: "hello strings are sanitised and cut to 64 characters",
			line: `{"v":1,"type":"hello","framework":"py\u0000torch\n","client":"` + strings.Repeat("x", 100) + `","framework_version":"é1"}`,
			want: Message{Type: TypeHello, Hello: Hello{Framework: "py?torch?", FrameworkVersion: "?1", Client: strings.Repeat("x", 64)}},
		},
		{
			name: "hello null strings are absent",
			line: `{"v":1,"type":"hello","framework":null}`,
			want: Message{Type: TypeHello},
		},
		{
			name: "stats with required fields only",
			line: `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":0}]}`,
			want: Message{Type: TypeStats, Devices: []DeviceReport{{UUID: testUUID}}},
		},
		{
			name: "stats with every field",
			line: `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":962592768,"active_bytes":960495616,"allocated_bytes":960495616,"inactive_split_bytes":2097152,"peak_reserved_bytes":3122659328,"peak_active_bytes":2160066560,"limit_bytes":4294967296,"alloc_retries":1,"ooms":` + maxUint64Text + `}]}`,
			want: Message{Type: TypeStats, Devices: []DeviceReport{{
				UUID: testUUID, Reserved: 962592768, Active: Some(960495616), Allocated: Some(960495616),
				InactiveSplit: Some(2097152), PeakReserved: Some(3122659328), PeakActive: Some(2160066560),
				Limit: Some(4294967296), AllocRetries: Some(1), OOMs: Some(18446744073709551615),
			}}},
		},
		{
			name: "stats with bare dashed hex uuid",
			line: `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUIDBare + `","reserved_bytes":1}]}`,
			want: Message{Type: TypeStats, Devices: []DeviceReport{{UUID: testUUID, Reserved: 1}}},
		},
		{
			name: "stats with 32 hex digit uuid",
			line: `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUIDHex + `","reserved_bytes":1}]}`,
			want: Message{Type: TypeStats, Devices: []DeviceReport{{UUID: testUUID, Reserved: 1}}},
		},
		{
			name: "stats with lower-case gpu prefix and MIG uuid",
			line: `{"v":1,"type":"stats","devices":[{"uuid":"gpu-` + testUUIDBare + `","reserved_bytes":1},{"uuid":"` + testMIGUUID + `","reserved_bytes":2}]}`,
			want: Message{Type: TypeStats, Devices: []DeviceReport{{UUID: testUUID, Reserved: 1}, {UUID: testMIGUUID, Reserved: 2}}},
		},
		{
			name: "stats with no device",
			line: `{"v":1,"type":"stats","devices":[]}`,
			want: Message{Type: TypeStats, Devices: []DeviceReport{}},
		},
		{
			name: "unknown fields are ignored, also nested, and null optionals are absent",
			line: `{"v":1,"type":"stats","pid":1,"extra":{"a":[1,2,{"b":null}]},"devices":[{"uuid":"` + testUUID + `","reserved_bytes":5,"active_bytes":null,"future":"x","requested_bytes":1.5}]}`,
			want: Message{Type: TypeStats, Devices: []DeviceReport{{UUID: testUUID, Reserved: 5}}},
		},
		{
			name: "fields of other types are ignored whatever their shape",
			line: `{"v":1,"type":"hello","devices":"none","uuid":7,"requested_bytes":-1}`,
			want: Message{Type: TypeHello},
		},
		{
			name: "whitespace around the object and between tokens",
			line: " { \"v\" : 1 , \"type\" : \"oom\" , \"uuid\" : \"" + testUUID + "\" , \"requested_bytes\" : 960495616 } ",
			want: Message{Type: TypeOOM, OOM: OOMMessage{UUID: testUUID, RequestedBytes: 960495616}},
		},
		{
			name: "oom with every field",
			line: `{"v":1,"type":"oom","uuid":"` + testUUIDHex + `","requested_bytes":960495616,"limit_bytes":4294967296,"free_bytes":145713397760}`,
			want: Message{Type: TypeOOM, OOM: OOMMessage{UUID: testUUID, RequestedBytes: 960495616, LimitBytes: Some(4294967296), FreeBytes: Some(145713397760)}},
		},
		{
			name: "field order does not matter",
			line: `{"requested_bytes":7,"uuid":"` + testUUID + `","type":"oom","v":1}`,
			want: Message{Type: TypeOOM, OOM: OOMMessage{UUID: testUUID, RequestedBytes: 7}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeLine([]byte(tt.line), 64)
			if err != nil {
				t.Fatalf("DecodeLine(%s) failed: %v", tt.line, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecodeLine(%s)\n got %+v\nwant %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestDecodeLineRefuses(t *testing.T) {
	dev := func(fields string) string {
		return `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":1` + fields + `}]}`
	}
	tests := []struct {
		name       string
		line       string
		wantType   string
		wantResult string
	}{
		// Malformed: not a JSON object with a string type.
		{"empty line", ``, TypeUnknown, ResultMalformed},
		{"bad JSON", `{"v":1,"type":"stats"`, TypeUnknown, ResultMalformed},
		{"trailing garbage", `{"v":1,"type":"hello"} x`, TypeUnknown, ResultMalformed},
		{"two objects on one line", `{"v":1,"type":"hello"}{"v":1,"type":"hello"}`, TypeUnknown, ResultMalformed},
		{"array", `[{"v":1,"type":"hello"}]`, TypeUnknown, ResultMalformed},
		{"number", `1`, TypeUnknown, ResultMalformed},
		{"string", `"hello"`, TypeUnknown, ResultMalformed},
		{"null", `null`, TypeUnknown, ResultMalformed},
		{"missing type", `{"v":1}`, TypeUnknown, ResultMalformed},
		{"type null", `{"v":1,"type":null}`, TypeUnknown, ResultMalformed},
		{"type not a string", `{"v":1,"type":7}`, TypeUnknown, ResultMalformed},
		{"type an object", `{"v":1,"type":{"a":"stats"}}`, TypeUnknown, ResultMalformed},
		{"invalid UTF-8", "{\"v\":1,\"type\":\"hello\",\"client\":\"\xff\"}", TypeUnknown, ResultMalformed},
		{"deeply nested garbage", `{"v":1,"type":"hello","x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, TypeUnknown, ResultMalformed},

		// Version.
		{"v missing", `{"type":"hello"}`, TypeHello, ResultRejected},
		{"v 2", `{"v":2,"type":"stats","devices":[]}`, TypeStats, ResultRejected},
		{"v 0", `{"v":0,"type":"oom"}`, TypeOOM, ResultRejected},
		{"v string", `{"v":"1","type":"hello"}`, TypeHello, ResultRejected},
		{"v float", `{"v":1.0,"type":"hello"}`, TypeHello, ResultRejected},
		{"v null", `{"v":null,"type":"hello"}`, TypeHello, ResultRejected},

		// Unknown types are counted under "unknown", never the client's string.
		{"unknown type", `{"v":1,"type":"welcome"}`, TypeUnknown, ResultRejected},
		{"type case matters", `{"v":1,"type":"Stats","devices":[]}`, TypeUnknown, ResultRejected},
		{"unknown type wrong v", `{"v":3,"type":"future"}`, TypeUnknown, ResultRejected},

		// hello.
		{"hello framework not a string", `{"v":1,"type":"hello","framework":1}`, TypeHello, ResultRejected},
		{"hello client an object", `{"v":1,"type":"hello","client":{}}`, TypeHello, ResultRejected},

		// stats structure.
		{"stats devices missing", `{"v":1,"type":"stats"}`, TypeStats, ResultRejected},
		{"stats devices null", `{"v":1,"type":"stats","devices":null}`, TypeStats, ResultRejected},
		{"stats devices an object", `{"v":1,"type":"stats","devices":{"uuid":"` + testUUID + `"}}`, TypeStats, ResultRejected},
		{"stats device not an object", `{"v":1,"type":"stats","devices":[1]}`, TypeStats, ResultRejected},
		{"stats second device not an object", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":1},"x"]}`, TypeStats, ResultRejected},
		{"stats devices a string", `{"v":1,"type":"stats","devices":"[]"}`, TypeStats, ResultRejected},
		{"bad devices do not hide a bad version", `{"v":2,"type":"stats","devices":7}`, TypeStats, ResultRejected},
		{"bad devices with a bad type", `{"v":1,"type":5,"devices":7}`, TypeUnknown, ResultMalformed},
		{"stats device null", `{"v":1,"type":"stats","devices":[null]}`, TypeStats, ResultRejected},
		{"stats device an array", `{"v":1,"type":"stats","devices":[[]]}`, TypeStats, ResultRejected},
		{"stats too many devices", `{"v":1,"type":"stats","devices":[` + strings.TrimSuffix(strings.Repeat(`{"uuid":"`+testUUID+`","reserved_bytes":1},`, 3), ",") + `]}`, TypeStats, ResultRejected},
		{"stats same device twice in two spellings", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":1},{"uuid":"` + testUUIDHex + `","reserved_bytes":2}]}`, TypeStats, ResultRejected},
		{"one bad entry rejects the line", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":1},{"uuid":"` + testUUID2 + `","reserved_bytes":-1}]}`, TypeStats, ResultRejected},

		// stats uuid.
		{"uuid missing", `{"v":1,"type":"stats","devices":[{"reserved_bytes":1}]}`, TypeStats, ResultRejected},
		{"uuid null", `{"v":1,"type":"stats","devices":[{"uuid":null,"reserved_bytes":1}]}`, TypeStats, ResultRejected},
		{"uuid a number", `{"v":1,"type":"stats","devices":[{"uuid":0,"reserved_bytes":1}]}`, TypeStats, ResultRejected},
		{"uuid an index", `{"v":1,"type":"stats","devices":[{"uuid":"0","reserved_bytes":1}]}`, TypeStats, ResultRejected},
		{"uuid too short", `{"v":1,"type":"stats","devices":[{"uuid":"GPU-0a1b2c3d","reserved_bytes":1}]}`, TypeStats, ResultRejected},
		{"uuid not hex", `{"v":1,"type":"stats","devices":[{"uuid":"GPU-0a1b2c3d-4e5f-6789-abcd-ef012345678z","reserved_bytes":1}]}`, TypeStats, ResultRejected},
		{"uuid dashes misplaced", `{"v":1,"type":"stats","devices":[{"uuid":"0a1b2c3d4-e5f-6789-abcd-ef0123456789","reserved_bytes":1}]}`, TypeStats, ResultRejected},
		{"MIG uuid with control characters", `{"v":1,"type":"stats","devices":[{"uuid":"MIG-a\u0001b","reserved_bytes":1}]}`, TypeStats, ResultRejected},

		// stats reserved_bytes and numbers.
		{"reserved missing", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `"}]}`, TypeStats, ResultRejected},
		{"reserved null", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":null}]}`, TypeStats, ResultRejected},
		{"reserved negative", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":-1}]}`, TypeStats, ResultRejected},
		{"reserved fraction", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":1.5}]}`, TypeStats, ResultRejected},
		{"reserved integral float", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":1.0}]}`, TypeStats, ResultRejected},
		{"reserved exponent", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":1e3}]}`, TypeStats, ResultRejected},
		{"reserved string", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":"12"}]}`, TypeStats, ResultRejected},
		{"reserved bool", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":true}]}`, TypeStats, ResultRejected},
		{"reserved over uint64", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":18446744073709551616}]}`, TypeStats, ResultRejected},
		{"reserved huge", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":` + strings.Repeat("9", 400) + `}]}`, TypeStats, ResultRejected},
		{"reserved an object", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":{"v":1}}]}`, TypeStats, ResultRejected},
		{"reserved minus zero", `{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":-0}]}`, TypeStats, ResultRejected},

		// Every optional stats field is checked the same way.
		{"active negative", dev(`,"active_bytes":-1`), TypeStats, ResultRejected},
		{"allocated fraction", dev(`,"allocated_bytes":0.5`), TypeStats, ResultRejected},
		{"inactive_split exponent", dev(`,"inactive_split_bytes":2E2`), TypeStats, ResultRejected},
		{"peak_reserved string", dev(`,"peak_reserved_bytes":"1"`), TypeStats, ResultRejected},
		{"peak_active array", dev(`,"peak_active_bytes":[1]`), TypeStats, ResultRejected},
		{"limit over uint64", dev(`,"limit_bytes":99999999999999999999`), TypeStats, ResultRejected},
		{"alloc_retries negative", dev(`,"alloc_retries":-3`), TypeStats, ResultRejected},
		{"ooms bool", dev(`,"ooms":false`), TypeStats, ResultRejected},

		// oom.
		{"oom uuid missing", `{"v":1,"type":"oom","requested_bytes":1}`, TypeOOM, ResultRejected},
		{"oom uuid invalid", `{"v":1,"type":"oom","uuid":"GPU-x","requested_bytes":1}`, TypeOOM, ResultRejected},
		{"oom requested missing", `{"v":1,"type":"oom","uuid":"` + testUUID + `"}`, TypeOOM, ResultRejected},
		{"oom requested negative", `{"v":1,"type":"oom","uuid":"` + testUUID + `","requested_bytes":-5}`, TypeOOM, ResultRejected},
		{"oom limit fraction", `{"v":1,"type":"oom","uuid":"` + testUUID + `","requested_bytes":5,"limit_bytes":1.5}`, TypeOOM, ResultRejected},
		{"oom free string", `{"v":1,"type":"oom","uuid":"` + testUUID + `","requested_bytes":5,"free_bytes":"5"}`, TypeOOM, ResultRejected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := DecodeLine([]byte(tt.line), 2)
			if err == nil {
				t.Fatalf("DecodeLine(%.200s) accepted %+v, want %s %s", tt.line, msg, tt.wantType, tt.wantResult)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("DecodeLine returned %T (%v), want *DecodeError", err, err)
			}
			if de.Type != tt.wantType || de.Result != tt.wantResult {
				t.Errorf("DecodeLine(%.200s) counted as type=%q result=%q (%v), want type=%q result=%q",
					tt.line, de.Type, de.Result, err, tt.wantType, tt.wantResult)
			}
		})
	}
}

func TestSanitizeIsIdempotent(t *testing.T) {
	for _, s := range []string{"", "pytorch", "a\x00b", "é", strings.Repeat("ü", 100), "\u2028x"} {
		once := Sanitize(s)
		if twice := Sanitize(once); twice != once {
			t.Errorf("Sanitize(Sanitize(%q)) = %q, want %q", s, twice, once)
		}
		if len(once) > 64 || !printableASCII(once) {
			t.Errorf("Sanitize(%q) = %q: not printable ASCII of at most 64 bytes", s, once)
		}
	}
}

// The lines clients send take the decoder's fast path (scan.go).
func TestClientLinesTakeTheFastPath(t *testing.T) {
	for _, line := range []string{
		`{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"gpumem-python/0.1.0"}`,
		// A stats line as the Python client writes it.
		`{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":3126853632,"active_bytes":960496128,"allocated_bytes":960496128,"inactive_split_bytes":1199570944,"peak_reserved_bytes":3841982464,"peak_active_bytes":2160066560,"limit_bytes":150754820096,"alloc_retries":0,"ooms":0}]}`,
		`{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":1},{"uuid":"` + testUUID2 + `","reserved_bytes":2,"limit_bytes":null}]}`,
		`{"v":1,"type":"oom","uuid":"` + testUUID + `","requested_bytes":960495616,"limit_bytes":4294967296,"free_bytes":145713397760}`,
	} {
		var w wireMessage
		if !scanWire([]byte(line), &w) {
			t.Errorf("%s: not taken by the fast path", line)
		}
	}
}
