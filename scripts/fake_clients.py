"""N processes that report a constant allocator state for one GPU through
the Python client (a stand-in source, no framework needed), started
SPACING seconds apart, until killed. For measuring the daemon at rest on a
machine without a GPU (the simulated backend; UUID one of its GPUs).
Standard library only.
  python3 scripts/fake_clients.py N SOCKET CLIENT_DIR UUID [SPACING]
CLIENT_DIR holds the gpumem package (clients/python, or another
version's copy)."""
import signal
import subprocess
import sys
import time

if sys.argv[1] == "child":
    sock, pkg, uuid = sys.argv[2], sys.argv[3], sys.argv[4]
    sys.path.insert(0, pkg)
    from gpumem import client, sources

    class Constant(sources.Source):
        name = "pytorch"

        def loaded(self):
            return sys

        def version(self):
            return "0"

        def _entries(self, mod):
            return [{"uuid": uuid, "reserved_bytes": 1 << 30, "active_bytes": 1 << 29}]

    client.Client(socket_path=sock, sources=[Constant()]).start()
    while True:
        time.sleep(60)

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the finally below
n, sock, pkg, uuid = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
spacing = float(sys.argv[5]) if len(sys.argv) > 5 else 0.63
kids = []
try:
    for _ in range(n):
        kids.append(subprocess.Popen([sys.executable, __file__, "child", sock, pkg, uuid]))
        time.sleep(spacing)
    while True:
        time.sleep(60)
finally:
    for k in kids:
        k.kill()
