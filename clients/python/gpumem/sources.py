"""Allocator statistics from the frameworks a process has loaded.

A source only looks at a framework the process imported itself (it never
imports one) and never does anything that would create a CUDA context: it
asks only about devices the process already uses, passing the device index
explicitly (the current device is per thread).
"""

import logging
import sys

from . import _cuda, _oom, protocol

log = logging.getLogger("gpumem")


def _loaded(module_name):
    """The module if it is in sys.modules and finished importing, else None.
    (A module still being imported by another thread is left alone.)"""
    mod = sys.modules.get(module_name)
    if mod is None:
        return None
    spec = getattr(mod, "__spec__", None)
    if spec is not None and getattr(spec, "_initializing", False):
        return None
    return mod


class Source(object):
    name = ""
    module = ""

    def __init__(self):
        self._failed = False

    def loaded(self):
        return _loaded(self.module)

    def version(self):
        mod = self.loaded()
        v = getattr(mod, "__version__", None) if mod is not None else None
        return str(v) if v is not None else None

    def entries(self):
        """Device entries for the stats message; [] when the framework is not
        loaded or an error occurs (logged once per source)."""
        try:
            mod = self.loaded()
            if mod is None:
                return []
            return self._entries(mod)
        except Exception as e:
            self._log_failure(e)
            return []

    def _log_failure(self, e):
        if not self._failed:
            self._failed = True
            log.warning("gpumem: reading %s allocator stats failed: %r (not logged again)", self.name, e)
            log.debug("gpumem: %s failure", self.name, exc_info=True)

    def _entries(self, mod):
        raise NotImplementedError


# torch.cuda.memory_stats(i) key for each field of a stats device entry.
TORCH_FIELDS = (
    ("reserved_bytes", "reserved_bytes.all.current"),
    ("active_bytes", "active_bytes.all.current"),
    ("allocated_bytes", "allocated_bytes.all.current"),
    ("inactive_split_bytes", "inactive_split_bytes.all.current"),
    ("peak_reserved_bytes", "reserved_bytes.all.peak"),
    ("peak_active_bytes", "active_bytes.all.peak"),
    ("alloc_retries", "num_alloc_retries"),
    ("ooms", "num_ooms"),
)


class TorchSource(Source):
    name = "pytorch"
    module = "torch"

    def __init__(self):
        Source.__init__(self)
        self._uuids = {}  # torch device index -> uuid
        self._totals = {}  # torch device index -> total memory in bytes
        self._observer_failed = False

    def _cuda(self, torch):
        """torch.cuda if CUDA is initialised in this process, else None."""
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return None
        return cuda

    def _entries(self, torch):
        cuda = self._cuda(torch)
        if cuda is None:
            return []
        has_context = getattr(getattr(torch, "_C", None), "_cuda_hasPrimaryContext", None)
        out = []
        for i in range(cuda.device_count()):
            if has_context is not None and not has_context(i):
                continue
            stats = cuda.memory_stats(i)
            if not stats:
                continue
            if has_context is None and not stats.get("reserved_bytes.all.peak"):
                # Without _cuda_hasPrimaryContext, a device whose allocator
                # never reserved anything is taken as unused.
                continue
            entry = self.entry_from_stats(i, stats)
            if entry is not None:
                out.append(entry)
        return out

    def entry_from_stats(self, i, stats):
        """The wire entry of torch device i from a memory_stats() dict, or None."""
        uuid = self.uuid(i)
        if uuid is None or not stats:
            return None
        fields = dict((name, stats.get(key)) for name, key in TORCH_FIELDS)
        cuda = getattr(self.loaded(), "cuda", None)
        fields["limit_bytes"] = self._limit(cuda, i) if cuda is not None else None
        return protocol.device_entry(uuid, fields)

    def _props(self, i):
        torch = self.loaded()
        props = torch.cuda.get_device_properties(i)
        self._totals[i] = getattr(props, "total_memory", None)
        return props

    def uuid(self, i):
        """The UUID of torch device index i (cached), or None."""
        if i in self._uuids:
            return self._uuids[i]
        props = self._props(i)
        raw = getattr(props, "uuid", None)
        uuid = protocol.uuid_from_text(raw) if raw is not None else None
        if uuid is None:
            uuid = _cuda.device_uuid(i)  # PyTorch < 2.4: ask the driver
        if uuid is not None:
            self._uuids[i] = uuid
        return uuid

    def _limit(self, cuda, i):
        """The per-process limit, only where the user set a fraction < 1."""
        get_fraction = getattr(cuda, "get_per_process_memory_fraction", None)
        if get_fraction is None:
            return None
        fraction = float(get_fraction(i))
        if not (0.0 <= fraction < 1.0):
            return None
        total = self._totals.get(i)
        if total is None:
            self._props(i)
            total = self._totals.get(i)
        if total is None:
            return None
        return int(fraction * int(total))

    def ensure_oom_observer(self):
        """Attach PyTorch's out-of-memory observer, once per process: at once
        when CUDA is initialised, else queued with torch.cuda._lazy_call,
        which PyTorch runs right after it initialises CUDA and before the
        allocation that made it do so: an OOM on the first allocation is
        reported too."""
        if self._observer_failed:
            return
        try:
            torch = self.loaded()
            if torch is None:
                return
            C = getattr(torch, "_C", None)
            if C is None or _oom.registered_to is C:
                return
            if self._cuda(torch) is not None:
                self._attach(torch)
                return
            lazy = getattr(getattr(torch, "cuda", None), "_lazy_call", None)
            if lazy is not None and _oom.queued_to is not C:
                _oom.queued_to = C
                lazy(lambda: self._attach(torch))
        except Exception as e:
            self._observer_failed = True
            log.warning("gpumem: attaching the out-of-memory observer failed: %r", e)

    def _attach(self, torch):
        """Attach the observer now. Runs on the client's thread, the caller's,
        or inside PyTorch's CUDA initialisation (a queued call): it must
        never raise, or the user's first CUDA call would fail."""
        try:
            with _oom.attach_lock:
                C = torch._C
                if _oom.registered_to is C:
                    return
                attach = getattr(C, "_cuda_attach_out_of_memory_observer", None)
                if attach is None:
                    self._observer_failed = True
                    log.debug("gpumem: this PyTorch has no out-of-memory observer")
                    return
                # The observer runs after the allocator released its lock,
                # so a memory_stats() there is safe: it records the
                # allocator as it stood at the failure, before the
                # exception frees anything.
                _oom.snapshot = torch.cuda.memory_stats
                attach(_oom.observer)
                _oom.registered_to = C
        except Exception as e:
            self._observer_failed = True
            try:
                log.warning("gpumem: attaching the out-of-memory observer failed: %r", e)
            except Exception:
                pass


class JaxSource(Source):
    name = "jax"
    module = "jax"

    def _entries(self, jax):
        # jax.local_devices() would initialise JAX's backends if the process
        # has not, which creates contexts (and preallocates memory) on every
        # GPU: only ask once JAX has done that itself.
        bridge = sys.modules.get("jax._src.xla_bridge")
        if not getattr(bridge, "_backends", None):
            return []
        out = []
        for d in jax.local_devices():
            if getattr(d, "platform", None) != "gpu":
                continue
            stats = d.memory_stats()
            if not stats:
                continue
            ordinal = getattr(d, "local_hardware_id", None)
            if ordinal is None:
                ordinal = d.id
            uuid = _cuda.device_uuid(ordinal)
            if uuid is None:
                continue
            in_use = stats.get("bytes_in_use")
            reserved = stats.get("pool_bytes")
            fields = {
                "reserved_bytes": reserved if reserved is not None else in_use,
                "active_bytes": in_use,
                "allocated_bytes": in_use,
                "peak_reserved_bytes": stats.get("peak_pool_bytes"),
                "peak_active_bytes": stats.get("peak_bytes_in_use"),
                "limit_bytes": stats.get("bytes_limit"),
            }
            entry = protocol.device_entry(uuid, fields)
            if entry is not None:
                out.append(entry)
        return out


class CupySource(Source):
    """CuPy's default memory pool, for the sender thread's current device
    (device 0 unless the thread changed it; CuPy cannot be asked about another
    device without switching to it, which could create a context)."""

    name = "cupy"
    module = "cupy"

    def __init__(self):
        Source.__init__(self)
        self._seen = set()  # devices whose pool has held memory
        self._uuids = {}

    def _entries(self, cupy):
        pool = cupy.get_default_memory_pool()
        total = pool.total_bytes()
        used = pool.used_bytes()
        device = int(cupy.cuda.runtime.getDevice())
        if not total and device not in self._seen:
            return []  # nothing allocated: the device may have no context
        self._seen.add(device)
        uuid = self._uuid(cupy, device)
        if uuid is None:
            return []
        entry = protocol.device_entry(uuid, {"reserved_bytes": total, "active_bytes": used})
        return [entry] if entry is not None else []

    def _uuid(self, cupy, device):
        if device in self._uuids:
            return self._uuids[device]
        uuid = None
        try:
            props = cupy.cuda.runtime.getDeviceProperties(device)
            raw = props.get("uuid") if hasattr(props, "get") else None
            if raw is not None:
                uuid = protocol.uuid_from_bytes(raw)
        except Exception:
            uuid = None
        if uuid is None:
            uuid = _cuda.device_uuid(device)
        if uuid is not None:
            self._uuids[device] = uuid
        return uuid


def default_sources():
    return [TorchSource(), JaxSource(), CupySource()]


def frameworks(sources):
    """[(name, version)] of the loaded frameworks, in source order."""
    return [(s.name, s.version()) for s in sources if s.loaded() is not None]
