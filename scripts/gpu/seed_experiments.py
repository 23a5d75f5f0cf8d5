"""Rerun the seed article's PyTorch allocator experiments on a real GPU with
gpumem_exporter beside the process, and check after each step that /metrics
reads back what torch.cuda.memory_stats() and NVML say.

The process is instrumented only with gpumem.start(). Run by validate.sh;
prints a Markdown table and writes JSON to $OUT (or the current directory).
"""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import gpumem

EXPORTER = os.environ.get("GPUMEM_EXPORTER", "http://127.0.0.1:9481")
MIB = 1 << 20
PID = os.getpid()
OUT = os.environ.get("OUT", ".")
LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape():
    with urllib.request.urlopen(EXPORTER + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = LINE.match(line)
        if m:
            out.append((m.group(1), dict(LABEL.findall(m.group(3) or "")), float(m.group(4))))
    return out


def mine(samples, uuid):
    """This process's per-process series on the GPU, by metric name."""
    return {n: v for n, l, v in samples if l.get("pid") == str(PID) and l.get("uuid") == uuid}


def nvml_used(uuid):
    """This process's usedGpuMemory in bytes, straight from NVML (pynvml when
    there, else nvidia-smi in MiB)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == PID:
                return p.usedGpuMemory, "bytes"
        return None, "bytes"
    except Exception:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
        for row in out.strip().splitlines():
            pid, used = [c.strip() for c in row.split(",")]
            if int(pid) == PID:
                return int(used) * MIB, "MiB"
        return None, "MiB"


def torch_stats(torch):
    s = torch.cuda.memory_stats(0)
    g = lambda k: int(s.get(k, 0))
    return {
        "reserved": g("reserved_bytes.all.current"),
        "active": g("active_bytes.all.current"),
        "allocated": g("allocated_bytes.all.current"),
        "inactive_split": g("inactive_split_bytes.all.current"),
        "retries": g("num_alloc_retries"),
        "ooms": g("num_ooms"),
    }


def settle(torch, uuid, want_present=True):
    """Wait until the exporter shows this step's allocator state (one push
    plus one poll), then return (exporter series, torch stats, NVML used)."""
    deadline = time.time() + 6
    while True:
        ts = torch_stats(torch) if torch.cuda.is_initialized() else None
        used, unit = nvml_used(uuid)
        m = mine(scrape(), uuid)
        ok = True
        if ts is not None and want_present:
            ok = (m.get("gpumem_allocator_reserved_bytes") == ts["reserved"]
                  and m.get("gpumem_allocator_active_bytes") == ts["active"]
                  and m.get("gpumem_allocator_ooms_total", 0) == ts["ooms"]
                  and (used is None or m.get("gpumem_process_memory_used_bytes") == used or unit == "MiB"))
        if ok or time.time() > deadline:
            return m, ts, used, unit, ok
        time.sleep(0.1)


def ceil_mib(v):
    """nvidia-smi rounds bytes up to the next MiB (615.06 MiB prints 616)."""
    return None if v is None else -(-int(v) // MIB)


def compare_with_nvidia_smi(uuid):
    """Every GPU and process value against nvidia-smi, in MiB (rounded up as
    nvidia-smi does), with the exporter's bytes."""
    samples = scrape()
    gpu = {n: v for n, l, v in samples if l.get("uuid") == uuid and "pid" not in l}
    q = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.total,memory.used,memory.free,memory.reserved",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    rows = []
    for line in q.strip().splitlines():
        u, total, used, free, reserved = [c.strip() for c in line.split(",")]
        if u != uuid:
            continue
        for field, smi in (("total", total), ("used", used), ("free", free), ("reserved", reserved)):
            v = gpu.get("gpumem_gpu_memory_%s_bytes" % field)
            rows.append(("gpu memory." + field, int(smi), ceil_mib(v), v))
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout
    for line in apps.strip().splitlines():
        pid, u, used = [c.strip() for c in line.split(",")]
        v = [v for n, l, v in samples if n == "gpumem_process_memory_used_bytes" and l.get("pid") == pid and l.get("uuid") == u]
        rows.append(("process %s used_memory" % pid, int(used), ceil_mib(v[0]) if v else None, v[0] if v else None))
    return rows


def main():
    import torch
    gpumem.start()
    # The UUID from NVML: asking torch would initialise CUDA before the
    # first step. The process sees one GPU (CUDA_VISIBLE_DEVICES or a
    # one-GPU machine).
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", visible],
                          capture_output=True, text=True).stdout.strip()
    G = {}
    big = (200, 300, 200, 20)      # 916 MiB of float32
    bigger = (200, 300, 200, 25)   # 1144 MiB

    def oom_step():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(4 * (1 << 30) / total, 0)
        held = []
        try:
            for _ in range(10):
                held.append(torch.randn(*big, device="cuda"))
        except torch.cuda.OutOfMemoryError as e:
            G["oom_message"] = str(e).splitlines()[0]
        del held

    steps = [
        ("start (no CUDA yet)", lambda: None),
        ("randn(2,3)", lambda: G.__setitem__("a", torch.randn(2, 3, device="cuda"))),
        ("randn(200,300,200,20) unreferenced", lambda: torch.randn(*big, device="cuda")),
        ("x = big", lambda: G.__setitem__("x", torch.randn(*big, device="cuda"))),
        ("x = small after big", lambda: G.__setitem__("x", torch.randn(2, 3, device="cuda"))),
        ("x = big then bigger", lambda: (G.__setitem__("x", torch.randn(*big, device="cuda")),
                                         G.__setitem__("y", torch.randn(*bigger, device="cuda")))),
        ("code B (x reassigned 6 times)", lambda: [G.pop("y", None)] + [G.__setitem__("x", torch.randn(*big, device="cuda")) for _ in range(6)]),
        ("x = 1", lambda: G.__setitem__("x", 1)),
        ("empty_cache", torch.cuda.empty_cache),
        ("code A / append 6 big", lambda: G.__setitem__("L", [torch.randn(*big, device="cuda") for _ in range(6)])),
        ("del list", lambda: G.pop("L")),
        ("empty_cache 2", torch.cuda.empty_cache),
        ("after OOM", oom_step),
        ("final empty_cache", torch.cuda.empty_cache),
    ]
    table, all_ok, smi_rows = [], True, None
    for name, action in steps:
        action()
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        m, ts, used, unit, ok = settle(torch, uuid, want_present=torch.cuda.is_initialized())
        exp = lambda k: m.get(k)
        row = {
            "step": name,
            "nvml_used": used,
            "nvml_unit": unit,
            "exporter_used": exp("gpumem_process_memory_used_bytes"),
            "torch": ts,
            "exporter": {
                "reserved": exp("gpumem_allocator_reserved_bytes"),
                "active": exp("gpumem_allocator_active_bytes"),
                "inactive": exp("gpumem_allocator_inactive_bytes"),
                "allocated": exp("gpumem_allocator_allocated_bytes"),
                "inactive_split": exp("gpumem_allocator_inactive_split_bytes"),
                "context": exp("gpumem_process_context_bytes"),
                "retries": exp("gpumem_allocator_alloc_retries_total"),
                "ooms": exp("gpumem_allocator_ooms_total"),
                "last_oom_request": exp("gpumem_allocator_last_oom_request_bytes"),
            },
            "match": ok,
        }
        all_ok = all_ok and ok
        table.append(row)
        if name == "code A / append 6 big":
            smi_rows = compare_with_nvidia_smi(uuid)

    mib = lambda v: "-" if v is None else "%d" % (int(v) // MIB)
    print("| step | NVML used | exporter used | torch reserved | exporter reserved | active (torch/exp) | inactive | inactive_split | context | retries | ooms | match |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        t, e = r["torch"] or {}, r["exporter"]
        print("| %s | %s | %s | %s | %s | %s/%s | %s | %s | %s | %s | %s | %s |" % (
            r["step"], mib(r["nvml_used"]), mib(r["exporter_used"]), mib(t.get("reserved")), mib(e["reserved"]),
            mib(t.get("active")), mib(e["active"]), mib(e["inactive"]), mib(e["inactive_split"]), mib(e["context"]),
            "-" if e["retries"] is None else int(e["retries"]), "-" if e["ooms"] is None else int(e["ooms"]),
            "yes" if r["match"] else "NO"))
    print()
    print("OOM message:", G.get("oom_message"))
    print("last_oom_request_bytes:", table[-1]["exporter"]["last_oom_request"])
    print()
    print("| nvidia-smi field | nvidia-smi MiB | exporter bytes | exporter MiB (rounded up) | equal |")
    print("|---|---|---|---|---|")
    for f, s, e, b in smi_rows or []:
        print("| %s | %s | %s | %s | %s |" % (f, s, "-" if b is None else int(b), e, "yes" if s == e else "NO"))
    with open(os.path.join(OUT, "seed.json"), "w") as f:
        json.dump({"steps": table, "nvidia_smi": smi_rows, "oom_message": G.get("oom_message")}, f, indent=1)
    print("ALL STEPS MATCH" if all_ok else "SOME STEPS DID NOT MATCH")


if __name__ == "__main__":
    main()
