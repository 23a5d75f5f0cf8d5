package wire

import "testing"

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

// NormalizeUUID's shortcut for NVML's spelling agrees with the full
// normalisation on every one-character change of a UUID.
func TestNormalizeUUIDShortcutAgrees(t *testing.T) {
	const base = "GPU-5f0e3c1a-7b2d-4e89-a1c3-000000000003"
	inputs := []string{base, base + " ", " " + base, base[:39], base + "0"}
	for i := range base {
		for _, c := range "gG-0aAfF9 zPUu" {
			inputs = append(inputs, base[:i]+string(c)+base[i+1:])
		}
	}
	for _, in := range inputs {
		got, ok := NormalizeUUID(in)
		want, wantOK := normalizeUUID(in)
		if got != want || ok != wantOK {
			t.Errorf("NormalizeUUID(%q) = %q, %v; the full normalisation gives %q, %v", in, got, ok, want, wantOK)
		}
	}
}
