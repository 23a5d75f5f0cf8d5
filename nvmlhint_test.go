package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/go-kit/log"
)

// On the default backend, a machine without the NVIDIA driver, or whose
// driver lists no GPU, says once what to do: install the driver, or run the
// simulated backend.
func TestNoGPUPointsToTheDriverAndTheSimulatedBackend(t *testing.T) {
	for _, tc := range []struct {
		name  string
		init  nvml.Return
		count int
		hint  bool
	}{
		{"no driver library", nvml.ERROR_LIBRARY_NOT_FOUND, 0, true},
		{"driver not loaded", nvml.ERROR_DRIVER_NOT_LOADED, 0, true},
		{"driver without a GPU", nvml.SUCCESS, 0, true},
		{"a GPU", nvml.SUCCESS, 1, false},
		{"no permission", nvml.ERROR_NO_PERMISSION, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			lib := &hintingNVML{Interface: &mock.Interface{
				InitFunc:           func() nvml.Return { return tc.init },
				DeviceGetCountFunc: func() (int, nvml.Return) { return tc.count, nvml.SUCCESS },
			}, logger: log.NewLogfmtLogger(&buf)}
			for range 3 { // the poller retries: the hint is logged once
				if lib.Init() == nvml.SUCCESS {
					lib.DeviceGetCount()
				}
			}
			got := buf.String()
			if !tc.hint {
				if got != "" {
					t.Errorf("logged %q, want nothing", got)
				}
				return
			}
			if strings.Count(got, "\n") != 1 {
				t.Errorf("logged %d lines, want 1:\n%s", strings.Count(got, "\n"), got)
			}
			for _, w := range []string{"--nvml.backend=simulated", "install the NVIDIA driver", "libnvidia-ml.so.1"} {
				if !strings.Contains(got, w) {
					t.Errorf("log %q does not say %q", got, w)
				}
			}
		})
	}
}
