import json
import unittest

from tests import helpers  # noqa: F401
from gpumem import protocol


class NonNegativeIntTest(unittest.TestCase):
    def test_accepts_only_non_negative_integers(self):
        cases = [(0, 0), (5, 5), (2 ** 40, 2 ** 40), (3.0, 3), (-1, None), (None, None),
                 (True, None), (1.5, None), (float("nan"), None), (float("inf"), None), ("x", None)]
        for value, want in cases:
            self.assertEqual(protocol.non_negative_int(value), want, "value %r" % (value,))


class UUIDTest(unittest.TestCase):
    def test_text_forms_become_prefixed_dashed_hex(self):
        body = "6f2b8e0c-1d2e-4f3a-9b8c-0123456789ab"
        self.assertEqual(protocol.uuid_from_text(body), "GPU-" + body)
        self.assertEqual(protocol.uuid_from_text("GPU-" + body), "GPU-" + body)
        self.assertEqual(protocol.uuid_from_text("MIG-" + body), "MIG-" + body)
        self.assertEqual(protocol.uuid_from_text(body.replace("-", "").upper()), "GPU-" + body)

    def test_text_that_is_no_uuid_is_refused(self):
        for text in ("", "<torch._C._CUuuid object at 0x7f>", "GPU-", "1234"):
            self.assertIsNone(protocol.uuid_from_text(text), text)

    def test_raw_bytes(self):
        raw = bytes(range(16))
        self.assertEqual(protocol.uuid_from_bytes(raw), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f")
        self.assertIsNone(protocol.uuid_from_bytes(b"short"))


class MessageTest(unittest.TestCase):
    def test_hello(self):
        self.assertEqual(protocol.hello([("pytorch", "2.11.0"), ("jax", "0.4.30")]), {
            "v": 1, "type": "hello", "framework": "pytorch,jax",
            "framework_version": "2.11.0", "client": "gpumem-python/0.1.0"})
        self.assertEqual(protocol.hello([]), {"v": 1, "type": "hello", "client": "gpumem-python/0.1.0"})

    def test_device_entry_keeps_only_valid_fields(self):
        e = protocol.device_entry("GPU-x", {"reserved_bytes": 10, "active_bytes": -1,
                                            "allocated_bytes": None, "ooms": True, "limit_bytes": 7.0})
        self.assertEqual(e, {"uuid": "GPU-x", "reserved_bytes": 10, "limit_bytes": 7})
        self.assertIsNone(protocol.device_entry("GPU-x", {"active_bytes": 1}), "reserved_bytes is required")
        self.assertIsNone(protocol.device_entry("", {"reserved_bytes": 1}), "uuid is required")

    def test_oom(self):
        self.assertEqual(protocol.oom("GPU-a", 960495616, 4294967296, 145713397760), {
            "v": 1, "type": "oom", "uuid": "GPU-a", "requested_bytes": 960495616,
            "limit_bytes": 4294967296, "free_bytes": 145713397760})

    def test_encode_is_one_compact_line(self):
        line = protocol.encode({"v": 1, "type": "stats", "devices": []})
        self.assertEqual(line, b'{"v":1,"type":"stats","devices":[]}\n')

    def test_merge_adds_current_values_and_drops_peaks(self):
        a = {"uuid": "GPU-a", "reserved_bytes": 10, "active_bytes": 5, "peak_reserved_bytes": 20, "limit_bytes": 100}
        b = {"uuid": "GPU-a", "reserved_bytes": 3, "limit_bytes": 50}
        c = {"uuid": "GPU-b", "reserved_bytes": 1}
        self.assertEqual(protocol.merge_entries([a, b, c]), [
            {"uuid": "GPU-a", "reserved_bytes": 13, "limit_bytes": 50}, c])


class SplitTest(unittest.TestCase):
    def test_stats_lines_never_exceed_64_KiB_and_carry_every_device(self):
        entries = [{"uuid": "GPU-%032x" % i, "reserved_bytes": 2 ** 50 + i, "active_bytes": i,
                    "allocated_bytes": i, "inactive_split_bytes": i, "peak_reserved_bytes": i,
                    "peak_active_bytes": i, "limit_bytes": i, "alloc_retries": i, "ooms": i}
                   for i in range(3000)]
        lines = protocol.stats_lines(entries)
        self.assertGreater(len(lines), 1, "3000 devices should need several messages")
        seen = []
        for line in lines:
            self.assertLessEqual(len(line), protocol.MAX_LINE)
            self.assertTrue(line.endswith(b"\n"))
            self.assertEqual(line.count(b"\n"), 1)
            msg = json.loads(line.decode("utf-8"))
            self.assertEqual((msg["v"], msg["type"]), (1, "stats"))
            seen.extend(msg["devices"])
        self.assertEqual(seen, entries)

    def test_a_line_fills_up_to_the_limit_exactly(self):
        entries = [{"uuid": "GPU-%d" % i, "reserved_bytes": i} for i in range(200)]
        for limit in range(60, 400, 7):
            for line in protocol.stats_lines(entries, max_line=limit):
                self.assertLessEqual(len(line), limit)

    def test_no_devices_no_lines(self):
        self.assertEqual(protocol.stats_lines([]), [])


if __name__ == "__main__":
    unittest.main()
