package nvml

import "testing"

func TestSimulatedNodeInvariantsHoldAtEveryStep(t *testing.T) {
	var steps []SimStep
	sim := NewSimulator(SimConfig{ProcessesPerGPU: 3, Seed: 7, OnStep: func(s SimStep) { steps = append(steps, s) }})
	p := NewPoller(Config{Lib: sim.Interface(), BeforePoll: sim.Step})
	var sawUnattributed, sawPeakAbove, sawExit, sawOOM, sawInactive bool
	for i := 0; i < 300; i++ {
		snap := pollOnce(t, p)
		if len(snap.Devices) != 8 {
			t.Fatalf("step %d: %d devices", i, len(snap.Devices))
		}
		for _, d := range snap.Devices {
			m := d.Memory
			if m.Total != m.Free+m.Used+m.Reserved {
				t.Fatalf("step %d GPU %d: total %d != free %d + used %d + reserved %d", i, d.Index, m.Total, m.Free, m.Used, m.Reserved)
			}
			if d.ProcessUsedSum() > m.Used {
				t.Fatalf("step %d GPU %d: processes use more than the GPU", i, d.Index)
			}
			if d.Unattributed() > 0 {
				if d.Index != SimUnattributedGPU {
					t.Fatalf("step %d: unattributed memory on GPU %d", i, d.Index)
				}
				sawUnattributed = true
			}
			for _, pr := range d.Processes {
				if pr.PeakBytes < pr.UsedBytes {
					t.Fatalf("peak below used: %+v", pr)
				}
				if pr.PeakBytes > pr.UsedBytes {
					sawPeakAbove = true
				}
				if pr.UsedBytes < SimContextBytes {
					t.Fatalf("process below the context baseline: %+v", pr)
				}
			}
		}
		s := steps[len(steps)-1]
		sawExit = sawExit || len(s.Exited) > 0
		sawOOM = sawOOM || len(s.OOMs) > 0
		for _, a := range s.Allocators {
			if a.Active > a.Reserved || a.Allocated > a.Active || a.PeakReserved < a.Reserved || a.PeakActive < a.Active {
				t.Fatalf("step %d: inconsistent allocator state %+v", i, a)
			}
			if a.Reserved > a.Active {
				sawInactive = true
			}
		}
	}
	for what, saw := range map[string]bool{"unattributed memory": sawUnattributed, "a peak above used": sawPeakAbove,
		"a process exit": sawExit, "an OOM": sawOOM, "inactive memory": sawInactive} {
		if !saw {
			t.Errorf("300 steps never showed %s", what)
		}
	}
}

func TestSimulatedNodeIsDeterministicForASeed(t *testing.T) {
	run := func(seed int64) []uint64 {
		sim := NewSimulator(SimConfig{ProcessesPerGPU: 2, Seed: seed})
		p := NewPoller(Config{Lib: sim.Interface(), BeforePoll: sim.Step})
		var used []uint64
		for i := 0; i < 50; i++ {
			snap := pollOnce(t, p)
			for _, d := range snap.Devices {
				used = append(used, d.Memory.Used)
			}
		}
		return used
	}
	a, b, c := run(3), run(3), run(4)
	same := func(x, y []uint64) bool {
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if !same(a, b) {
		t.Error("the same seed gave two different runs")
	}
	if same(a, c) {
		t.Error("different seeds gave the same run")
	}
}

func TestSimulatedUUIDsArePinned(t *testing.T) {
	sim := NewSimulator(SimConfig{})
	snap := pollOnce(t, NewPoller(Config{Lib: sim.Interface(), BeforePoll: sim.Step}))
	for i, d := range snap.Devices {
		if d.UUID != SimUUIDs[i] {
			t.Errorf("GPU %d UUID = %s, want %s", i, d.UUID, SimUUIDs[i])
		}
	}
}

func TestNormalizeUUID(t *testing.T) {
	const want = "GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000003"
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{want, want, true},
		{"gpu-5F0E3C1A-7B2D-4E89-A1C3-000000000003", want, true},
		{"5f0e3c1a-7b2d-4e89-a1c3-000000000003", want, true},
		{"5f0e3c1a7b2d4e89a1c3000000000003", want, true},
		{"MIG-0c0f2a1e-1111-5d6c-9e2f-0123456789ab", "MIG-0c0f2a1e-1111-5d6c-9e2f-0123456789ab", true},
		{"5f0e3c1a7b2d4e89a1c300000000000", "", false},
		{"5f0e3c1a-7b2d4e89-a1c3-000000000003x", "", false},
		{"5f0e3c1a7b2d-4e89a1c3-000000000003", "", false},
		{"zz0e3c1a7b2d4e89a1c3000000000003", "", false},
		{"", "", false},
		{"MIG-", "", false},
	} {
		got, ok := NormalizeUUID(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("NormalizeUUID(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
