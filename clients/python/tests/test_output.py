"""The client's writer to stderr: verdicts after the traceback they explain,
one paragraph at a time, at a bounded rate whatever a daemon sends."""

import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from unittest import mock

from tests import PACKAGE_ROOT
from tests.helpers import GpumemTestCase, torch_stats, uuid_for, wait_until

from gpumem import _paragraph


class Clock(object):
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class WriterTest(GpumemTestCase):
    def test_a_paragraph_written_while_a_hook_holds_comes_after_the_hook(self):
        out = io.StringIO()
        w = _paragraph.Writer(stream=out)
        w.hold()
        out.write("Traceback (most recent call last):\n")
        self.assertTrue(w.write("verdict", "gpumem: why\n"))
        out.write("OutOfMemoryError: boom\n")
        w.release()
        self.assertEqual(out.getvalue(), "Traceback (most recent call last):\nOutOfMemoryError: boom\ngpumem: why\n")

    def test_after_an_observed_oom_the_verdict_waits_for_the_traceback_or_the_grace(self):
        clock = Clock()
        out = io.StringIO()
        w = _paragraph.Writer(stream=out, clock=clock, grace=2.0)
        w.oom_observed()
        w.write("verdict", "V\n")
        w.poll()
        self.assertEqual(out.getvalue(), "", "the error is still unwinding: the verdict waits")
        # The hook ran (the error was not caught): the verdict follows its traceback.
        w.hold()
        out.write("T\n")
        w.release()
        self.assertEqual(out.getvalue(), "T\nV\n")
        # Caught by the program: no hook runs; the grace lets it out.
        w.oom_observed()
        w.write("verdict", "V2\n")
        clock.now += 1.0
        w.poll()
        self.assertEqual(out.getvalue(), "T\nV\n")
        clock.now += 1.5
        w.poll()
        self.assertEqual(out.getvalue(), "T\nV\nV2\n")

    def test_flush_at_exit_prints_what_waited(self):
        out = io.StringIO()
        w = _paragraph.Writer(stream=out)
        w.oom_observed()
        w.write("verdict", "V\n")
        w.flush()
        self.assertEqual(out.getvalue(), "V\n")

    def test_a_flood_is_cut_to_the_buckets_and_the_next_paragraph_says_how_many_were_dropped(self):
        clock = Clock()
        out = io.StringIO()
        w = _paragraph.Writer(stream=out, clock=clock, buckets={"warning": (3, 30.0)})
        printed = sum(w.write("warning", "W\n") for _ in range(10000))
        self.assertEqual(printed, 3)
        self.assertEqual(out.getvalue(), "W\nW\nW\n")
        clock.now += 30.0
        self.assertTrue(w.write("warning", "W\n"))
        self.assertIn("9997 more messages from the daemon not printed", out.getvalue())

    def test_one_paragraph_at_a_time(self):
        class Slow(object):
            def __init__(self):
                self.parts = []

            def write(self, s):
                for ch in s:
                    self.parts.append(ch)
                    time.sleep(0.0001)

            def flush(self):
                pass
        out = Slow()
        w = _paragraph.Writer(stream=out, buckets={})
        texts = ["%s\n" % (c * 40) for c in "abcdefgh"]
        threads = [threading.Thread(target=w.write, args=("verdict", t)) for t in texts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = "".join(out.parts).splitlines(True)
        self.assertEqual(sorted(got), sorted(texts), "paragraphs were interleaved")

    def test_a_broken_stream_never_raises(self):
        w = _paragraph.Writer(stream=object())
        self.assertTrue(w.write("verdict", "x\n"))


# A child that dies of an out-of-memory error whose traceback its own hook
# writes slowly (a busy job: half of it, a pause, the rest), beside a daemon
# that answers at once. FRAMEWORK picks the path: PyTorch's observer, then
# torch.OutOfMemoryError; or a JAX error seen by the exception hook; a
# thread dying of it goes through threading.excepthook.
SLOW_CHILD = textwrap.dedent("""
    import sys, threading, time, traceback, types
    sys.path.insert(0, %(root)r)
    FRAMEWORK, IN_THREAD = %(framework)r, %(in_thread)r

    def slow_write(text):
        half = len(text) // 2
        sys.stderr.write(text[:half]); sys.stderr.flush()
        time.sleep(1.5)
        sys.stderr.write(text[half:] + "END OF TRACEBACK\\n"); sys.stderr.flush()

    sys.excepthook = lambda t, v, tb: slow_write("".join(traceback.format_exception(t, v, tb)))
    threading.excepthook = lambda a: slow_write("".join(traceback.format_exception(a.exc_type, a.exc_value, a.exc_traceback)))
    if FRAMEWORK == "torch":
        from tests.helpers import StandInTorch, torch_stats
        t = StandInTorch({0: {"stats": torch_stats(3 << 30), "uuid": %(uuid)r}})
        sys.modules["torch"] = t.module
        OOM = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
        def fail():
            t.observers[0](0, 960495616, 4294967296, 145713397760)  # the allocator, then it raises
            raise OOM("CUDA out of memory. Tried to allocate 916.00 MiB.")
    else:
        jax = types.ModuleType("jax"); jax.__version__ = "0.4.30"
        stats = {"bytes_in_use": 7 << 30, "pool_bytes": 8 << 30, "bytes_limit": 8 << 30}
        jax.local_devices = lambda: [types.SimpleNamespace(id=0, platform="gpu", memory_stats=lambda: stats)]
        bridge = types.ModuleType("jax._src.xla_bridge"); bridge._backends = {"cuda": object()}
        sys.modules["jax"], sys.modules["jax._src.xla_bridge"] = jax, bridge
        Xla = type("XlaRuntimeError", (RuntimeError,), {"__module__": "jaxlib.xla_extension"})
        def fail():
            raise Xla("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 214748364800 bytes.")
    import gpumem, gpumem._cuda, gpumem.client
    gpumem._cuda.device_uuid = lambda o: "GPU-" + %(uuid)r
    gpumem.start()
    deadline = time.time() + 10
    while time.time() < deadline:
        c = gpumem.client._client
        if c is not None and c._daemon_verdicts and (FRAMEWORK != "torch" or t.observers):
            break
        time.sleep(0.01)
    if IN_THREAD:
        th = threading.Thread(target=fail); th.start(); th.join()
        time.sleep(0.5)
    else:
        fail()
""")


class OrderTest(GpumemTestCase):
    def _run(self, framework, in_thread=False):
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 50, "server": "test", "oom_verdict": True},
                        verdict=lambda m: {"v": 1, "type": "verdict", "uuid": m["uuid"], "gpu": "0", "cause": "limit",
                                           "summary": "Past its own limit."})
        env = dict(os.environ, GPUMEM_SOCKET=self.sock, GPUMEM_OOM_MESSAGE="1", GPUMEM_OOM_WAIT="5",
                   PYTHONPATH=PACKAGE_ROOT)
        script = SLOW_CHILD % {"root": PACKAGE_ROOT, "uuid": uuid_for(0), "framework": framework, "in_thread": in_thread}
        p = subprocess.run([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=60)
        err = p.stderr
        self.assertTrue(d.messages("oom"), "no oom message reached the daemon: %s" % err)
        self.assertIn("END OF TRACEBACK", err)
        self.assertIn("gpumem: why CUDA ran out of memory", err)
        self.assertEqual(err.count("gpumem: why CUDA ran out of memory"), 1, err)
        self.assertLess(err.index("END OF TRACEBACK"), err.index("gpumem: why"),
                        "the verdict came before or inside the traceback:\n" + err)

    def test_pytorch_oom_verdict_after_a_slow_traceback(self):
        self._run("torch")

    def test_jax_oom_verdict_after_a_slow_traceback(self):
        self._run("jax")

    def test_a_thread_dying_of_an_oom_gets_its_verdict_after_its_traceback(self):
        self._run("torch", in_thread=True)


class FloodTest(GpumemTestCase):
    def test_a_hostile_daemons_warnings_make_bounded_stderr(self):
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 50, "server": "test"})
        self.install_torch({0: {"stats": torch_stats(1 << 30)}})
        out = io.StringIO()
        patch = mock.patch("sys.stderr", out)
        patch.start()
        self.addCleanup(patch.stop)
        c = self.client()
        wait_until(lambda: d.messages("stats") and d.conns, what="stats")
        warning = {"v": 1, "type": "warning", "gpu": "0", "uuid": "GPU-" + uuid_for(0), "eta_seconds": 60,
                   "cause": "leak", "summary": "s" * 800, "remedy": "r" * 800}
        line = (json.dumps(warning) + "\n").encode()
        deadline = time.monotonic() + 3.0
        sent = 0
        conn = d.conns[-1]
        conn.settimeout(None)
        conn.setblocking(False)
        while time.monotonic() < deadline:
            try:
                conn.send(line)
            except BlockingIOError:
                time.sleep(0.001)  # the client reads as fast as it can
                continue
            sent += 1
        wait_until(lambda: len(c.warnings) >= 3, what="warnings read")
        self.assertGreater(sent, 1000)
        self.assertLess(len(out.getvalue()), 3 * 2200, "stderr grew with the flood: %d bytes" % len(out.getvalue()))
