"""Does NVML's undocumented __NVML_USE_RUSD environment variable (named in
libnvidia-ml's strings; RUSD is the driver's read-only user shared data)
change what a memory-info call costs? Times N nvmlDeviceGetMemoryInfo_v2
calls on GPU 0 in a row and N at 1 ms spacing (wall and CPU per call),
and prints the figures it read, so that runs with the variable set and
unset can be compared:
    __NVML_USE_RUSD=1 python3 nvml_rusd.py [N]
Standard library only."""
import os
import sys
import time

import nvml_ctypes as nv

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
nv.init()
h = nv.handles()[0]
m = nv.memory_info(h)
cpu = nv.cpu_seconds


def run(spacing):
    c0, t0 = cpu(), time.perf_counter()
    for _ in range(N):
        nv.memory_info(h, m)
        if spacing:
            time.sleep(spacing)
    wall = time.perf_counter() - t0 - N * spacing
    return wall / N * 1e6, (cpu() - c0) / N * 1e6


mode = os.environ.get("__NVML_USE_RUSD", "unset")
for name, spacing in (("back to back", 0), ("1 ms apart", 0.001)):
    w, c = run(spacing)
    print("__NVML_USE_RUSD=%s %-12s wall %.1f us/call, CPU %.1f us/call; used %d MiB free %d MiB" % (
        mode, name, w, c, m.used >> 20, m.free >> 20), flush=True)
