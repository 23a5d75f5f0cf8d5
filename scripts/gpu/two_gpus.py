"""Processes on one GPU and spread over two, next to a running exporter (run
by validate.sh; with one GPU it runs only the workers that fit on it).
Starts instrumented PyTorch workers, then checks /metrics against
torch.cuda.memory_stats() and NVML (pynvml), by UUID.

Workers:
  A  CUDA_VISIBLE_DEVICES=1,0, allocates on its cuda:0 (= NVML GPU 1)
  B  uses only GPU 0 (no context may appear on GPU 1)
  C  uses both GPUs
  D, E share GPU 0
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

EXPORTER = os.environ.get("GPUMEM_EXPORTER", "http://127.0.0.1:9481")
MIB = 1 << 20

WORKER = r'''
import json, sys, time, torch, gpumem
gpumem.start()
devs = [int(d) for d in sys.argv[1].split(",")]
mib = int(sys.argv[2])
keep = [torch.empty(mib << 20, dtype=torch.uint8, device="cuda:%d" % d) for d in devs]
for d in devs:
    torch.cuda.synchronize(d)
out = {}
for d in devs:
    s = torch.cuda.memory_stats(d)
    out["GPU-" + str(torch.cuda.get_device_properties(d).uuid)] = {
        "reserved": s["reserved_bytes.all.current"], "active": s["active_bytes.all.current"]}
print(json.dumps(out), flush=True)
sys.stdin.readline()
'''


def scrape():
    with urllib.request.urlopen(EXPORTER + "/metrics", timeout=5) as r:
        return r.read().decode()


def series(text, name):
    import re
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[line.index("{"):line.rindex("}")]))
            out.append((labels, float(line.rsplit(" ", 1)[1])))
    return out


def nvml_processes():
    import pynvml
    pynvml.nvmlInit()
    out = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        out[uuid] = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    return out


def start(name, devs, mib, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.Popen([sys.executable, "-c", WORKER, devs, str(mib)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stats = json.loads(p.stdout.readline())
    return name, p, stats


def gpu_count():
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    return len(out.split())


def main():
    n = gpu_count()
    if n >= 2:
        workers = [
            start("A", "0", 1024, {"CUDA_VISIBLE_DEVICES": "1,0"}),
            start("B", "0", 2048, {"CUDA_VISIBLE_DEVICES": "0,1"}),
            start("C", "0,1", 3072, {"CUDA_VISIBLE_DEVICES": "0,1"}),
            start("D", "0", 512, {"CUDA_VISIBLE_DEVICES": "0,1"}),
            start("E", "0", 768, {"CUDA_VISIBLE_DEVICES": "0,1"}),
        ]
    else:
        # One GPU: only the two processes sharing it (D, E) can run.
        print("one GPU: workers A (reordered devices), B (one of two GPUs) and C (both GPUs) need two; not run")
        workers = [start("D", "0", 512), start("E", "0", 768)]
    time.sleep(3)  # a push and a poll
    text = scrape()
    nv = nvml_processes()
    gpu_of = {l["uuid"]: l["gpu"] for l, _ in series(text, "gpumem_gpu_info")}
    ok = True
    print("| worker | pid | uuid | gpu label | torch reserved MiB | exporter reserved MiB | NVML used MiB | exporter used MiB | context MiB | match |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, p, stats in workers:
        for uuid, st in stats.items():
            sel = lambda n: [v for l, v in series(text, n) if l["pid"] == str(p.pid) and l["uuid"] == uuid]
            res, used, ctx = sel("gpumem_allocator_reserved_bytes"), sel("gpumem_process_memory_used_bytes"), sel("gpumem_process_context_bytes")
            nvu = nv.get(uuid, {}).get(p.pid)
            match = res == [st["reserved"]] and used == [nvu]
            ok &= match
            print("| %s | %d | %s | %s | %d | %s | %s | %s | %s | %s |" % (
                name, p.pid, uuid, gpu_of.get(uuid), st["reserved"] // MIB, res and int(res[0]) // MIB,
                nvu and nvu // MIB, used and int(used[0]) // MIB, ctx and int(ctx[0]) // MIB, "yes" if match else "NO"))
        listed_on = [u for u, procs in nv.items() if p.pid in procs]
        print("worker %s: NVML lists it on %s; used by torch on %s" % (name, sorted(listed_on), sorted(stats)))
        if sorted(listed_on) != sorted(stats):
            ok = False
            print("  NO: a context on a device the worker did not use")
    for l, v in series(text, "gpumem_gpu_memory_unattributed_bytes"):
        print("unattributed on GPU %s: %.1f MiB" % (l["gpu"], v / MIB))
    print("ALL MATCH" if ok else "SOME DID NOT MATCH")
    for _, p, _ in workers:
        p.stdin.close()
        p.wait()


if __name__ == "__main__":
    main()
