"""An OOM report's context against the truth on a real GPU: the report must
give the process's context even when NVML's last poll lags a burst of
allocations (run by validate.sh).

Run next to an exporter on the default socket: python3 scripts/gpu/oom_context.py URL
It creates a CUDA context, measures its true context (NVML used minus the
allocator's reserved, both at rest), then allocates in a burst under a
4 GiB limit until PyTorch raises OutOfMemoryError, fetches the exporter's
OOM report of this pid and prints the reporter's context beside the truth.
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

import torch

import gpumem

MIB = 1 << 20
URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9481"


def nvml_used(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        p, used = [x.strip() for x in line.split(",")]
        if int(p) == pid:
            return int(used) * MIB
    return None


gpumem.start()
x = torch.ones(1 << 20, device="cuda")
time.sleep(2)
truth = nvml_used(os.getpid()) - torch.cuda.memory_reserved(0)
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(4 * 1024 * MIB / total)
keep = []
try:
    while True:  # a burst: no pause between allocations, so NVML's last poll lags
        keep.append(torch.empty(512 * MIB, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as e:
    print("OOM:", str(e).splitlines()[0][:160])
reserved_at_oom = torch.cuda.memory_reserved(0)
time.sleep(3)
reports = json.load(urllib.request.urlopen(URL + "/api/v1/oom-reports"))["reports"]
mine = [r for r in reports if r["pid"] == os.getpid()]
if not mine:
    print("RESULT no OOM report for pid", os.getpid())
    sys.exit(1)
rep = mine[0]
me = [p for p in rep["processes"] if p["pid"] == os.getpid()]
ctx = me[0].get("context_bytes") if me else None
print(json.dumps({k: rep.get(k) for k in ("gpu", "requested_bytes", "limit_bytes", "free_bytes", "nvml_time", "nvml_delay_seconds", "totals")}, indent=1))
print("reporter in the report:", json.dumps(me[0] if me else None))
print("RESULT truth_context_mib=%.1f report_context_mib=%s stale=%s reserved_at_oom_mib=%.0f within_2mib=%s" % (
    truth / MIB, "none" if ctx is None else "%.1f" % (ctx / MIB), me[0].get("context_stale", False) if me else None,
    reserved_at_oom / MIB, ctx is not None and abs(ctx - truth) <= 2 * MIB))
