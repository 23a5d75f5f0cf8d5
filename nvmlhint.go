package main

import (
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
)

// noGPUHint is what the log says, once, when the default backend finds no
// GPU to read: no NVIDIA driver (no libnvidia-ml.so.1), or a driver that
// lists no device. The landing page's "No GPU data yet" says the same.
const noGPUHint = "no NVIDIA GPU to read here: on a GPU node, install the NVIDIA driver (it brings libnvidia-ml.so.1, which this binary loads at run time); to see the product without a GPU, run with --nvml.backend=simulated"

// hintingNVML is the real NVML library, which logs noGPUHint the first time
// it cannot be initialised for want of a driver, or finds no device.
type hintingNVML struct {
	nvml.Interface
	logger log.Logger
	once   sync.Once
}

func (h *hintingNVML) hint(why string) {
	h.once.Do(func() { level.Warn(h.logger).Log("msg", noGPUHint, "nvml", why) })
}

func (h *hintingNVML) Init() nvml.Return {
	ret := h.Interface.Init()
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		h.hint(ret.Error())
	}
	return ret
}

func (h *hintingNVML) DeviceGetCount() (int, nvml.Return) {
	n, ret := h.Interface.DeviceGetCount()
	if ret == nvml.SUCCESS && n == 0 {
		h.hint("no device")
	}
	return n, ret
}
