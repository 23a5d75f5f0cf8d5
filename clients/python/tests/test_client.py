import logging
import os
import threading
import time
import warnings

from tests.helpers import (SHIPPED_DEFAULT_SOCKET, FakeDaemon, GpumemTestCase, HostIsolation, torch_stats,
                           uuid_for, wait_until)
import gpumem
import gpumem.client
import gpumem._verdict
from gpumem import _oom, config, protocol

DEVICE_KEYS = {"uuid", "reserved_bytes", "active_bytes", "allocated_bytes", "inactive_split_bytes",
               "peak_reserved_bytes", "peak_active_bytes", "alloc_retries", "ooms"}


class WireTest(GpumemTestCase):
    def test_hello_then_stats_exactly_per_protocol(self):
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 250, "server": "test"})
        self.install_torch({0: {"stats": torch_stats(5 << 20, active=1 << 20)}, 1: {"stats": torch_stats(7)}})
        c = self.client(interval=None)
        wait_until(lambda: d.messages("stats"), what="a stats message")
        hello = d.messages()[0]
        self.assertEqual(hello, {"v": 1, "type": "hello", "framework": "pytorch", "framework_version": "2.11.0",
                                 "client": "gpumem-python/0.1.0"})
        stats = d.messages("stats")[0]
        self.assertEqual(list(stats)[:2], ["v", "type"])
        self.assertEqual(set(stats), {"v", "type", "devices"})
        self.assertEqual([dev["uuid"] for dev in stats["devices"]], ["GPU-" + uuid_for(0), "GPU-" + uuid_for(1)])
        for dev in stats["devices"]:
            self.assertEqual(set(dev), DEVICE_KEYS)
            for k, v in dev.items():
                if k != "uuid":
                    self.assertIs(type(v), int, k)
                    self.assertGreaterEqual(v, 0, k)
        self.assertEqual(stats["devices"][0]["reserved_bytes"], 5 << 20)
        for line in d.raw_lines():
            self.assertNotIn(b"pid", line)
            self.assertNotIn(b"null", line)
        wait_until(lambda: c.server == "test", what="the welcome to be read")
        self.assertEqual(c.interval, 0.25, "the welcome's interval_ms applies when the user set none")

    def test_welcome_does_not_override_the_users_interval(self):
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 1000, "server": "test"})
        self.install_torch({0: {"stats": torch_stats(1)}})
        c = self.client(interval=0.05)
        wait_until(lambda: c.server == "test" and d.messages("stats"), what="welcome and stats")
        self.assertEqual(c.interval, 0.05)

    def test_a_strange_welcome_is_bounded(self):
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 10 ** 12,
                                 "server": "\x1b[2J" + "x" * 10000, "oom_verdict": "yes"})
        self.install_torch({0: {"stats": torch_stats(1)}})
        c = self.client(interval=None)
        wait_until(lambda: c.server is not None and d.messages("stats"), what="the welcome")
        self.assertEqual(c.interval, config.MAX_INTERVAL)
        self.assertLessEqual(len(c.server), 64)
        self.assertNotIn("\x1b", c.server)
        self.assertFalse(c._daemon_verdicts, "only a JSON true announces verdicts")

    def test_no_framework_or_no_device_means_no_connection(self):
        d = self.daemon()
        c = self.client()
        self.install_torch({0: {"stats": torch_stats(1)}}, initialized=False)
        time.sleep(0.2)
        self.assertEqual(d.conns, [], "nothing to report: the client stays off the daemon")
        self.assertTrue(c.running())

    def test_push_only_changes_and_heartbeat(self):
        # Drive the cycle by hand with a fake clock: deterministic.
        d = self.daemon()
        t = self.install_torch({0: {"stats": torch_stats(10)}, 1: {"stats": torch_stats(20)}})
        c = self.client(start=False, heartbeat=10.0)
        c._cycle(100.0)  # connect: hello + full state
        c._cycle(101.0)  # nothing changed: nothing sent
        t.devices[1]["stats"] = torch_stats(21)
        c._cycle(102.0)  # only device 1
        c._cycle(105.0)  # nothing
        c._cycle(110.5)  # heartbeat: everything
        wait_until(lambda: len(d.messages()) >= 4, what="four messages")
        time.sleep(0.05)
        got = [[dev["uuid"][-1] + ":" + str(dev["reserved_bytes"]) for dev in m.get("devices", [])]
               for m in d.messages()]
        self.assertEqual(got, [[], ["0:10", "1:20"], ["1:21"], ["0:10", "1:21"]])
        self.assertEqual(d.messages()[0]["type"], "hello")

    def test_clients_connected_at_different_times_send_their_heartbeats_together(self):
        # Two clients of one node, connected 3.5 s apart: their full-state
        # pushes fall in the same cycle, the first after each 10 s of the
        # monotonic clock, so the daemon wakes once for both.
        d = self.daemon()
        self.install_torch({0: {"stats": torch_stats(10)}})
        a = self.client(start=False, heartbeat=10.0)
        b = self.client(start=False, heartbeat=10.0)
        a._cycle(100.5)
        b._cycle(104.0)
        wait_until(lambda: len(d.messages("stats")) == 2, what="both clients' first state")
        fulls = {"a": [], "b": []}
        for now in (105.0, 106.0, 107.0, 108.0, 109.0, 110.0, 111.0, 119.0, 120.0, 121.0):
            for name, c in (("a", a), ("b", b)):
                before = c._last_full
                c._cycle(now)
                if c._last_full != before:
                    fulls[name].append(now)
        self.assertEqual(fulls, {"a": [110.0, 120.0], "b": [110.0, 120.0]})

    def test_cycles_wake_half_way_between_the_daemons_polls(self):
        c = self.client(start=False, interval=1.0)
        c._sock = object()  # connected: the wait is the push interval's
        try:
            # Half-way between the daemon's polls (whole seconds).
            for wall, want in ((1000.5, 1.0), (1000.75, 0.75), (1001.0, 0.5), (1001.25, 1.25), (1001.4999, 1.0001)):
                self.assertAlmostEqual(c._wait_time(wall=wall), want, places=6, msg="at %r" % wall)
        finally:
            c._sock = None
        self.assertAlmostEqual(gpumem.client.grid_wait(12.3, 0.5), 0.45, places=6)

    def test_large_state_is_split_into_messages_within_64_KiB(self):
        d = self.daemon()
        n = 2000
        self.install_torch(dict((i, {"stats": torch_stats(2 ** 45 + i)}) for i in range(n)))
        self.client()
        wait_until(lambda: sum(len(m["devices"]) for m in d.messages("stats")) >= n, what="all devices")
        for line in d.raw_lines():
            self.assertLessEqual(len(line) + 1, protocol.MAX_LINE)
        self.assertGreater(len(d.messages("stats")), 1)
        self.assertEqual(len(set(dev["uuid"] for m in d.messages("stats") for dev in m["devices"])), n)


class ConnectionTest(GpumemTestCase):
    def test_daemon_absent_then_present(self):
        gpumem.client.BACKOFF_INITIAL, saved = 0.02, gpumem.client.BACKOFF_INITIAL
        self.addCleanup(setattr, gpumem.client, "BACKOFF_INITIAL", saved)
        os.environ["GPUMEM_INTERVAL"] = "0.05"
        self.install_torch({0: {"stats": torch_stats(1)}})
        with self.assertLogs("gpumem", logging.INFO) as logs:
            t0 = time.monotonic()
            self.assertTrue(gpumem.start())
            self.assertLess(time.monotonic() - t0, 0.1, "start() must return at once")
            self.assertTrue(gpumem.start(), "start() is idempotent")
            c = gpumem.client._client
            wait_until(lambda: c._backoff >= 0.16, what="several failed attempts")
        msgs = [r.getMessage() for r in logs.records]
        self.assertEqual(msgs, ["gpumem: no daemon at %s; will retry" % self.sock], "logged exactly once")
        self.assertEqual([t.name for t in threading.enumerate()].count("gpumem"), 1)
        d = self.daemon()
        wait_until(lambda: d.messages("stats"), what="stats once the daemon is there")
        self.assertTrue(gpumem.stop(1.0))
        self.assertFalse(c.running())

    def test_daemon_restart_gets_hello_and_full_state_again(self):
        d1 = self.daemon()
        self.install_torch({0: {"stats": torch_stats(1)}, 1: {"stats": torch_stats(2)}})
        c = self.client(heartbeat=1000.0)
        wait_until(lambda: d1.messages("stats"), what="first stats")
        d1.close()
        d2 = self.daemon()
        wait_until(lambda: d2.messages("stats"), what="stats after the restart")
        self.assertEqual(d2.messages()[0]["type"], "hello")
        self.assertEqual(len(d2.messages("stats")[0]["devices"]), 2, "full state, not just changes")
        self.assertGreaterEqual(c.connects, 2)

    def test_daemon_that_does_not_read_never_blocks_the_caller(self):
        d = self.daemon(read=False)
        t = self.install_torch(dict((i, {"stats": torch_stats(i)}) for i in range(1000)))
        counter = [0]
        real = t.module.cuda.memory_stats

        def changing(i):  # every device changes every cycle: lots to send
            counter[0] += 1
            s = real(i)
            s["reserved_bytes.all.current"] = counter[0]
            return s
        t.module.cuda.memory_stats = changing
        c = self.client(send_timeout=0.05)
        wait_until(lambda: _oom.registered_to is t.module._C, what="the OOM observer")
        t0 = time.monotonic()
        for _ in range(20000):
            _oom.observer(0, 1 << 20, 1 << 30, 1 << 30)
        self.assertLess(time.monotonic() - t0, 2.0, "the observer must only enqueue")
        self.assertLessEqual(len(_oom.events), _oom.MAX_EVENTS)
        wait_until(lambda: c.dropped_lines > 0 and c.connects >= 2, what="a dropped send and a reconnect")
        self.assertTrue(c.running())
        self.assertLessEqual(len(_oom.events), _oom.MAX_EVENTS)
        self.assertLessEqual(len(c._rbuf), protocol.MAX_LINE)
        # A daemon that reads again gets everything.
        d.close()
        d2 = self.daemon()
        wait_until(lambda: len(d2.messages("stats")) > 0, what="stats to a reading daemon")
        self.assertTrue(c.stop(2.0))

    def test_stop_is_prompt_and_idempotent(self):
        self.install_torch({0: {"stats": torch_stats(1)}})
        c = self.client(interval=30.0)
        t0 = time.monotonic()
        self.assertTrue(c.stop(1.0))
        self.assertTrue(c.stop(1.0))
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertTrue(gpumem.stop())


class OOMTest(GpumemTestCase):
    def test_observer_sends_the_state_at_the_failure_then_the_oom(self):
        d = self.daemon()
        t = self.install_torch({0: {"stats": torch_stats(3664 << 20)}, 1: {"stats": torch_stats(1)}})
        self.client(interval=30.0)
        wait_until(lambda: d.messages("stats") and t.observers, what="stats and the observer")
        self.assertEqual(len(t.observers), 1)
        calls_before = len(t.calls)
        t.observers[0](0, 960495616, 4294967296, 145713397760)
        self.assertEqual(t.calls[calls_before:], [("memory_stats", 0)],
                         "the observer may read only the failing device's memory_stats")
        # The exception then frees the tensors: later pushes see the cache.
        t.devices[0]["stats"] = torch_stats(3664 << 20, active=0)
        wait_until(lambda: d.messages("oom"), timeout=5.0, what="the oom message (the interval is 30 s)")
        self.assertEqual(d.messages("oom"), [{"v": 1, "type": "oom", "uuid": "GPU-" + uuid_for(0),
                                              "requested_bytes": 960495616, "limit_bytes": 4294967296,
                                              "free_bytes": 145713397760}])
        wait_until(lambda: len(d.messages("stats")) >= 3, what="stats pushed after the OOM")
        msgs = d.messages()
        i = [m["type"] for m in msgs].index("oom")
        at_failure = msgs[i - 1]
        self.assertEqual(at_failure["type"], "stats", "the state at the failure must precede the oom")
        self.assertEqual([(x["uuid"], x["active_bytes"]) for x in at_failure["devices"]], [("GPU-" + uuid_for(0), 3664 << 20)])
        after = [m for m in msgs[i + 1:] if m["type"] == "stats"]
        self.assertEqual([(x["uuid"], x["active_bytes"]) for x in after[0]["devices"]], [("GPU-" + uuid_for(0), 0)])

    def test_observer_survives_a_failing_memory_stats(self):
        d = self.daemon()
        t = self.install_torch({0: {"stats": torch_stats(1 << 20)}})
        self.client(interval=30.0)
        wait_until(lambda: d.messages("stats") and t.observers, what="stats and the observer")
        t.fail_stats = True
        t.observers[0](0, 1 << 20, 1 << 30, 1 << 30)
        t.fail_stats = False
        wait_until(lambda: d.messages("oom"), timeout=5.0, what="the oom message")


    def test_an_oom_on_the_first_allocation_is_reported(self):
        # The observer is queued with torch.cuda._lazy_call at start(), so it
        # is attached as CUDA initialises, before the first allocation fails.
        d = self.daemon()
        t = self.install_torch({0: {"stats": torch_stats(0)}}, initialized=False)
        self.assertTrue(gpumem.start(socket_path=self.sock, interval=30.0))
        self.assertEqual(t.observers, [], "no CUDA yet: nothing attached")
        self.assertEqual(len(t.queued), 1, "one attach queued for CUDA's initialisation")
        t.init_cuda()
        self.assertEqual(len(t.observers), 1, "attached as CUDA initialised")
        t.observers[0](0, 200 << 30, 150109880320, 149 << 30)
        wait_until(lambda: d.messages("oom"), timeout=5.0, what="the oom of the first allocation")
        self.assertEqual(d.messages("oom")[0]["requested_bytes"], 200 << 30)

    def test_verdict_is_printed_and_strange_answers_are_not(self):
        answers = [
            {"v": 1, "type": "verdict", "uuid": "GPU-" + uuid_for(0), "gpu": "0", "cause": "limit",
             "contributing": ["growth", "bogus"], "summary": "The request of 3.56 GiB would take the process\x1b[31m past its own limit.",
             "remedy": "Raise the limit " + "x" * 5000},
            {"v": 1, "type": "verdict", "cause": "made-up", "summary": 42},
        ]
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 50, "server": "test", "oom_verdict": True},
                        verdict=lambda m: answers.pop(0) if answers else None)
        t = self.install_torch({0: {"stats": torch_stats(1 << 30)}})
        c = self.client()
        wait_until(lambda: d.messages("stats") and t.observers and c._daemon_verdicts, what="stats, observer, welcome")
        t.observers[0](0, 3822 << 20, 7 << 30, 139 << 30)
        wait_until(lambda: c.verdicts, what="the verdict")
        v = c.verdicts[0]
        self.assertEqual((v["cause"], v["contributing"], v["gpu"]), ("limit", ["growth"], "0"))
        text = gpumem._verdict.paragraph(v)
        self.assertIn("why CUDA ran out of memory on GPU 0 (GPU-%s): limit (also: growth)" % uuid_for(0), text)
        self.assertNotIn("\x1b", text, "control characters from the daemon are not printed")
        self.assertLess(len(text), 2200, "the daemon's text is bounded")
        self.assertFalse(c.pending_verdicts())
        # A second OOM gets an answer of unknown shape: printed as unknown.
        t.observers[0](0, 1 << 20, 7 << 30, 139 << 30)
        wait_until(lambda: len(c.verdicts) == 2, what="the second verdict")
        self.assertEqual(c.verdicts[1]["cause"], "unknown")
        self.assertEqual(c.verdicts[1]["summary"], "")

    def test_a_verdict_nobody_asked_for_is_ignored(self):
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 50, "server": "test", "oom_verdict": True})
        self.install_torch({0: {"stats": torch_stats(1)}})
        c = self.client()
        wait_until(lambda: d.messages("stats") and c._daemon_verdicts, what="stats and welcome")
        c._handle({"v": 1, "type": "verdict", "cause": "limit", "summary": "spoofed"})
        self.assertEqual(c.verdicts, [])

    def test_a_dying_process_waits_for_its_verdict_within_a_bound(self):
        slow = threading.Event()

        def answer(m):
            slow.wait(0.3)  # the daemon waits for a fresh NVML reading
            return {"v": 1, "type": "verdict", "cause": "too_large", "summary": "The request alone is more than the GPU."}
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 50, "server": "test", "oom_verdict": True},
                        verdict=answer)
        t = self.install_torch({0: {"stats": torch_stats(1)}})
        c = self.client(interval=30.0)
        wait_until(lambda: d.messages("stats") and t.observers, what="stats and the observer")
        t.observers[0](0, 200 << 30, 150109880320, 149 << 30)
        self.assertTrue(c.pending_verdicts())
        t0 = time.monotonic()
        self.assertTrue(c.wait_for_verdicts(3.0), "the verdict came within the wait")
        self.assertLess(time.monotonic() - t0, 2.5)
        self.assertEqual(c.verdicts[0]["cause"], "too_large")
        # An old daemon (no oom_verdict in its welcome) is not waited for.
        c._daemon_verdicts = False
        c._awaiting = 1
        t0 = time.monotonic()
        self.assertTrue(c.wait_for_verdicts(3.0))
        self.assertLess(time.monotonic() - t0, 0.5)


class VerdictTextTest(GpumemTestCase):
    def test_show_writes_the_paragraph_and_survives_a_broken_stream(self):
        import io
        v = gpumem._verdict.parse({"type": "verdict", "cause": "neighbours", "gpu": "3",
                                   "summary": "The GPU had 23.50 GiB free.", "remedy": "empty_cache() in pid 200."})
        out = io.StringIO()
        gpumem._verdict.show(v, out)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[0], "gpumem: why CUDA ran out of memory on GPU 3: neighbours")
        self.assertEqual(lines[1], "gpumem:   The GPU had 23.50 GiB free.")
        self.assertEqual(lines[2], "gpumem:   First: empty_cache() in pid 200.")
        gpumem._verdict.show(v, object())  # no write(): never raises
        self.assertIsNone(gpumem._verdict.parse({"type": "welcome"}))

    def test_the_message_can_be_turned_off(self):
        self.assertFalse(config.oom_message({"GPUMEM_OOM_MESSAGE": "0"}))
        self.assertTrue(config.oom_message({}))
        self.assertEqual(config.oom_wait({"GPUMEM_OOM_WAIT": "bogus"}), config.DEFAULT_OOM_WAIT)
        self.assertEqual(config.oom_wait({"GPUMEM_OOM_WAIT": "1.5"}), 1.5)


class ForkTest(GpumemTestCase):
    def test_forked_child_drops_the_client(self):
        if not hasattr(os, "fork"):
            self.skipTest("no fork")
        d = self.daemon()
        self.install_torch({0: {"stats": torch_stats(1)}})
        os.environ["GPUMEM_INTERVAL"] = "0.05"
        self.assertTrue(gpumem.start())
        wait_until(lambda: d.messages("stats"), what="stats")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: the child only exits
            pid = os.fork()
        if pid == 0:  # child: report through the exit status only
            ok = gpumem.client._client is None and _oom.wake is None and len(_oom.events) == 0
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.WEXITSTATUS(status), 0, "the child must not keep the parent's client")
        self.assertTrue(gpumem.client._client.running(), "the parent's client runs on")


class FallbackSocketTest(GpumemTestCase):
    def test_finds_a_daemon_that_fell_back_to_xdg_runtime_dir(self):
        # A daemon started without root listens under $XDG_RUNTIME_DIR; a
        # client of the same user finds it without GPUMEM_SOCKET.
        path = os.path.join(self.host.xdg_runtime_dir, "gpumem", "allocstats.sock")
        os.mkdir(os.path.dirname(path))
        d = FakeDaemon(path)
        self.daemons.append(d)
        del os.environ["GPUMEM_SOCKET"]
        self.install_torch({0: {"stats": torch_stats(5 << 20)}})
        c = self.client(socket_path=None)
        wait_until(lambda: d.messages("stats"), what="stats at the fallback socket")
        self.assertEqual(c.socket_path, path)


class HostIsolationTest(GpumemTestCase):
    def test_default_candidates_lie_in_the_tests_own_directory(self):
        del os.environ["GPUMEM_SOCKET"]
        for path in gpumem.client.Client(sources=[]).socket_paths:
            self.assertTrue(path.startswith(self.tmp + os.sep),
                            "candidate %s is outside the test's directory %s" % (path, self.tmp))
        self.assertNotIn(SHIPPED_DEFAULT_SOCKET, config.socket_paths())

    def test_a_daemon_at_the_hosts_default_is_never_reached(self):
        # Play a host: a daemon at its default socket and at its
        # $XDG_RUNTIME_DIR and $TMPDIR fallbacks, set up as the client
        # would find them without isolation. A second isolation (what every
        # test gets in setUp) must hide all three.
        self.host.restore()
        outer = HostIsolation(os.path.join(self.tmp, "host"))
        self.addCleanup(outer.restore)
        host_paths = config.default_socket_paths()
        host_daemons = []
        for path in host_paths:
            if not os.path.isdir(os.path.dirname(path)):
                os.mkdir(os.path.dirname(path), 0o700)
            host_daemons.append(FakeDaemon(path))
        self.daemons.extend(host_daemons)
        inner = HostIsolation(os.path.join(self.tmp, "test"))
        self.addCleanup(inner.restore)

        del os.environ["GPUMEM_SOCKET"]
        mine = os.path.join(inner.xdg_runtime_dir, "gpumem", "allocstats.sock")
        os.mkdir(os.path.dirname(mine))
        d = FakeDaemon(mine)
        self.daemons.append(d)
        self.install_torch({0: {"stats": torch_stats(5 << 20)}})
        c = self.client(socket_path=None, backoff_initial=0.01, backoff_max=0.01)
        self.assertEqual(set(c.socket_paths) & set(host_paths), set())
        wait_until(lambda: d.messages("stats"), what="stats at the test's own fallback socket")
        for path, h in zip(host_paths, host_daemons):
            self.assertEqual(h.conns, [], "the host's daemon at %s was reached" % path)


class WarningTest(GpumemTestCase):
    def test_a_warning_is_printed_and_calls_the_registered_functions_in_their_own_thread(self):
        import io
        import json
        import gpumem._warning as _warning
        d = self.daemon(welcome={"v": 1, "type": "welcome", "interval_ms": 50, "server": "test", "warn_before_seconds": 600})
        self.install_torch({0: {"stats": torch_stats(1 << 30)}})
        got = []
        done = threading.Event()

        def save(risk):
            got.append((risk, threading.current_thread().name))
            done.set()
        gpumem.on_oom_risk(save)
        self.addCleanup(gpumem.remove_oom_risk, save)
        c = self.client()
        c.show_warnings = False
        wait_until(lambda: d.messages("stats") and d.conns, what="stats")
        lines = [
            {"v": 1, "type": "warning", "gpu": "0", "uuid": "GPU-" + uuid_for(0), "eta_seconds": 95.4,
             "climb_bytes_per_minute": 4 << 30, "active_bytes": 3 << 30, "ceiling_bytes": 9 << 30, "ceiling": "limit",
             "cause": "leak", "summary": "Active memory's floor climbed\x1b[2J.", "remedy": "Find what keeps tensors."},
            {"v": 1, "type": "warning", "cause": "bogus", "eta_seconds": 3},
            {"v": 1, "type": "warning", "cause": "leak", "eta_seconds": -1},
        ]
        d.conns[-1].sendall(b"".join((json.dumps(m) + "\n").encode() for m in lines))
        self.assertTrue(done.wait(5.0), "the registered function was not called")
        risk, thread = got[0]
        self.assertEqual((risk.cause, risk.gpu, risk.eta_seconds, risk.ceiling), ("leak", "0", 95.4, "limit"))
        self.assertEqual(thread, "gpumem-oom-risk")
        wait_until(lambda: len(c.warnings) == 1, what="the warning to be kept")
        time.sleep(0.2)
        self.assertEqual(len(c.warnings), 1, "a warning of unknown cause or a negative estimate is ignored")
        out = io.StringIO()
        _warning.show(c.warnings[0], out)
        text = out.getvalue()
        self.assertIn("may run out of GPU memory on GPU 0 in about 95 s (a leak)", text)
        self.assertIn("First: Find what keeps tensors.", text)
        self.assertNotIn("\x1b", text)

    def test_the_hello_asks_for_the_users_threshold(self):
        os.environ["GPUMEM_WARN_BEFORE"] = "120"
        self.addCleanup(os.environ.pop, "GPUMEM_WARN_BEFORE", None)
        d = self.daemon()
        self.install_torch({0: {"stats": torch_stats(1)}})
        self.client()
        wait_until(lambda: d.messages("hello"), what="the hello")
        self.assertEqual(d.messages("hello")[0]["warn_before_seconds"], 120)

    def test_warnings_on_stderr_can_be_turned_off(self):
        self.assertFalse(config.warnings({"GPUMEM_WARNINGS": "0"}))
        self.assertTrue(config.warnings({}))
        self.assertIsNone(config.warn_before({"GPUMEM_WARN_BEFORE": "soon"}))
        self.assertEqual(config.warn_before({"GPUMEM_WARN_BEFORE": "0"}), 0)
