import sys
import types
from unittest import mock

from tests.helpers import GpumemTestCase, torch_stats, uuid_for
from gpumem import _oom, sources


class TorchSourceTest(GpumemTestCase):
    def test_maps_memory_stats_to_a_device_entry(self):
        stats = torch_stats(3664 << 20, active=916 << 20, allocated=900 << 20,
                            **{"inactive_split_bytes.all.current": 1144 << 20, "reserved_bytes.all.peak": 2978 << 20,
                               "active_bytes.all.peak": 2060 << 20, "num_alloc_retries": 1, "num_ooms": 2})
        self.install_torch({0: {"stats": stats}})
        self.assertEqual(sources.TorchSource().entries(), [{
            "uuid": "GPU-" + uuid_for(0),
            "reserved_bytes": 3664 << 20, "active_bytes": 916 << 20, "allocated_bytes": 900 << 20,
            "inactive_split_bytes": 1144 << 20, "peak_reserved_bytes": 2978 << 20,
            "peak_active_bytes": 2060 << 20, "alloc_retries": 1, "ooms": 2}])

    def test_device_without_primary_context_is_never_queried(self):
        t = self.install_torch({0: {"stats": torch_stats(1)}, 1: {"stats": torch_stats(2), "context": False},
                                2: {"stats": torch_stats(3)}})
        src = sources.TorchSource()
        for _ in range(3):
            got = src.entries()
        self.assertEqual([e["uuid"] for e in got], ["GPU-" + uuid_for(0), "GPU-" + uuid_for(2)])
        self.assertEqual(t.queried(1), [], "device 1 has no context: only _cuda_hasPrimaryContext may touch it")
        self.assertEqual(t.queried(0).count("get_device_properties"), 1, "the UUID is cached per index")

    def test_nothing_but_is_initialized_when_cuda_is_not_initialised(self):
        t = self.install_torch({0: {"stats": torch_stats(1)}}, initialized=False)
        src = sources.TorchSource()
        self.assertEqual(src.entries(), [])
        src.ensure_oom_observer()
        self.assertEqual(set(name for name, _ in t.calls), {"is_initialized"})

    def test_empty_or_partial_stats(self):
        self.install_torch({0: {"stats": {}}, 1: {"stats": {"reserved_bytes.all.current": 7}}})
        self.assertEqual(sources.TorchSource().entries(), [{"uuid": "GPU-" + uuid_for(1), "reserved_bytes": 7}])

    def test_limit_only_where_a_fraction_below_one_is_set(self):
        for fraction, want in ((None, None), (1.0, None), (0.5, 75377410048), (1.0 / 3, 50251606698)):
            self.install_torch({0: {"stats": torch_stats(1)}}, fraction=fraction)
            e = sources.TorchSource().entries()[0]
            self.assertEqual(e.get("limit_bytes"), want, "fraction %r" % (fraction,))

    def test_uuid_forms(self):
        body = "11111111-2222-3333-4444-555555555555"
        self.install_torch({0: {"stats": torch_stats(1), "uuid": "MIG-" + body},
                            1: {"stats": torch_stats(1), "uuid": None}})
        with mock.patch("gpumem._cuda.device_uuid", return_value=None) as drv:
            got = sources.TorchSource().entries()
        self.assertEqual([e["uuid"] for e in got], ["MIG-" + body], "a device without a UUID is not reported")
        drv.assert_called_once_with(1)

    def test_without_has_primary_context_unused_devices_are_skipped(self):
        self.install_torch({0: {"stats": torch_stats(5)}, 1: {"stats": torch_stats(0)}}, with_has_context=False)
        self.assertEqual([e["uuid"] for e in sources.TorchSource().entries()], ["GPU-" + uuid_for(0)])

    def test_errors_are_caught_and_logged_once(self):
        t = self.install_torch({0: {"stats": torch_stats(1)}})
        t.fail_stats = True
        src = sources.TorchSource()
        with self.assertLogs("gpumem", "WARNING") as logs:
            for _ in range(5):
                self.assertEqual(src.entries(), [])
        self.assertEqual(len([r for r in logs.records if r.levelname == "WARNING"]), 1)

    def test_oom_observer_attached_once(self):
        t = self.install_torch({0: {"stats": torch_stats(1)}})
        for _ in range(3):
            sources.TorchSource().ensure_oom_observer()
        self.assertEqual(t.observers, [_oom.observer])

    def test_module_being_imported_is_left_alone(self):
        t = self.install_torch({0: {"stats": torch_stats(1)}})
        t.module.__spec__ = types.SimpleNamespace(_initializing=True)
        self.assertEqual(sources.TorchSource().entries(), [])
        self.assertEqual(t.calls, [])


class StandInDevice(object):
    def __init__(self, id, platform="gpu", stats=None, local_hardware_id=None):
        self.id = id
        self.platform = platform
        self._stats = stats
        if local_hardware_id is not None:
            self.local_hardware_id = local_hardware_id

    def memory_stats(self):
        return self._stats


class JaxSourceTest(GpumemTestCase):
    def install_jax(self, devices, initialised=True):
        jax = types.ModuleType("jax")
        jax.__version__ = "0.4.30"
        calls = []

        def local_devices():
            calls.append("local_devices")
            return devices
        jax.local_devices = local_devices
        bridge = types.ModuleType("jax._src.xla_bridge")
        bridge._backends = {"cuda": object()} if initialised else {}
        sys.modules["jax"] = jax
        sys.modules["jax._src.xla_bridge"] = bridge
        return calls

    def test_maps_memory_stats(self):
        self.install_jax([
            StandInDevice(0, stats={"bytes_in_use": 100, "peak_bytes_in_use": 150, "pool_bytes": 200,
                                    "peak_pool_bytes": 250, "bytes_limit": 1000, "num_allocs": 3}),
            StandInDevice(1, stats={"bytes_in_use": 7}, local_hardware_id=3),
            StandInDevice(2, stats=None),
            StandInDevice(3, platform="cpu", stats={"bytes_in_use": 1}),
        ])
        with mock.patch("gpumem._cuda.device_uuid", side_effect=lambda o: "GPU-" + uuid_for(o)) as drv:
            got = sources.JaxSource().entries()
        self.assertEqual(got, [
            {"uuid": "GPU-" + uuid_for(0), "reserved_bytes": 200, "active_bytes": 100, "allocated_bytes": 100,
             "peak_reserved_bytes": 250, "peak_active_bytes": 150, "limit_bytes": 1000},
            {"uuid": "GPU-" + uuid_for(3), "reserved_bytes": 7, "active_bytes": 7, "allocated_bytes": 7},
        ])
        self.assertEqual([c[0][0] for c in drv.call_args_list], [0, 3], "ordinal is local_hardware_id, else id")

    def test_backends_not_initialised_means_no_device_query(self):
        calls = self.install_jax([StandInDevice(0, stats={"bytes_in_use": 1})], initialised=False)
        self.assertEqual(sources.JaxSource().entries(), [])
        self.assertEqual(calls, [], "jax.local_devices() would initialise the backends")


class CupySourceTest(GpumemTestCase):
    def install_cupy(self, total, used, uuid_bytes=bytes(range(16))):
        cupy = types.ModuleType("cupy")
        cupy.__version__ = "13.0.0"
        pool = types.SimpleNamespace(total_bytes=lambda: pool.total, used_bytes=lambda: pool.used,
                                     total=total, used=used)
        cupy.get_default_memory_pool = lambda: pool
        runtime = types.SimpleNamespace(getDevice=lambda: 0,
                                        getDeviceProperties=lambda i: {"uuid": uuid_bytes, "name": b"x"})
        cupy.cuda = types.SimpleNamespace(runtime=runtime)
        sys.modules["cupy"] = cupy
        return pool

    def test_reports_the_pool_once_it_has_held_memory(self):
        pool = self.install_cupy(0, 0)
        src = sources.CupySource()
        self.assertEqual(src.entries(), [])
        pool.total, pool.used = 4096, 1024
        want = {"uuid": "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", "reserved_bytes": 4096, "active_bytes": 1024}
        self.assertEqual(src.entries(), [want])
        pool.total, pool.used = 0, 0
        self.assertEqual(src.entries(), [dict(want, reserved_bytes=0, active_bytes=0)],
                         "a pool emptied after use is still reported")


class FrameworksTest(GpumemTestCase):
    def test_hello_names_every_loaded_framework(self):
        self.install_torch({})
        sys.modules["cupy"] = types.ModuleType("cupy")
        self.assertEqual(sources.frameworks(sources.default_sources()), [("pytorch", "2.11.0"), ("cupy", None)])
