package nvmlpoll

import "testing"

// A report on a device NVML lists the process on is confirmed; one on a
// device whose list could not be read, or by a pid this NVML cannot see,
// is not held against the process.
func TestListedOnConfirmsOnlyWhatNVMLCanTell(t *testing.T) {
	snap := &Snapshot{Devices: []Device{
		{UUID: "GPU-a", HasProcesses: true, Processes: []Process{{PID: 1}}},
		{UUID: "GPU-b"}, // its process list could not be read
	}}
	for _, tc := range []struct {
		name string
		sees func(uint32) bool
		pid  uint32
		uuid string
		want bool
	}{
		{"listed", nil, 1, "GPU-a", true},
		{"listed, bare UUID", nil, 1, "a", true},
		{"not listed", nil, 2, "GPU-a", false},
		{"unknown device", nil, 1, "GPU-z", false},
		{"unreadable list", nil, 2, "GPU-b", true},
		{"a pid this NVML cannot see", func(pid uint32) bool { return pid < 100 }, 200, "GPU-a", true},
		{"a pid it can see and does not list", func(pid uint32) bool { return pid < 100 }, 2, "GPU-a", false},
	} {
		if got := snap.ListedOn(tc.sees)(tc.pid, tc.uuid); got != tc.want {
			t.Errorf("%s: ListedOn(%d, %s) = %v, want %v", tc.name, tc.pid, tc.uuid, got, tc.want)
		}
	}
}

func TestKnownDeviceGivesNVMLsSpellingAndTotal(t *testing.T) {
	p := NewPoller(Config{Lib: newMockNode()})
	if _, _, ok := p.KnownDevice(testUUID(0)); ok {
		t.Error("a device was known before the first poll")
	}
	pollOnce(t, p)
	uuid, total, ok := p.KnownDevice(testUUID(0)[len("GPU-"):])
	if !ok || uuid != testUUID(0) || total == 0 {
		t.Errorf("KnownDevice = %q, %d, %v; want %q, its total, true", uuid, total, ok, testUUID(0))
	}
	if _, _, ok := p.KnownDevice("GPU-nope"); ok {
		t.Error("an unknown device was known")
	}
}
