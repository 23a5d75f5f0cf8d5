"""Does NVML's undocumented __NVML_USE_RUSD environment variable (named in
libnvidia-ml's strings; RUSD is the driver's read-only user shared data)
change what a memory-info call costs? Times N nvmlDeviceGetMemoryInfo_v2
calls on GPU 0 in a row and N at 1 ms spacing (wall and CPU per call),
and prints the figures it read, so that runs with the variable set and
unset can be compared:
    __NVML_USE_RUSD=1 python3 nvml_rusd.py [N]
Standard library only."""
import ctypes
import os
import resource
import time

N = 2000
nvml = ctypes.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0


class MemV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


m = MemV2()
m.version = (2 << 24) | ctypes.sizeof(MemV2)


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(spacing):
    c0, t0 = cpu(), time.perf_counter()
    for _ in range(N):
        assert nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m)) == 0
        if spacing:
            time.sleep(spacing)
    wall = time.perf_counter() - t0 - N * spacing
    return wall / N * 1e6, (cpu() - c0) / N * 1e6


mode = os.environ.get("__NVML_USE_RUSD", "unset")
for name, spacing in (("back to back", 0), ("1 ms apart", 0.001)):
    w, c = run(spacing)
    print("__NVML_USE_RUSD=%s %-12s wall %.1f us/call, CPU %.1f us/call; used %d MiB free %d MiB" % (
        mode, name, w, c, m.used >> 20, m.free >> 20), flush=True)
