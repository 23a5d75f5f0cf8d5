"""JAX's and CuPy's out-of-memory errors, from the exception hooks: with
stand-in jax and cupy modules in sys.modules and exceptions whose classes
carry the frameworks' own module and class names."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import types
from unittest import mock

from tests import PACKAGE_ROOT
from tests.helpers import GpumemTestCase, uuid_for, wait_until

import gpumem
from gpumem import _framework_oom as fo
from gpumem import _oom


def exception_class(module, name, base=RuntimeError):
    """A class that looks like module.name, as the framework defines it."""
    return type(name, (base,), {"__module__": module})


XlaRuntimeError = exception_class("jaxlib.xla_extension", "XlaRuntimeError")
JaxRuntimeError = exception_class("jaxlib._jax", "JaxRuntimeError")
CupyOOM = exception_class("cupy.cuda.memory", "OutOfMemoryError", MemoryError)
UsersOOM = exception_class("mytrainer.errors", "OutOfMemoryError", MemoryError)

JAX_TOO_LARGE = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 214748364800 bytes."
CUPY_PAST_LIMIT = ("Out of memory allocating 4,294,967,296 bytes (allocated so far: 1,073,741,824 bytes, "
                   "limit set to: 2,147,483,648 bytes).")


class ParseTest(GpumemTestCase):
    def test_jax_messages(self):
        for message, want in [
            (JAX_TOO_LARGE, (214748364800, None)),
            ("RESOURCE_EXHAUSTED: Failed to allocate request for 80.00GiB (85899345920B) on device ordinal 3: "
             "while running replica 0 and partition 0 of a replicated computation", (85899345920, 3)),
            ("RESOURCE_EXHAUSTED: Out of memory allocating 1048576 bytes.", (1048576, None)),
            ("RESOURCE_EXHAUSTED: Failed to allocate 2.50GiB on device ordinal 1", (int(2.5 * (1 << 30)), 1)),
            ("RESOURCE_EXHAUSTED: Failed to allocate request for 512.0MB", (512 * 1000 ** 2, None)),
            ("RESOURCE_EXHAUSTED: something XLA has not said before", (None, None)),
        ]:
            with self.subTest(message=message):
                self.assertEqual(fo.parse_jax(message), want)

    def test_cupy_messages(self):
        for message, want in [
            (CUPY_PAST_LIMIT, (4294967296, 2147483648)),
            ("Out of memory allocating 214,748,364,800 bytes (allocated so far: 0 bytes).", (214748364800, None)),
            ("Out of memory", (None, None)),
        ]:
            with self.subTest(message=message):
                self.assertEqual(fo.parse_cupy(message), want)

    def test_only_the_frameworks_ooms_are_recognised(self):
        wrapped = RuntimeError("filtered traceback")
        wrapped.__cause__ = XlaRuntimeError(JAX_TOO_LARGE)
        for exc, want in [
            (XlaRuntimeError(JAX_TOO_LARGE), fo.JAX),
            (JaxRuntimeError(JAX_TOO_LARGE), fo.JAX),
            (wrapped, fo.JAX),
            (CupyOOM(CUPY_PAST_LIMIT), fo.CUPY),
            (XlaRuntimeError("INVALID_ARGUMENT: shapes do not match"), None),
            (UsersOOM("Out of memory allocating 1 bytes"), None),
            (MemoryError(), None),
            (exception_class("mylib", "XlaRuntimeError")(JAX_TOO_LARGE), None),
        ]:
            with self.subTest(exc=repr(exc)):
                self.assertEqual(fo.recognise(exc)[0], want)

    def test_a_cycle_of_causes_ends(self):
        a, b = ValueError("a"), ValueError("b")
        a.__context__, b.__context__ = b, a
        self.assertEqual(fo.recognise(a), (None, None))


class StandInJax(object):
    """jax with GPU devices that report memory_stats, its backends up."""

    def __init__(self, stats_by_ordinal):
        self.stats = stats_by_ordinal
        jax = types.ModuleType("jax")
        jax.__version__ = "0.4.30"
        jax.local_devices = lambda: [types.SimpleNamespace(id=i, platform="gpu", memory_stats=(lambda i=i: self.stats[i]))
                                     for i in sorted(self.stats)]
        bridge = types.ModuleType("jax._src.xla_bridge")
        bridge._backends = {"cuda": object()}
        sys.modules["jax"] = jax
        sys.modules["jax._src.xla_bridge"] = bridge


def install_cupy(total, used, limit):
    cupy = types.ModuleType("cupy")
    cupy.__version__ = "13.3.0"
    pool = types.SimpleNamespace(total_bytes=lambda: total, used_bytes=lambda: used, get_limit=lambda: limit)
    cupy.get_default_memory_pool = lambda: pool
    runtime = types.SimpleNamespace(getDevice=lambda: 0, getDeviceProperties=lambda i: {"uuid": bytes(range(16))})
    cupy.cuda = types.SimpleNamespace(runtime=runtime)
    sys.modules["cupy"] = cupy


def fake_uuid(ordinal):
    return "GPU-" + uuid_for(ordinal)


class EventTest(GpumemTestCase):
    def test_jax_event_has_the_failing_devices_figures(self):
        StandInJax({0: {"bytes_in_use": 1 << 30, "pool_bytes": 2 << 30, "bytes_limit": 4 << 30},
                    1: {"bytes_in_use": 3 << 30, "pool_bytes": 3 << 30, "bytes_limit": 4 << 30}})
        with mock.patch("gpumem._cuda.device_uuid", side_effect=fake_uuid):
            by_ordinal = fo.event(XlaRuntimeError("RESOURCE_EXHAUSTED: Failed to allocate request for 2.00GiB "
                                                  "(2147483648B) on device ordinal 0"))
            fullest = fo.event(XlaRuntimeError(JAX_TOO_LARGE))
        self.assertEqual((by_ordinal["uuid"], by_ordinal["requested"], by_ordinal["limit"]), (fake_uuid(0), 2 << 30, 4 << 30))
        self.assertEqual(by_ordinal["entry"]["active_bytes"], 1 << 30)
        self.assertEqual(by_ordinal["framework"], "jax")
        self.assertEqual(fullest["uuid"], fake_uuid(1), "no ordinal in the message: the fullest device")

    def test_cupy_event_has_the_pool_and_its_limit(self):
        install_cupy(total=1 << 30, used=1 << 30, limit=2 << 30)
        ev = fo.event(CupyOOM(CUPY_PAST_LIMIT))
        self.assertEqual((ev["uuid"], ev["requested"], ev["limit"]), ("GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", 4 << 30, 2 << 30))
        self.assertEqual(ev["entry"], {"uuid": ev["uuid"], "reserved_bytes": 1 << 30, "active_bytes": 1 << 30,
                                       "limit_bytes": 2 << 30})

    def test_cupy_oom_on_the_first_allocation_has_an_empty_pool(self):
        install_cupy(total=0, used=0, limit=0)
        ev = fo.event(CupyOOM("Out of memory allocating 214,748,364,800 bytes (allocated so far: 0 bytes)."))
        self.assertEqual((ev["requested"], ev["limit"]), (214748364800, None))
        self.assertEqual(ev["entry"], {"uuid": ev["uuid"], "reserved_bytes": 0, "active_bytes": 0})

    def test_an_oom_whose_framework_is_not_loaded_gives_no_event(self):
        self.assertIsNone(fo.event(CupyOOM(CUPY_PAST_LIMIT)))
        self.assertFalse(fo.note(CupyOOM(CUPY_PAST_LIMIT)))
        self.assertEqual(len(_oom.events), 0)


class HookChainTest(GpumemTestCase):
    def setUp(self):
        GpumemTestCase.setUp(self)
        self._sys_hook = sys.excepthook
        self._thread_hook = threading.excepthook
        self.addCleanup(self._restore)

    def _restore(self):
        fo.uninstall()
        fo._prev_sys = fo._prev_thread = None
        sys.excepthook = self._sys_hook
        threading.excepthook = self._thread_hook

    def test_chains_with_the_users_hook_and_restores_it(self):
        install_cupy(total=1 << 30, used=1 << 30, limit=2 << 30)
        seen = []

        def users_hook(t, v, tb):
            seen.append(("user", v, len(_oom.events)))
        sys.excepthook = users_hook
        fo.install()
        fo.install()  # idempotent: one wrapper, not two
        self.assertIsNot(sys.excepthook, users_hook)
        exc = CupyOOM(CUPY_PAST_LIMIT)
        sys.excepthook(type(exc), exc, None)
        self.assertEqual(seen, [("user", exc, 1)], "the user's hook runs once, after the event is queued")
        fo.uninstall()
        self.assertIs(sys.excepthook, users_hook, "uninstall puts the user's hook back")

    def test_a_hook_installed_on_top_of_ours_keeps_working_after_uninstall(self):
        install_cupy(total=1 << 30, used=1 << 30, limit=0)
        calls = []
        default = mock.Mock()
        sys.excepthook = default  # what was there before ours
        fo.install()
        ours = sys.excepthook

        def later_hook(t, v, tb):
            calls.append("later")
            ours(t, v, tb)
        sys.excepthook = later_hook
        fo.uninstall()
        self.assertIs(sys.excepthook, later_hook, "a hook installed after ours is not removed")
        exc = CupyOOM(CUPY_PAST_LIMIT)
        sys.excepthook(type(exc), exc, None)
        self.assertEqual(calls, ["later"])
        self.assertEqual(default.call_count, 1, "ours still hands the exception on")
        self.assertEqual(len(_oom.events), 0, "uninstalled: nothing is noted")
        fo.install()
        self.assertIs(sys.excepthook, later_hook, "installing again does not wrap twice")
        sys.excepthook(type(exc), exc, None)
        self.assertEqual(len(_oom.events), 1)

    def test_a_thread_that_dies_of_a_jax_oom_is_reported(self):
        StandInJax({0: {"bytes_in_use": 5 << 30, "pool_bytes": 6 << 30, "bytes_limit": 6 << 30}})
        seen = []
        threading.excepthook = lambda args: seen.append(args.exc_type.__name__)
        fo.install()

        def work():
            raise XlaRuntimeError(JAX_TOO_LARGE)
        with mock.patch("gpumem._cuda.device_uuid", side_effect=fake_uuid):
            t = threading.Thread(target=work)
            t.start()
            t.join()
        self.assertEqual(seen, ["XlaRuntimeError"], "the user's thread hook still runs")
        self.assertEqual([(e["uuid"], e["requested"]) for e in _oom.events], [(fake_uuid(0), 214748364800)])

    def test_other_exceptions_pass_untouched(self):
        seen = []
        sys.excepthook = lambda t, v, tb: seen.append(v)
        fo.install()
        exc = KeyError("x")
        sys.excepthook(KeyError, exc, None)
        self.assertEqual(seen, [exc])
        self.assertEqual(len(_oom.events), 0)

    def test_start_installs_and_stop_restores(self):
        users = sys.excepthook = lambda t, v, tb: None
        self.daemon()
        self.assertTrue(gpumem.start(socket_path=self.sock, interval=30.0))
        self.assertTrue(fo.installed())
        self.assertIsNot(sys.excepthook, users)
        gpumem.stop()
        self.assertFalse(fo.installed())
        self.assertIs(sys.excepthook, users)


class SendTest(GpumemTestCase):
    def test_the_sender_sends_the_figures_then_the_oom_and_gets_a_verdict(self):
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 50, "server": "test", "oom_verdict": True},
                        verdict=lambda m: {"v": 1, "type": "verdict", "uuid": m["uuid"], "gpu": "0",
                                           "cause": "limit", "summary": "past its pool limit"})
        install_cupy(total=1 << 30, used=1 << 30, limit=2 << 30)
        c = self.client(interval=30.0)
        _oom.wake = c.wake
        wait_until(lambda: d.messages("stats") and c._daemon_verdicts, what="stats and the welcome")
        self.assertTrue(fo.note(CupyOOM(CUPY_PAST_LIMIT)))
        wait_until(lambda: d.messages("oom"), timeout=5.0, what="the oom message (the interval is 30 s)")
        self.assertTrue(c.wait_for_verdicts(3.0), "the verdict, as a dying process waits for it")
        msgs = d.messages()
        i = [m["type"] for m in msgs].index("oom")
        self.assertEqual(msgs[i], {"v": 1, "type": "oom", "uuid": "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f",
                                   "requested_bytes": 4 << 30, "limit_bytes": 2 << 30})
        self.assertEqual(msgs[i - 1]["devices"][0]["limit_bytes"], 2 << 30, "the figures at the failure come first")
        self.assertEqual(c.verdicts[0]["cause"], "limit")


CHILD = textwrap.dedent("""
    import sys, types
    sys.path.insert(0, %(root)r)
    jax = types.ModuleType("jax"); jax.__version__ = "0.4.30"
    stats = {"bytes_in_use": 7 << 30, "pool_bytes": 8 << 30, "bytes_limit": 8 << 30}
    jax.local_devices = lambda: [types.SimpleNamespace(id=0, platform="gpu", memory_stats=lambda: stats)]
    bridge = types.ModuleType("jax._src.xla_bridge"); bridge._backends = {"cuda": object()}
    sys.modules["jax"], sys.modules["jax._src.xla_bridge"] = jax, bridge
    import gpumem, gpumem._cuda
    gpumem._cuda.device_uuid = lambda o: "GPU-%(uuid)s"
    sys.excepthook = lambda t, v, tb: sys.__excepthook__(t, v, tb) or sys.stderr.write("users hook ran\\n")
    gpumem.start()
    XlaRuntimeError = type("XlaRuntimeError", (RuntimeError,), {"__module__": "jaxlib.xla_extension"})
    raise XlaRuntimeError(%(msg)r)
""")


class ProcessTest(GpumemTestCase):
    def test_a_process_killed_by_a_jax_oom_prints_the_verdict_after_the_traceback(self):
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 50, "server": "test", "oom_verdict": True},
                        verdict=lambda m: {"v": 1, "type": "verdict", "uuid": m["uuid"], "gpu": "0", "cause": "too_large",
                                           "summary": "The request of 200.00 GiB is more than the GPU."})
        env = dict(os.environ, GPUMEM_SOCKET=self.sock, GPUMEM_OOM_MESSAGE="1", GPUMEM_OOM_WAIT="5")
        script = CHILD % {"root": PACKAGE_ROOT, "uuid": uuid_for(0), "msg": JAX_TOO_LARGE}
        p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 1, p.stderr)
        err = p.stderr
        self.assertIn("XlaRuntimeError: RESOURCE_EXHAUSTED", err)
        self.assertIn("users hook ran", err, "the user's hook is chained")
        self.assertIn("gpumem: why CUDA ran out of memory on GPU 0 (GPU-%s): too_large" % uuid_for(0), err)
        self.assertLess(err.index("XlaRuntimeError: RESOURCE_EXHAUSTED"), err.index("gpumem: why"),
                        "the verdict comes after the traceback")
        ooms = d.messages("oom")
        self.assertEqual([(m["uuid"], m["requested_bytes"], m["limit_bytes"]) for m in ooms],
                         [("GPU-" + uuid_for(0), 214748364800, 8 << 30)])
        hello = d.messages("hello")[0]
        self.assertEqual(hello["framework"], "jax")
        self.assertTrue(json.dumps(ooms))
