package nvmlpoll

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// callCounter counts the NVML calls made on go-nvml's mocks, which record
// every call: each <Method>Calls() accessor of the library and of every
// device (MIG instances included, when listed in extra).
type callCounter struct {
	s     *server.Server
	extra []*mock.Device
}

// counts returns the calls so far by method name.
func (c callCounter) counts() map[string]int {
	out := map[string]int{}
	add := func(v any) {
		rv := reflect.ValueOf(v)
		t := rv.Type()
		for i := 0; i < t.NumMethod(); i++ {
			m := t.Method(i)
			if !strings.HasSuffix(m.Name, "Calls") || m.Type.NumIn() != 1 || m.Type.NumOut() != 1 || m.Type.Out(0).Kind() != reflect.Slice {
				continue
			}
			if n := rv.Method(i).Call(nil)[0].Len(); n > 0 {
				out[strings.TrimSuffix(m.Name, "Calls")] += n
			}
		}
	}
	add(&c.s.Interface)
	for _, d := range c.s.Devices {
		add(&d.(*server.Device).Device)
	}
	for _, d := range c.extra {
		add(d)
	}
	return out
}

// since returns the calls made after before.
func (c callCounter) since(before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range c.counts() {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// dataCalls are the calls whose answers change from poll to poll.
var dataCalls = map[string]bool{
	"DeviceGetCount": true, "GetMemoryInfo_v2": true, "GetMemoryInfo": true,
	"GetComputeRunningProcesses": true, "GetGraphicsRunningProcesses": true,
	"SystemGetProcessName": true, // once per new pid
}

// identityCalls returns the calls in got that read what does not change
// while the driver is loaded.
func identityCalls(got map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range got {
		if !dataCalls[k] {
			out[k] = v
		}
	}
	return out
}

func TestIdentityIsReadOncePerDevice(t *testing.T) {
	s := newMockNode()
	calls := callCounter{s: s}
	now := time.Unix(1000, 0)
	p := NewPoller(Config{Lib: s, Now: func() time.Time { return now }})
	before := calls.counts()
	const polls = 10
	for i := 0; i < polls; i++ {
		pollOnce(t, p)
		now = now.Add(time.Second)
	}
	got := calls.since(before)
	want := map[string]int{
		// Once at initialisation.
		"Init": 1, "SystemGetDriverVersion": 1, "SystemGetCudaDriverVersion": 1,
		// Once per device.
		"DeviceGetHandleByIndex": 8, "GetUUID": 8, "GetName": 8, "GetPciInfo": 8, "GetMigMode": 8,
		// Once per poll, or per device and poll.
		"DeviceGetCount": polls, "GetMemoryInfo_v2": 8 * polls, "GetComputeRunningProcesses": 8 * polls, "GetGraphicsRunningProcesses": 8 * polls,
		// Once per pid.
		"SystemGetProcessName": 8,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("NVML calls over %d polls:\n got %v\nwant %v", polls, got, want)
	}
	if snap := p.Snapshot(); len(snap.Devices) != 8 || snap.Devices[5].UUID != testUUID(5) || snap.Devices[5].PCIBusID != "00000000:06:00.0" {
		t.Errorf("the cached identity is not in the snapshot: %+v", snap.Devices)
	}
}

// Identity is read again when something says it may have changed, and
// only then.
func TestIdentityIsReadAgain(t *testing.T) {
	tests := []struct {
		name string
		// between runs after a first poll; the poll after it must read the
		// identities again.
		between func(t *testing.T, s *server.Server, p *Poller, now *time.Time)
	}{
		{"after a failed call", func(t *testing.T, s *server.Server, p *Poller, now *time.Time) {
			d := mockDevice(s, 3)
			good := d.GetMemoryInfo_v2Func
			d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_GPU_IS_LOST }
			pollOnce(t, p)
			d.GetMemoryInfo_v2Func = good
		}},
		{"after the refresh interval", func(t *testing.T, _ *server.Server, p *Poller, now *time.Time) {
			*now = now.Add(p.cfg.IdentityRefresh)
		}},
		{"after the driver went away and came back", func(t *testing.T, s *server.Server, p *Poller, _ *time.Time) {
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_DRIVER_NOT_LOADED }
			if err := p.Poll(); err == nil {
				t.Fatal("poll without a driver succeeded")
			}
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 8, nvml.SUCCESS }
		}},
		{"after the device count changed", func(t *testing.T, s *server.Server, p *Poller, _ *time.Time) {
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newMockNode()
			s.DeviceGetCountFunc = func() (int, nvml.Return) { return 8, nvml.SUCCESS }
			calls := callCounter{s: s}
			now := time.Unix(1000, 0)
			p := NewPoller(Config{Lib: s, Now: func() time.Time { return now }})
			pollOnce(t, p)
			pollOnce(t, p)
			tt.between(t, s, p, &now)
			before := calls.counts()
			pollOnce(t, p)
			if got := calls.since(before)["GetUUID"]; got == 0 {
				t.Errorf("no UUID read in the poll after the change")
			}
			before = calls.counts()
			pollOnce(t, p)
			if got := identityCalls(calls.since(before)); len(got) != 0 {
				t.Errorf("the poll after that read the identity again: %v", got)
			}
		})
	}
}

func TestMIGInstancesAreCachedToo(t *testing.T) {
	s := newMockNode()
	enableMIG(s, 2)
	p := NewPoller(Config{Lib: s})
	pollOnce(t, p)
	migs := migDevices(t, s, 2)
	calls := callCounter{s: s, extra: migs}
	before := calls.counts()
	snap := pollOnce(t, p)
	if got := identityCalls(calls.since(before)); len(got) != 0 {
		t.Errorf("a second poll of a node with MIG instances read the identity again: %v", got)
	}
	if len(snap.Devices) != 10 || snap.Devices[3].UUID == "" || len(snap.Devices[3].Processes) != 1 {
		t.Errorf("MIG instances after a cached poll: %+v", snap.Devices[2:5])
	}
}

// migDevices returns the MIG instances enableMIG gave GPU i.
func migDevices(t *testing.T, s *server.Server, i int) []*mock.Device {
	t.Helper()
	var out []*mock.Device
	for j := 0; ; j++ {
		d, ret := mockDevice(s, i).GetMigDeviceHandleByIndex(j)
		if ret != nvml.SUCCESS {
			return out
		}
		out = append(out, d.(*mock.Device))
	}
}

// BenchmarkPollMock is one poll of the eight mock H200s with 16 processes
// each. It reports the NVML calls a poll makes: those that read what
// changes (memory info, process lists, the device count) and those that
// read identity, which must be 0 once the first poll has read it.
func BenchmarkPollMock(b *testing.B) {
	s := newMockNode()
	for i := range s.Devices {
		procs := make([]nvml.ProcessInfo, 16)
		for j := range procs {
			procs[j] = nvml.ProcessInfo{Pid: uint32(10000 + 100*i + j), UsedGpuMemory: uint64(j+1) * GiB}
		}
		mockDevice(s, i).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
	}
	p := NewPoller(Config{Lib: s})
	if err := p.Poll(); err != nil {
		b.Fatal(err)
	}
	calls := callCounter{s: s}
	before := calls.counts()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := p.Poll(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	var data, identity int
	for k, v := range calls.since(before) {
		if dataCalls[k] {
			data += v
		} else {
			identity += v
		}
	}
	b.ReportMetric(float64(data)/float64(b.N), "data-calls/op")
	b.ReportMetric(float64(identity)/float64(b.N), "identity-calls/op")
}

// BenchmarkRealDataCalls makes only the calls whose answers change, as a
// poll makes them (device count, memory info v2, compute and graphics
// process lists of every device, handles read once): the floor of
// BenchmarkRealPoll.
func BenchmarkRealDataCalls(b *testing.B) {
	lib := realNVML(b)
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		b.Fatal(ret)
	}
	devs := make([]nvml.Device, n)
	for i := range devs {
		if devs[i], ret = lib.DeviceGetHandleByIndex(i); ret != nvml.SUCCESS {
			b.Fatal(ret)
		}
	}
	for b.Loop() {
		lib.DeviceGetCount()
		for _, d := range devs {
			d.GetMemoryInfo_v2()
			d.GetComputeRunningProcesses()
			d.GetGraphicsRunningProcesses()
		}
	}
}
