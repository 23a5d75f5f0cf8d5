#!/usr/bin/env python3
"""Make six real kinds of CUDA out-of-memory error on one GPU, each in its own
process instrumented with the gpumem client, and print the exporter's verdict
on each: the cause it gave, whether that is the expected one, and whether the
verdict's paragraph reached the process's stderr.

    python3 scripts/gpu/oom_causes.py --exporter ./gpumem_exporter [--out DIR]

Needs PyTorch with CUDA and a GPU with at least 130 GiB free (an H200; the
sizes below are for it). It starts the exporter itself on a socket and port
of its own, runs the kinds one after another (about five minutes), writes
each process's stderr and the exporter's reports under --out, and exits 1
if a kind got no report, the wrong cause, or no paragraph on its stderr.

The kinds:
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

EXPECTED = {
    "limit": "limit",
    "fragmentation": "fragmentation",
    "leak": "leak",
    "too_large": "too_large",
    "neighbours": "neighbours",
    "growth": "growth",
}


# -- the workloads, each run in a process of its own (--kind) --

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


KINDS = {
    "limit": kind_limit, "fragmentation": kind_fragmentation, "leak": kind_leak,
    "too_large": kind_too_large, "holder": kind_holder, "neighbours": kind_neighbours,
    "growth": kind_growth,
}


# -- the driver --

def reports(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/oom-reports" % port, timeout=5) as r:
        return json.load(r)["reports"]


def run_kind(kind, env, out, timeout=300):
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
    ap.add_argument("--out", default=None, help="where to write stderr files and reports (default: a temp dir)")
    ap.add_argument("--port", type=int, default=19481)
    ap.add_argument("--kind", choices=sorted(KINDS), help=argparse.SUPPRESS)
    ap.add_argument("--only", default=",".join(EXPECTED), help="comma-separated kinds to run")
    a = ap.parse_args()
    if a.kind:
        if os.environ.get("OOM_CAUSES_DEBUG"):
            import logging
            logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(threadName)s %(message)s")
        KINDS[a.kind]()
        return 0
    if not a.exporter:
        ap.error("--exporter is required")
    out = a.out or tempfile.mkdtemp(prefix="oom-causes-")
    os.makedirs(out, exist_ok=True)
    sockdir = tempfile.mkdtemp(prefix="gpumem-")
    sock = os.path.join(sockdir, "allocstats.sock")
    env = dict(os.environ, GPUMEM_SOCKET=sock, PYTHONPATH=os.path.abspath(CLIENT), PYTHONUNBUFFERED="1")
    env.pop("GPUMEM_OOM_MESSAGE", None)
    log = open(os.path.join(out, "exporter.log"), "wb")
    exporter = subprocess.Popen([a.exporter, "--allocstats.socket=" + sock, "--web.listen-address=127.0.0.1:%d" % a.port],
                                stdout=log, stderr=log)
    failed = 0
    try:
        for _ in range(100):
            try:
                reports(a.port)
                break
            except OSError:
                time.sleep(0.1)
        holder = None
        rows = []
        for kind in a.only.split(","):
            if kind == "neighbours":
                holder = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--kind", "holder"], env=env,
                                          stdout=subprocess.PIPE, stderr=open(os.path.join(out, "holder.stderr"), "wb"))
                holder.stdout.readline()
                time.sleep(3)  # the holder pushes its cache to the exporter
            t0 = time.time()
            rc, pid = run_kind(kind, env, out)
            if holder is not None:
                holder.kill()
                holder.wait()
                holder = None
            time.sleep(1)
            rep = next((r for r in reports(a.port) if r["pid"] == pid), None)
            with open(os.path.join(out, kind + ".stderr"), "rb") as f:
                stderr = f.read().decode("utf-8", "replace")
            printed = "gpumem: why CUDA ran out of memory" in stderr and "OutOfMemoryError" in stderr and \
                stderr.index("OutOfMemoryError") < stderr.index("gpumem: why CUDA ran out of memory")
            cause = rep["verdict"]["cause"] if rep else None
            ok = cause == EXPECTED[kind] and printed
            failed += not ok
            rows.append((kind, EXPECTED[kind], cause, rep["verdict"].get("contributing", []) if rep else [],
                         printed, round(time.time() - t0, 1), rep["verdict"]["summary"] if rep else "", ok))
            time.sleep(11)  # the per-uid report budget: 6 a minute
        with open(os.path.join(out, "reports.json"), "w") as f:
            json.dump(reports(a.port), f, indent=1)
        print("%-14s %-14s %-14s %-22s %-8s %s" % ("kind", "expected", "cause", "contributing", "stderr", "seconds"))
        for kind, want, cause, contrib, printed, secs, summary, ok in rows:
            print("%-14s %-14s %-14s %-22s %-8s %s%s" % (kind, want, cause, ",".join(contrib) or "-", "yes" if printed else "NO",
                                                         secs, "" if ok else "   <- WRONG"))
            print("    " + summary)
    finally:
        exporter.terminate()
        exporter.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
