"""JAX and CuPy processes instrumented with gpumem.start(): their allocator
figures against what the exporter serves for their pid. Usage:
frameworks.py jax|cupy (run by validate.sh, exporter at GPUMEM_EXPORTER)."""
import os
import sys
import time
import urllib.request

import gpumem

EXPORTER = os.environ.get("GPUMEM_EXPORTER", "http://127.0.0.1:9481")


def mine():
    text = urllib.request.urlopen(EXPORTER + "/metrics", timeout=5).read().decode()
    pid = 'pid="%d"' % os.getpid()
    return [l for l in text.splitlines() if pid in l and (l.startswith("gpumem_allocator_reserved") or l.startswith("gpumem_allocator_active")
                                                         or l.startswith("gpumem_process_info") or l.startswith("gpumem_process_context"))]


def main(which):
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
        lines = mine()
        if any(l.startswith("gpumem_allocator_active_bytes") and float(l.split()[-1]) == in_use for l in lines):
            break
        time.sleep(0.2)
    print("%s's own figures: %s" % (which, own()))
    print("\n".join(lines) or "no series for this pid")


if __name__ == "__main__":
    main(sys.argv[1])
