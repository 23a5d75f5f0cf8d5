#!/usr/bin/env python3
"""Make real CUDA out-of-memory errors on one GPU, each in its own process
instrumented with the gpumem client, and print the exporter's verdict on
each: the cause it gave, whether that is the expected one, and whether the
verdict's paragraph reached the process's stderr after the framework's
traceback.

    python3 scripts/gpu/oom_causes.py --exporter ./gpumem_exporter [--out DIR] [--only KINDS]
    python3 scripts/gpu/oom_causes.py --frameworks --exporter ./gpumem_exporter [--out DIR] [--only KINDS]

It starts the exporter itself on a socket and port of its own, runs the
kinds one after another, writes each process's stderr and the exporter's
reports under --out, and exits 1 if a kind that ran got no report, the
wrong cause, or no paragraph on its stderr.

Without --frameworks, six PyTorch kinds (about five minutes). Needs PyTorch
with CUDA and a GPU with at least 130 GiB free (an H200; the sizes below
are for it):
  limit          set_per_process_memory_fraction(0.05): 3 GiB of weights and
                 a batch that grows 256 MiB a step until it passes the limit
  fragmentation  limit 5 GiB; one 4 GiB segment cached, four 1 GiB tensors
                 split from it, two freed; then a 2 GiB request
  leak           each step's 128 MiB output kept in a list, under a 5.6 GiB
                 limit (a step every 3 s: the climb lasts over two minutes)
  too_large      one 200 GiB request, the process's first allocation
  neighbours     another process allocated 115 GiB and freed it without
                 empty_cache(); this one asks for 40 GiB as its first allocation
  growth         25 s of training, then an evaluation without torch.no_grad()
                 on a 16 times larger batch

With --frameworks, four JAX and CuPy kinds (under a minute). Needs a GPU
with 20 GiB free and jax[cuda] and/or cupy; a kind whose framework is not
installed is skipped:
  jax_too_large    one 200 GiB array, the process's first allocation
                   (JAX preallocates 75% of the GPU: the request is past it)
  jax_limit        XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 (14 GiB on an H200):
                   1 GiB arrays kept until the pool cannot hold the next
  cupy_too_large   one 200 GiB array, the process's first allocation
  cupy_limit       the default pool limited to 4 GiB (set_limit): 1 GiB
                   arrays kept until the pool refuses the next
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENT = os.path.join(HERE, "..", "..", "clients", "python")
GiB = 1 << 30
MiB = 1 << 20

# -- the PyTorch kinds, each run in a process of its own (--kind) --

def _start(fraction=None):
    import torch
    import gpumem
    gpumem.start()  # before CUDA initialises: the observer is queued for it
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return torch


def kind_limit():
    torch = _start(0.05)
    weights = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")
    step = 1
    while True:
        batch = torch.empty(step * 256 * MiB, dtype=torch.uint8, device="cuda")
        del batch
        step += 1
        time.sleep(0.1)


def kind_fragmentation():
    torch = _start(5 * GiB / torch_total())
    x = torch.empty(4 * GiB, dtype=torch.uint8, device="cuda")
    del x  # one 4 GiB segment, cached
    parts = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(4)]
    del parts[2], parts[0]  # two 1 GiB holes that are not adjacent
    time.sleep(2.5)  # let the client push the state
    torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")


def kind_leak():
    torch = _start(5.6 * GiB / torch_total())
    kept = []
    while True:
        out = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
        kept.append(out)  # the seed's list append: each step's output kept
        time.sleep(3)


def kind_too_large():
    torch = _start()
    torch.empty(200 * GiB, dtype=torch.uint8, device="cuda")


def kind_holder():
    torch = _start()
    x = torch.empty(115 * GiB, dtype=torch.uint8, device="cuda")
    del x  # freed without empty_cache(): 115 GiB of inactive cache
    print("ready", flush=True)
    time.sleep(600)


def kind_neighbours():
    torch = _start()
    torch.empty(40 * GiB, dtype=torch.uint8, device="cuda")


def kind_growth():
    torch = _start()
    layers = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(8)]).cuda()
    opt = torch.optim.SGD(layers.parameters(), lr=1e-4)
    end = time.time() + 25
    while time.time() < end:  # training: the same peak step after step
        x = torch.randn(16384, 8192, device="cuda")
        loss = layers(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, loss
        time.sleep(0.3)
    outputs = []
    for _ in range(4):  # evaluation without torch.no_grad(): every graph kept
        x = torch.randn(16 * 16384, 8192, device="cuda")
        outputs.append(layers(x).mean())


def torch_total():
    import torch
    return torch.cuda.get_device_properties(0).total_memory



# -- the JAX and CuPy kinds (--frameworks) --

def kind_jax_too_large():
    import gpumem
    gpumem.start()
    import jax.numpy as jnp
    x = jnp.zeros((200 * GiB,), dtype=jnp.uint8)
    x.block_until_ready()


def kind_jax_limit():
    import gpumem
    gpumem.start()
    import jax.numpy as jnp
    kept = []
    while True:
        x = jnp.ones((GiB // 4,), dtype=jnp.float32)  # 1 GiB
        x.block_until_ready()
        kept.append(x)
        time.sleep(0.3)  # a push or two between steps


def kind_cupy_too_large():
    import gpumem
    gpumem.start()
    import cupy
    cupy.zeros((200 * GiB,), dtype=cupy.uint8)


def kind_cupy_limit():
    import gpumem
    gpumem.start()
    import cupy
    cupy.get_default_memory_pool().set_limit(size=4 * GiB)
    kept = []
    while True:
        kept.append(cupy.ones((GiB // 4,), dtype=cupy.float32))  # 1 GiB
        time.sleep(0.3)


# Each kind: its workload, the cause it must get, the framework it needs,
# the name its error has in the traceback, and extra environment.
TORCH_KINDS = {
    "limit": (kind_limit, "limit", "torch", "OutOfMemoryError", {}),
    "fragmentation": (kind_fragmentation, "fragmentation", "torch", "OutOfMemoryError", {}),
    "leak": (kind_leak, "leak", "torch", "OutOfMemoryError", {}),
    "too_large": (kind_too_large, "too_large", "torch", "OutOfMemoryError", {}),
    "neighbours": (kind_neighbours, "neighbours", "torch", "OutOfMemoryError", {}),
    "growth": (kind_growth, "growth", "torch", "OutOfMemoryError", {}),
}
FRAMEWORK_KINDS = {
    "jax_too_large": (kind_jax_too_large, "too_large", "jax", "RESOURCE_EXHAUSTED", {}),
    "jax_limit": (kind_jax_limit, "limit", "jax", "RESOURCE_EXHAUSTED", {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.1"}),
    "cupy_too_large": (kind_cupy_too_large, "too_large", "cupy", "OutOfMemoryError", {}),
    "cupy_limit": (kind_cupy_limit, "limit", "cupy", "OutOfMemoryError", {}),
}
# The processes --kind runs: every kind, and the neighbours' holder.
KINDS = {k: v[0] for k, v in list(TORCH_KINDS.items()) + list(FRAMEWORK_KINDS.items())}
KINDS["holder"] = kind_holder
MARKER = "gpumem: why CUDA ran out of memory"


# -- the driver --

def reports(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/oom-reports" % port, timeout=5) as r:
        return json.load(r)["reports"]


def installed(module):
    return subprocess.run([sys.executable, "-c", "import " + module], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def run_kind(kind, env, out, timeout):
    with open(os.path.join(out, kind + ".stderr"), "wb") as err:
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--kind", kind], env=env,
                             stdout=subprocess.DEVNULL, stderr=err)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
    return rc, p.pid


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exporter", help="the gpumem_exporter binary")
    ap.add_argument("--frameworks", action="store_true", help="the JAX and CuPy kinds instead of PyTorch's")
    ap.add_argument("--out", default=None, help="where to write stderr files and reports (default: a temp dir)")
    ap.add_argument("--port", type=int, default=None, help="the exporter's port (default 19481, 19482 with --frameworks)")
    ap.add_argument("--kind", choices=sorted(KINDS), help=argparse.SUPPRESS)
    ap.add_argument("--only", default=None, help="comma-separated kinds to run (default: all of the set)")
    a = ap.parse_args()
    if a.kind:
        if os.environ.get("OOM_CAUSES_DEBUG"):
            import logging
            logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(threadName)s %(message)s")
        KINDS[a.kind]()
        return 0
    if not a.exporter:
        ap.error("--exporter is required")
    kinds = FRAMEWORK_KINDS if a.frameworks else TORCH_KINDS
    port = a.port or (19482 if a.frameworks else 19481)
    timeout = 180 if a.frameworks else 300
    only = (a.only or ",".join(kinds)).split(",")
    for kind in only:
        if kind not in kinds:
            ap.error("unknown kind %s; the kinds%s: %s" % (kind, " with --frameworks" if a.frameworks else "", ",".join(kinds)))
    out = a.out or tempfile.mkdtemp(prefix="oom-frameworks-" if a.frameworks else "oom-causes-")
    os.makedirs(out, exist_ok=True)
    sockdir = tempfile.mkdtemp(prefix="gpumem-")
    sock = os.path.join(sockdir, "allocstats.sock")
    env = dict(os.environ, GPUMEM_SOCKET=sock, PYTHONPATH=os.path.abspath(CLIENT), PYTHONUNBUFFERED="1")
    env.pop("GPUMEM_OOM_MESSAGE", None)
    log = open(os.path.join(out, "exporter.log"), "wb")
    exporter = subprocess.Popen([a.exporter, "--allocstats.socket=" + sock, "--web.listen-address=127.0.0.1:%d" % port],
                                stdout=log, stderr=log)
    failed = 0
    rows = []
    try:
        for _ in range(100):
            try:
                reports(port)
                break
            except OSError:
                time.sleep(0.1)
        for kind in only:
            _, want, framework, error, extra_env = kinds[kind]
            if a.frameworks and not installed(framework):
                rows.append((kind, want, "-", [], False, 0, "skipped: %s is not installed" % framework, True))
                continue
            holder = None
            if kind == "neighbours":
                holder = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--kind", "holder"], env=env,
                                          stdout=subprocess.PIPE, stderr=open(os.path.join(out, "holder.stderr"), "wb"))
                holder.stdout.readline()
                time.sleep(3)  # the holder pushes its cache to the exporter
            t0 = time.time()
            rc, pid = run_kind(kind, dict(env, **extra_env), out, timeout)
            if holder is not None:
                holder.kill()
                holder.wait()
            time.sleep(1)
            rep = next((r for r in reports(port) if r["pid"] == pid), None)
            with open(os.path.join(out, kind + ".stderr"), "rb") as f:
                stderr = f.read().decode("utf-8", "replace")
            printed = MARKER in stderr and error in stderr and stderr.index(error) < stderr.index(MARKER)
            cause = rep["verdict"]["cause"] if rep else None
            ok = cause == want and printed and rc != 0
            failed += not ok
            rows.append((kind, want, cause, rep["verdict"].get("contributing", []) if rep else [], printed,
                         round(time.time() - t0, 1), rep["verdict"]["summary"] if rep else "exit status %d" % rc, ok))
            time.sleep(11)  # the per-uid report budget: 6 a minute
        with open(os.path.join(out, "reports.json"), "w") as f:
            json.dump(reports(port), f, indent=1)
    finally:
        exporter.terminate()
        exporter.wait()
    print("%-16s %-14s %-14s %-22s %-8s %s" % ("kind", "expected", "cause", "contributing", "stderr", "seconds"))
    for kind, want, cause, contrib, printed, secs, summary, ok in rows:
        print("%-16s %-14s %-14s %-22s %-8s %s%s" % (kind, want, cause, ",".join(contrib) or "-", "yes" if printed else "NO",
                                                     secs, "" if ok else "   <- WRONG"))
        print("    " + summary)
    print("stderr of each process and reports.json: " + out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
