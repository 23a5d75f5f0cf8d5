package nvmlpoll

import (
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/fieldtest"
)

func TestSameReadingsComparesEverythingButTime(t *testing.T) {
	base := func() *Snapshot {
		return &Snapshot{Time: time.Unix(100, 0), DriverVersion: "580.159.04", CUDADriverVersion: "13.0", Devices: []Device{
			{Index: 0, UUID: "GPU-a", Name: "NVIDIA H200", PCIBusID: "0000:01:00.0", MIGMode: MIGDisabled,
				HasMemory: true, Memory: Memory{Total: 100, Free: 60, Used: 30, Reserved: 10, HasReserved: true},
				HasProcesses: true, Processes: []Process{{PID: 1, HasUsed: true, UsedBytes: 20, PeakBytes: 20, Name: "python3", Compute: true}}},
			{Index: 1, UUID: "GPU-b", MIGMode: MIGDisabled, HasMemory: true, Memory: Memory{Total: 100, Free: 100}},
		}}
	}
	cases := []struct {
		name   string
		change func(s *Snapshot)
		same   bool
	}{
		{"nothing", func(*Snapshot) {}, true},
		{"time", func(s *Snapshot) { s.Time = s.Time.Add(time.Second) }, true},
		{"free memory", func(s *Snapshot) { s.Devices[0].Memory.Free-- }, false},
		{"memory read failed", func(s *Snapshot) { s.Devices[1].HasMemory = false }, false},
		{"a process's used", func(s *Snapshot) { s.Devices[0].Processes[0].UsedBytes++ }, false},
		{"a process's peak", func(s *Snapshot) { s.Devices[0].Processes[0].PeakBytes++ }, false},
		{"a process's name", func(s *Snapshot) { s.Devices[0].Processes[0].Name = "" }, false},
		{"a process more", func(s *Snapshot) { s.Devices[1].Processes = []Process{{PID: 2}} }, false},
		{"lists not read", func(s *Snapshot) { s.Devices[0].HasProcesses = false }, false},
		{"a device fewer", func(s *Snapshot) { s.Devices = s.Devices[:1] }, false},
		{"another device", func(s *Snapshot) { s.Devices[1].UUID = "GPU-c" }, false},
		{"MIG mode", func(s *Snapshot) { s.Devices[1].MIGMode = MIGEnabled }, false},
		{"driver", func(s *Snapshot) { s.DriverVersion = "580.159.05" }, false},
	}
	for _, c := range cases {
		a, b := base(), base()
		c.change(b)
		if got := a.SameReadings(b); got != c.same {
			t.Errorf("%s changed: SameReadings = %v, want %v", c.name, got, c.same)
		}
		if got := b.SameReadings(a); got != c.same {
			t.Errorf("%s changed, compared the other way: SameReadings = %v, want %v", c.name, got, c.same)
		}
	}
	var none *Snapshot
	if !none.SameReadings(nil) || none.SameReadings(base()) || base().SameReadings(nil) {
		t.Error("nil snapshots: only two nils read the same")
	}
}

// Every field of a snapshot, its devices and their processes counts in
// SameReadings, Time alone aside: a field added without being compared
// would let the scrape cache and the OOM reports' observe cache keep
// readings that changed.
func TestSameReadingsSeesEveryField(t *testing.T) {
	base, variants, unexported := fieldtest.Fields[Snapshot]()
	if len(unexported) > 0 {
		t.Errorf("unexported fields %q: SameReadings must compare them, and this test cannot vary them", unexported)
	}
	if !base.SameReadings(&base) {
		t.Fatal("a snapshot does not read the same as itself")
	}
	for _, v := range variants {
		want := v.Path == "Time"
		if got := base.SameReadings(&v.Value); got != want {
			t.Errorf("%s changed: SameReadings = %v, want %v", v.Path, got, want)
		}
		if got := v.Value.SameReadings(&base); got != want {
			t.Errorf("%s changed, compared the other way: SameReadings = %v, want %v", v.Path, got, want)
		}
	}
}
