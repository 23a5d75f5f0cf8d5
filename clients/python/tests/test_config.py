import logging
import os
import threading

from tests.helpers import SHIPPED_DEFAULT_SOCKET, GpumemTestCase, torch_stats
import gpumem
from gpumem import config


class DisableTest(GpumemTestCase):
    def test_gpumem_disable_makes_start_a_no_op(self):
        self.install_torch({0: {"stats": torch_stats(1)}})
        for value in ("1", "true", "YES"):
            os.environ["GPUMEM_DISABLE"] = value
            self.assertFalse(gpumem.start(), value)
            self.assertIsNone(gpumem.client._client)
            self.assertNotIn("gpumem", [t.name for t in threading.enumerate()])
        os.environ["GPUMEM_DISABLE"] = "0"
        self.assertTrue(gpumem.start())


class IntervalTest(GpumemTestCase):
    def test_valid_values(self):
        for raw, want in (("2", 2.0), ("0.25", 0.25), ("0.001", config.MIN_INTERVAL)):
            os.environ["GPUMEM_INTERVAL"] = raw
            self.assertEqual(config.interval(), (want, True), raw)
        del os.environ["GPUMEM_INTERVAL"]
        self.assertEqual(config.interval(), (1.0, False))
        self.assertEqual(config.interval(3), (3.0, True))

    def test_invalid_values_fall_back_with_one_warning(self):
        with self.assertLogs("gpumem", logging.WARNING) as logs:
            for raw in ("abc", "-1", "0", "nan", "inf"):
                os.environ["GPUMEM_INTERVAL"] = raw
                self.assertEqual(config.interval()[0], config.DEFAULT_INTERVAL, raw)
            self.assertTrue(gpumem.start())
        self.assertEqual(len(logs.records), 1, [r.getMessage() for r in logs.records])
        self.assertIn("GPUMEM_INTERVAL", logs.records[0].getMessage())

    def test_socket_paths_follow_the_daemons_fallbacks_unless_one_is_given(self):
        env = {"XDG_RUNTIME_DIR": "/run/user/1000", "TMPDIR": "/scratch"}
        self.assertEqual(config.socket_paths(environ=env), [
            config.DEFAULT_SOCKET,
            "/run/user/1000/gpumem/allocstats.sock",
            "/scratch/gpumem-%d/allocstats.sock" % os.getuid(),
        ])
        self.assertEqual(config.socket_paths(environ={}), [
            config.DEFAULT_SOCKET, "/tmp/gpumem-%d/allocstats.sock" % os.getuid()])
        self.assertEqual(config.socket_paths(environ=dict(env, GPUMEM_SOCKET="/s.sock")), ["/s.sock"])
        self.assertEqual(config.socket_paths("/x.sock", environ=env), ["/x.sock"])
        self.assertEqual(config.socket_paths(), [self.sock])

    def test_the_shipped_default_is_the_daemons(self):
        self.assertEqual(SHIPPED_DEFAULT_SOCKET, "/run/gpumem/allocstats.sock")
        self.assertNotEqual(config.DEFAULT_SOCKET, SHIPPED_DEFAULT_SOCKET, "tests must not use the host's socket")
