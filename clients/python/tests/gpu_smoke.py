"""Manual check on a machine with a GPU and PyTorch (not run by unittest):

    python3 clients/python/tests/gpu_smoke.py

Runs the real client against a fake daemon and prints what arrived, next to
what torch and nvidia-smi say. Exits non-zero when a check fails.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.helpers import FakeDaemon, wait_until  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def smi(args):
    try:
        return subprocess.run(["nvidia-smi"] + args, stdout=subprocess.PIPE, universal_newlines=True).stdout
    except OSError as e:
        return str(e)


def my_gpu_mib():
    out = smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    return [int(line.split(",")[1]) for line in out.splitlines() if line.split(",")[0].strip() == str(os.getpid())]


def main():
    tmp = tempfile.mkdtemp()
    sock = os.path.join(tmp, "a.sock")
    os.environ["GPUMEM_SOCKET"] = sock
    os.environ["GPUMEM_INTERVAL"] = "0.1"
    d = FakeDaemon(sock, welcome={"v": 1, "type": "welcome", "interval_ms": 1000, "server": "smoke"})

    import torch
    import gpumem
    print("torch", torch.__version__, "devices", torch.cuda.device_count())
    print("has _cuda_hasPrimaryContext:", hasattr(torch._C, "_cuda_hasPrimaryContext"),
          "get_per_process_memory_fraction:", hasattr(torch.cuda, "get_per_process_memory_fraction"),
          "OOM observer:", hasattr(torch._C, "_cuda_attach_out_of_memory_observer"))
    check(gpumem.start(), "start() returns True")
    time.sleep(0.5)
    check(not d.conns, "no connection before CUDA is used")
    check(my_gpu_mib() == [], "no CUDA context created by the client (nvidia-smi lists no process)")
    print("collect() before CUDA:", gpumem.collect())

    x = torch.randn(200, 300, 200, 20, device="cuda:0")
    wait_until(lambda: d.messages("stats"), what="stats")
    st = d.messages("stats")[-1]
    print("hello:", json.dumps(d.messages("hello")))
    print("stats:", json.dumps(st))
    ms = torch.cuda.memory_stats(0)
    dev = st["devices"][0]
    check(dev["reserved_bytes"] == ms["reserved_bytes.all.current"], "reserved_bytes matches memory_stats")
    smi_uuids = smi(["--query-gpu=uuid", "--format=csv,noheader"]).split()
    check(dev["uuid"] in smi_uuids, "uuid %s is one of nvidia-smi's %s" % (dev["uuid"], smi_uuids))
    from gpumem import _cuda
    check(_cuda.device_uuid(0) == dev["uuid"], "libcuda cuDeviceGetUuid gives the same uuid (%s)" % _cuda.device_uuid(0))
    check(len(my_gpu_mib()) == 1, "one context (nvidia-smi: %s MiB)" % my_gpu_mib())

    t0 = time.perf_counter()
    for _ in range(200):
        gpumem.collect()
    print("collect() costs %.0f us" % ((time.perf_counter() - t0) / 200 * 1e6))

    del x
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(4 * 2 ** 30 / total, 0)
    try:
        y = torch.empty(5 * 2 ** 30, dtype=torch.uint8, device="cuda:0")
        del y
        check(False, "the allocation should have failed")
    except torch.cuda.OutOfMemoryError as e:
        print("OOM:", str(e).splitlines()[0][:200])
    wait_until(lambda: d.messages("oom"), what="oom message")
    print("oom:", json.dumps(d.messages("oom")))
    o = d.messages("oom")[0]
    check(o["limit_bytes"] == int(4 * 2 ** 30 / total * total) or abs(o["limit_bytes"] - 4 * 2 ** 30) < 2 ** 20,
          "oom limit_bytes is the 4 GiB limit")
    wait_until(lambda: any(dv.get("ooms") for m in d.messages("stats") for dv in m["devices"]), what="ooms counter")
    last = d.messages("stats")[-1]["devices"][0]
    print("stats after OOM:", json.dumps(last))
    check(abs(last.get("limit_bytes", 0) - 4 * 2 ** 30) < 2 ** 20, "stats limit_bytes from the fraction")
    check(gpumem.stop(2.0), "stop()")

    # Zero-code mode with the real torch package.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.path.join(here, "autostart"), GPUMEM_INTERVAL="0.1")
    code = ("import time, torch, sys; x = torch.ones(1, device='cuda:0'); "
            "c = sys.modules['gpumem.client']._client; t = time.time() + 10\n"
            "while time.time() < t and not c.connects: time.sleep(0.02)\n"
            "time.sleep(0.3); print('connects', c.connects)")
    n_before = len(d.conns)
    p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    print("autostart child:", p.returncode, p.stdout.strip(), p.stderr.strip()[-500:])
    check(p.returncode == 0 and len(d.conns) > n_before, "sitecustomize starts the client with the real torch")
    d.close()
    print("FAILURES:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
