#!/usr/bin/env python3
"""Make JAX and CuPy processes die of real CUDA out-of-memory errors, each
instrumented with the gpumem client, and check that the exporter gave each
a report with the expected verdict and that the verdict's paragraph reached
the process's stderr after the framework's traceback.

    python3 scripts/gpu/oom_frameworks.py --exporter ./gpumem_exporter [--out DIR] [--only KINDS]

Needs a GPU with 20 GiB free and jax[cuda] and/or cupy; a kind whose
framework is not installed is skipped. It starts the exporter itself on a
socket and port of its own (as oom_causes.py does), runs the kinds one
after another (under a minute), writes each process's stderr and the
exporter's reports under --out, and exits 1 if a kind that ran got no
report, the wrong cause, or no paragraph on its stderr.

The kinds:
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

# The cause each kind must get, the framework it needs, and the name its
# error has in the traceback.
EXPECTED = {
    "jax_too_large": ("too_large", "jax", "RESOURCE_EXHAUSTED"),
    "jax_limit": ("limit", "jax", "RESOURCE_EXHAUSTED"),
    "cupy_too_large": ("too_large", "cupy", "OutOfMemoryError"),
    "cupy_limit": ("limit", "cupy", "OutOfMemoryError"),
}
# Extra environment of a kind's process.
KIND_ENV = {
    "jax_limit": {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.1"},
}


# -- the kinds, each run in its own process; each dies of its error --

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


KINDS = {
    "jax_too_large": kind_jax_too_large,
    "jax_limit": kind_jax_limit,
    "cupy_too_large": kind_cupy_too_large,
    "cupy_limit": kind_cupy_limit,
}


# -- the driver --

def reports(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/oom-reports" % port, timeout=5) as r:
        return json.load(r)["reports"]


def installed(module):
    return subprocess.run([sys.executable, "-c", "import " + module], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def run_kind(kind, env, out, timeout=180):
    env = dict(env, **KIND_ENV.get(kind, {}))
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
    ap.add_argument("--port", type=int, default=19482)
    ap.add_argument("--kind", choices=sorted(KINDS), help=argparse.SUPPRESS)
    ap.add_argument("--only", default=",".join(EXPECTED), help="comma-separated kinds to run")
    a = ap.parse_args()
    if a.kind:
        KINDS[a.kind]()
        return 0
    if not a.exporter:
        ap.error("--exporter is required")
    out = a.out or tempfile.mkdtemp(prefix="oom-frameworks-")
    os.makedirs(out, exist_ok=True)
    sockdir = tempfile.mkdtemp(prefix="gpumem-")
    sock = os.path.join(sockdir, "allocstats.sock")
    env = dict(os.environ, GPUMEM_SOCKET=sock, PYTHONPATH=os.path.abspath(CLIENT), PYTHONUNBUFFERED="1")
    env.pop("GPUMEM_OOM_MESSAGE", None)
    log = open(os.path.join(out, "exporter.log"), "wb")
    exporter = subprocess.Popen([a.exporter, "--allocstats.socket=" + sock, "--web.listen-address=127.0.0.1:%d" % a.port],
                                stdout=log, stderr=log)
    failed = 0
    rows = []
    try:
        for _ in range(100):
            try:
                reports(a.port)
                break
            except OSError:
                time.sleep(0.1)
        for kind in a.only.split(","):
            want, framework, error = EXPECTED[kind]
            if not installed(framework):
                rows.append((kind, want, "-", [], False, 0, "skipped: %s is not installed" % framework, True))
                continue
            t0 = time.time()
            rc, pid = run_kind(kind, env, out)
            time.sleep(1)
            rep = next((r for r in reports(a.port) if r["pid"] == pid), None)
            with open(os.path.join(out, kind + ".stderr"), "rb") as f:
                stderr = f.read().decode("utf-8", "replace")
            marker = "gpumem: why CUDA ran out of memory"
            printed = marker in stderr and error in stderr and stderr.index(error) < stderr.index(marker)
            cause = rep["verdict"]["cause"] if rep else None
            ok = cause == want and printed and rc != 0
            failed += not ok
            rows.append((kind, want, cause, rep["verdict"].get("contributing", []) if rep else [], printed,
                         round(time.time() - t0, 1), rep["verdict"]["summary"] if rep else "exit status %d" % rc, ok))
            time.sleep(11)  # the per-uid report budget: 6 a minute
        with open(os.path.join(out, "reports.json"), "w") as f:
            json.dump(reports(a.port), f, indent=1)
    finally:
        exporter.terminate()
        exporter.wait()
    print("%-16s %-10s %-10s %-20s %-7s %s" % ("kind", "expected", "cause", "contributing", "stderr", "seconds"))
    for kind, want, cause, contrib, printed, secs, summary, ok in rows:
        print("%-16s %-10s %-10s %-20s %-7s %s%s" % (kind, want, cause, ",".join(contrib) or "-", "yes" if printed else "NO",
                                                     secs, "" if ok else "   <- WRONG"))
        print("    " + summary)
    print("stderr of each process and reports.json: " + out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
