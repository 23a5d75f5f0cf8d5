"""The instrumented processes of the GPU validation: each runs next to a
running exporter (at $GPUMEM_EXPORTER, default http://127.0.0.1:9481, on
the default socket) and checks what it serves against the framework's own
figures, NVML and nvidia-smi. validate.sh, foresight.sh, idle.sh,
compare_peers.sh and profile.sh run them; they need torch (jax, cupy for
`frameworks`) and the gpumem client on PYTHONPATH.

  workloads.py hold MIB
      Holds MIB MiB on GPU 0 (instrumented with gpumem) until killed.
  workloads.py seed-experiments
      Reruns the seed article's PyTorch allocator experiments, checking
      after each step that /metrics reads back what
      torch.cuda.memory_stats() and NVML say; prints a Markdown table and
      writes seed.json to $OUT (or the current directory).
  workloads.py two-gpus
      Processes on one GPU and spread over two: instrumented PyTorch
      workers whose /metrics are checked against torch.cuda.memory_stats()
      and NVML (pynvml), by UUID; with one GPU, only the workers that fit:
        A  CUDA_VISIBLE_DEVICES=1,0, allocates on its cuda:0 (= NVML GPU 1)
        B  uses only GPU 0 (no context may appear on GPU 1)
        C  uses both GPUs
        D, E share GPU 0
  workloads.py frameworks jax|cupy
      A JAX or CuPy process instrumented with gpumem.start(): its
      allocator figures against what the exporter serves for its pid.
  workloads.py oom-context [URL]
      An OOM report's context against the truth: the report must give the
      process's context even when NVML's last poll lags a burst of
      allocations. It creates a CUDA context, measures its true context
      (NVML used minus the allocator's reserved, both at rest), then
      allocates in a burst under a 4 GiB limit until PyTorch raises
      OutOfMemoryError, fetches the exporter's OOM report of this pid and
      prints the reporter's context beside the truth.
  workloads.py foresight KIND OUTDIR
      One workload of the foresight validation (foresight.sh), KIND one of
        leak95     a training loop that keeps each step's output with its
                   graph, a step a second, about 94 MiB a step, under a
                   9 GiB limit
        leak7m     the same at about 29 MiB a step under an 11.9 GiB limit
        steady     5 minutes of training whose memory is the same step
                   after step
        eval       a minute of training, then an evaluation batch without
                   torch.no_grad() that does not fit under a 6 GiB limit
        too_large  a request larger than the GPU
      Each writes OUTDIR/KIND.json: when it started, when the daemon's
      first warning came (through gpumem.on_oom_risk, whose function also
      saves a checkpoint to OUTDIR/KIND.ckpt), and when the OOM was
      raised. Its stderr holds what the client printed: the warning and
      the verdict.
  workloads.py foresight-summary OUTDIR
      Summarises a run of foresight.sh: for each workload, when it was
      warned before its OOM (in-process, from its record), when
      GPUWorkloadOOMRisk would have fired (the first 15 s scrape with
      gpumem_allocator_time_to_oom_seconds under 600 for its pid, plus one
      15 s evaluation), whether its checkpoint exists, the verdict, and
      what its stderr printed (standard library only)."""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

EXPORTER = os.environ.get("GPUMEM_EXPORTER", "http://127.0.0.1:9481")
MIB = 1 << 20
GiB = 1 << 30
PID = os.getpid()
OUT = os.environ.get("OUT", ".")
LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape_text():
    with urllib.request.urlopen(EXPORTER + "/metrics", timeout=5) as r:
        return r.read().decode()


# hold

def hold(mib):
    import gpumem
    import torch

    gpumem.start()
    x = torch.empty(mib * (1 << 20), dtype=torch.uint8, device="cuda")  # noqa: F841 (held)
    torch.cuda.synchronize()
    print("holding", mib, "MiB", flush=True)
    while True:
        time.sleep(1)


# seed-experiments

def scrape_samples():
    text = scrape_text()
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = LINE.match(line)
        if m:
            out.append((m.group(1), dict(LABEL.findall(m.group(3) or "")), float(m.group(4))))
    return out


def own_series(samples, uuid):
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
        m = own_series(scrape_samples(), uuid)
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
    samples = scrape_samples()
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


def seed_experiments():
    import gpumem
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


# two-gpus

TWO_GPUS_WORKER = r'''
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


def series(text, name):
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


def start_worker(name, devs, mib, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.Popen([sys.executable, "-c", TWO_GPUS_WORKER, devs, str(mib)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stats = json.loads(p.stdout.readline())
    return name, p, stats


def gpu_count():
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    return len(out.split())


def two_gpus():
    n = gpu_count()
    if n >= 2:
        workers = [
            start_worker("A", "0", 1024, {"CUDA_VISIBLE_DEVICES": "1,0"}),
            start_worker("B", "0", 2048, {"CUDA_VISIBLE_DEVICES": "0,1"}),
            start_worker("C", "0,1", 3072, {"CUDA_VISIBLE_DEVICES": "0,1"}),
            start_worker("D", "0", 512, {"CUDA_VISIBLE_DEVICES": "0,1"}),
            start_worker("E", "0", 768, {"CUDA_VISIBLE_DEVICES": "0,1"}),
        ]
    else:
        # One GPU: only the two processes sharing it (D, E) can run.
        print("one GPU: workers A (reordered devices), B (one of two GPUs) and C (both GPUs) need two; not run")
        workers = [start_worker("D", "0", 512), start_worker("E", "0", 768)]
    time.sleep(3)  # a push and a poll
    text = scrape_text()
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


# frameworks

def framework_series():
    text = urllib.request.urlopen(EXPORTER + "/metrics", timeout=5).read().decode()
    pid = 'pid="%d"' % os.getpid()
    return [l for l in text.splitlines() if pid in l and (l.startswith("gpumem_allocator_reserved") or l.startswith("gpumem_allocator_active")
                                                         or l.startswith("gpumem_process_info") or l.startswith("gpumem_process_context"))]


def frameworks(which):
    import gpumem
    if which == "jax":
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.1")
        import jax
        import jax.numpy as jnp
        gpumem.start()
        x = jnp.ones((256, 1024, 1024), dtype=jnp.float32)  # 1 GiB
        x.block_until_ready()
        own = lambda: {k: v for k, v in jax.local_devices()[0].memory_stats().items()
                       if k in ("bytes_in_use", "pool_bytes", "peak_bytes_in_use", "bytes_limit")}
    else:
        import cupy
        gpumem.start()
        x = cupy.ones((256, 1024, 1024), dtype=cupy.float32)  # 1 GiB
        cupy.cuda.Device().synchronize()
        pool = cupy.get_default_memory_pool()
        own = lambda: {"used_bytes": pool.used_bytes(), "total_bytes": pool.total_bytes()}
    # The client pushes at its own pace: the first report may predate the
    # allocation, so wait until the exporter serves the framework's own
    # figure of memory in use (or give up and show what it serves).
    in_use = own().get("bytes_in_use", own().get("used_bytes"))
    deadline = time.time() + 8
    lines = []
    while time.time() < deadline:
        lines = framework_series()
        if any(l.startswith("gpumem_allocator_active_bytes") and float(l.split()[-1]) == in_use for l in lines):
            break
        time.sleep(0.2)
    print("%s's own figures: %s" % (which, own()))
    print("\n".join(lines) or "no series for this pid")


# oom-context

def smi_used(pid):
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        p, used = [x.strip() for x in line.split(",")]
        if int(p) == pid:
            return int(used) * MIB
    return None


def oom_context(url):
    import gpumem
    import torch

    gpumem.start()
    x = torch.ones(1 << 20, device="cuda")
    time.sleep(2)
    truth = smi_used(os.getpid()) - torch.cuda.memory_reserved(0)
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
    reports = json.load(urllib.request.urlopen(url + "/api/v1/oom-reports"))["reports"]
    ours = [r for r in reports if r["pid"] == os.getpid()]
    if not ours:
        print("RESULT no OOM report for pid", os.getpid())
        sys.exit(1)
    rep = ours[0]
    me = [p for p in rep["processes"] if p["pid"] == os.getpid()]
    ctx = me[0].get("context_bytes") if me else None
    print(json.dumps({k: rep.get(k) for k in ("gpu", "requested_bytes", "limit_bytes", "free_bytes", "nvml_time", "nvml_delay_seconds", "totals")}, indent=1))
    print("reporter in the report:", json.dumps(me[0] if me else None))
    print("RESULT truth_context_mib=%.1f report_context_mib=%s stale=%s reserved_at_oom_mib=%.0f within_2mib=%s" % (
        truth / MIB, "none" if ctx is None else "%.1f" % (ctx / MIB), me[0].get("context_stale", False) if me else None,
        reserved_at_oom / MIB, ctx is not None and abs(ctx - truth) <= 2 * MIB))


# foresight

def foresight(kind, outdir):
    import gpumem
    import torch
    import torch.nn as nn

    model = None
    record = {"kind": kind, "pid": os.getpid(), "start": time.time(), "warnings": []}

    def dump():
        with open(os.path.join(outdir, kind + ".json"), "w") as f:
            json.dump(record, f)

    def save_checkpoint(risk):
        record["warnings"].append({"t": time.time(), "eta_seconds": risk.eta_seconds, "cause": risk.cause})
        if model is not None and not os.path.exists(os.path.join(outdir, kind + ".ckpt")):
            torch.save(model.state_dict(), os.path.join(outdir, kind + ".ckpt"))
            record["checkpoint"] = time.time()
        dump()

    gpumem.on_oom_risk(save_checkpoint)
    gpumem.start()

    def limit(nbytes):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(nbytes / total, 0)

    def mlp(width=4096, depth=2):
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers).cuda()

    def leak(batch, ceiling):
        # Each step keeps its output, and with it the graph's saved tensors.
        nonlocal model
        limit(ceiling)
        model = mlp()
        outs = []
        while True:
            t = time.time()
            outs.append(model(torch.randn(batch, 4096, device="cuda")))
            torch.cuda.synchronize()
            time.sleep(max(0.0, 1.0 - (time.time() - t)))

    def train(batch, seconds):
        # Training whose memory is the same step after step.
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        end = time.time() + seconds
        while time.time() < end:
            loss = model(torch.randn(batch, 4096, device="cuda")).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            time.sleep(0.2)

    def steady(seconds):
        nonlocal model
        limit(8 * GiB)
        model = mlp()
        train(2048, seconds)

    def evaluation():
        nonlocal model
        limit(6 * GiB)
        model = mlp(depth=4)
        train(1024, 60)
        # The evaluation batch, without torch.no_grad(): every layer's
        # activations are kept for a backward pass that never comes.
        model(torch.randn(128 * 1024, 4096, device="cuda")).sum().item()

    try:
        if kind == "leak95":
            leak(2000, 9 * GiB)
        elif kind == "leak7m":
            leak(620, int(11.9 * GiB))
        elif kind == "steady":
            steady(300)
        elif kind == "eval":
            evaluation()
        elif kind == "too_large":
            torch.empty(200 * GiB, dtype=torch.uint8, device="cuda")
        else:
            sys.exit("unknown kind " + kind)
    except torch.OutOfMemoryError:
        record["oom"] = time.time()
        dump()
        raise
    dump()


def foresight_summary(out):
    reports = json.load(open(os.path.join(out, "oom-reports.json")))["reports"]
    scrapes, t = [], None
    for line in open(os.path.join(out, "scrapes.txt")):
        if line.startswith("# "):
            t = float(line[2:])
            continue
        m = re.search(r'pid="(\d+)".* (\S+)$', line.strip())
        if m and t is not None:
            scrapes.append((t, int(m.group(1)), float(m.group(2))))

    print("| workload | ran | OOM after | warned before the OOM (in-process) | GPUWorkloadOOMRisk before the OOM | checkpoint | verdict | warning on stderr | verdict on stderr |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in ("leak95", "leak7m", "steady", "eval", "too_large"):
        try:
            rec = json.load(open(os.path.join(out, kind + ".json")))
        except (OSError, ValueError):
            print("| %s | no record |" % kind)
            continue
        err = open(os.path.join(out, kind + ".stderr")).read()
        oom = rec.get("oom")
        end = oom or os.path.getmtime(os.path.join(out, kind + ".json"))
        warned = "-"
        if rec["warnings"]:
            w = rec["warnings"][0]
            warned = "%.0f s (eta said %.0f s)" % ((oom - w["t"]), w["eta_seconds"]) if oom else "warned (no OOM): %d" % len(rec["warnings"])
        alert = "-"
        fired = [s for s in scrapes if s[1] == rec["pid"] and s[2] < 600]
        if fired and oom:
            alert = "%.0f s" % (oom - (fired[0][0] + 15))
        elif fired:
            alert = "fired (no OOM)"
        verdict = [r["verdict"]["cause"] for r in reports if r["pid"] == rec["pid"]]
        ckpt = os.path.exists(os.path.join(out, kind + ".ckpt"))
        print("| %s | %.0f s | %s | %s | %s | %s | %s | %s | %s |" % (
            kind, end - rec["start"], "%.0f s" % (oom - rec["start"]) if oom else "no OOM", warned, alert,
            "yes" if ckpt else "no", ",".join(verdict) or "-",
            "yes" if "may run out of GPU memory" in err else "no",
            "yes" if "why CUDA ran out of memory" in err else "no"))
    for r in reports:
        v = r["verdict"]
        print("\npid %d: %s (also: %s): %s First: %s" % (r["pid"], v["cause"], ",".join(v.get("contributing") or []), v["summary"], v["remedy"]))


COMMANDS = {
    "hold": (1, lambda a: hold(int(a[0]))),
    "seed-experiments": (0, lambda a: seed_experiments()),
    "two-gpus": (0, lambda a: two_gpus()),
    "frameworks": (1, lambda a: frameworks(a[0]) if a[0] in ("jax", "cupy") else sys.exit(__doc__)),
    "oom-context": (None, lambda a: oom_context(a[0] if a else "http://127.0.0.1:9481")),
    "foresight": (2, lambda a: foresight(a[0], a[1])),
    "foresight-summary": (1, lambda a: foresight_summary(a[0])),
}


def main():
    a = sys.argv[1:]
    if a and a[0] in ("-h", "--help"):
        print(__doc__)
        return
    if not a or a[0] not in COMMANDS:
        sys.exit(__doc__)
    nargs, run = COMMANDS[a[0]]
    if nargs is not None and len(a) - 1 != nargs or nargs is None and len(a) > 2:
        sys.exit(__doc__)
    run(a[1:])


if __name__ == "__main__":
    main()
