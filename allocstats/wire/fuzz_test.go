package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"unicode/utf8"
)

// encodeMessage writes msg back in wire form, the way a client would.
func encodeMessage(t testing.TB, msg Message) []byte {
	t.Helper()
	m := map[string]any{"v": 1, "type": msg.Type}
	opt := func(dst map[string]any, name string, o Optional) {
		if o.OK {
			dst[name] = o.V
		}
	}
	switch msg.Type {
	case TypeHello:
		m["framework"] = msg.Hello.Framework
		m["framework_version"] = msg.Hello.FrameworkVersion
		m["client"] = msg.Hello.Client
	case TypeStats:
		devs := make([]map[string]any, 0, len(msg.Devices))
		for _, d := range msg.Devices {
			e := map[string]any{"uuid": d.UUID, "reserved_bytes": d.Reserved}
			opt(e, "active_bytes", d.Active)
			opt(e, "allocated_bytes", d.Allocated)
			opt(e, "inactive_split_bytes", d.InactiveSplit)
			opt(e, "peak_reserved_bytes", d.PeakReserved)
			opt(e, "peak_active_bytes", d.PeakActive)
			opt(e, "limit_bytes", d.Limit)
			opt(e, "alloc_retries", d.AllocRetries)
			opt(e, "ooms", d.OOMs)
			devs = append(devs, e)
		}
		m["devices"] = devs
	case TypeOOM:
		m["uuid"] = msg.OOM.UUID
		m["requested_bytes"] = msg.OOM.RequestedBytes
		opt(m, "limit_bytes", msg.OOM.LimitBytes)
		opt(m, "free_bytes", msg.OOM.FreeBytes)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("encoding %+v: %v", msg, err)
	}
	return b
}

// FuzzDecodeLine checks that no input panics the decoder, that every error
// is a *DecodeError with bounded label values, and that an accepted message
// written back decodes to the same message.
func FuzzDecodeLine(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"gpumem-python/0.1.0"}`,
		`{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":962592768,"active_bytes":960495616,"alloc_retries":1,"ooms":1}]}`,
		`{"v":1,"type":"oom","uuid":"` + testUUIDHex + `","requested_bytes":960495616,"limit_bytes":4294967296,"free_bytes":145713397760}`,
		`{"v":2,"type":"stats"}`,
		`{"v":1,"type":"stats","devices":[{"uuid":"` + testUUIDBare + `","reserved_bytes":1e3}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		msg, err := DecodeLine(line, 4)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T (%v) is not a *DecodeError", err, err)
			}
			switch de.Type {
			case TypeHello, TypeStats, TypeOOM, TypeUnknown:
			default:
				t.Fatalf("type label %q is not one of the known values", de.Type)
			}
			if de.Result != ResultMalformed && de.Result != ResultRejected {
				t.Fatalf("result label %q from the decoder", de.Result)
			}
			return
		}
		if len(msg.Devices) > 4 {
			t.Fatalf("accepted %d devices with a limit of 4", len(msg.Devices))
		}
		again, err := DecodeLine(encodeMessage(t, msg), 4)
		if err != nil {
			t.Fatalf("accepted %q as %+v, but its re-encoding is refused: %v", line, msg, err)
		}
		if !reflect.DeepEqual(again, msg) {
			t.Fatalf("accepted %q as %+v, re-encoded it decodes as %+v", line, msg, again)
		}
	})
}

// FuzzScanWire checks the decoder's fast path against encoding/json: on
// every valid UTF-8 line it takes (DecodeLine checks UTF-8 first), it must
// fill the wire message exactly as json.Unmarshal does, and json.Unmarshal
// must accept the line.
func FuzzScanWire(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"gpumem-python/0.1.0"}`,
		`{"v":1,"type":"stats","devices":[{"uuid":"` + testUUID + `","reserved_bytes":962592768,"active_bytes":960495616,"allocated_bytes":960495616,"inactive_split_bytes":0,"peak_reserved_bytes":1,"peak_active_bytes":2,"limit_bytes":3,"alloc_retries":1,"ooms":1}]}`,
		`{"v":1,"type":"oom","uuid":"` + testUUIDHex + `","requested_bytes":960495616,"limit_bytes":null,"free_bytes":145713397760}`,
		` { "v" : 1 , "type" : "stats" , "devices" : [ { } , {"uuid":""} ] } `,
		`{"v":1,"type":"stats","devices":null}`,
		`{"v":1,"type":"stats","devices":[]}`,
		`{"v":01,"type":"stats"}`,
		`{"v":1,"V":2,"type":"hello"}`,
		`{"v":1,"type":"hello","v":2}`,
		`{"v":1,"type":"h\u0065llo"}`,
		`{"v":1,"type":"hello"}x`,
		`{"v":1.0,"type":"hello"}`,
		`{"v":1,"type":"stats","devices":[{"uuid":"a","reserved_bytes":1e3}]}`,
		`{"v":1,"type":"stats","devices":[{"uuid":"a","reserved_bytes":1},]}`,
		`{"v":1,"type":"stats","devices":{}}`,
		`{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if len(line) == 0 || line[0] != '{' || !utf8.Valid(line) {
			return
		}
		var fast wireMessage
		if !scanWire(line, &fast) {
			return
		}
		var slow wireMessage
		if err := json.Unmarshal(line, &slow); err != nil {
			t.Fatalf("the fast path took %q, which encoding/json refuses: %v", line, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("the fast path read %q as %s, encoding/json as %s", line, dumpWire(fast), dumpWire(slow))
		}
	})
}

func dumpWire(w wireMessage) string {
	b, _ := json.Marshal(w)
	s := string(b)
	if w.Devices != nil {
		s += fmt.Sprintf(" devices=%d", len(*w.Devices))
	}
	return s
}
