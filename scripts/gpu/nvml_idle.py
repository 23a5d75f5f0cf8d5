"""The floor of a poll's CPU at rest: this process makes only the NVML
calls a poll of gpumem_exporter makes (device count, memory info v2,
compute and graphics process lists of every device) once a second for
SECONDS (default 30), sleeping between, and prints its CPU over that time
as a percentage of one core, and the wall time of one round of calls.
Standard library only."""
import sys
import time

import nvml_ctypes as nv

seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
nv.init()
handles = nv.handles()
m = nv.MemV2()
cpu = nv.cpu_seconds


def round_of_calls():
    nv.device_count()
    for h in handles:
        nv.memory_info(h, m)
        nv.processes(h)
        nv.processes(h, graphics=True)


round_of_calls()
walls = []
c0 = cpu()
for _ in range(seconds):
    t = time.perf_counter()
    round_of_calls()
    walls.append(time.perf_counter() - t)
    time.sleep(1)
c1 = cpu()
walls.sort()
print("NVML data calls once a second for %d s: %.4f%% of a core (this process, Python's loop included); one round: median %.0f us, max %.0f us"
      % (seconds, 100 * (c1 - c0) / seconds, 1e6 * walls[len(walls) // 2], 1e6 * walls[-1]))
