"""GPU UUIDs from the CUDA driver API through ctypes.

cuInit, cuDeviceGet and cuDeviceGetUuid read device attributes only: none of
them creates a context.
"""

import ctypes
import ctypes.util
import threading

from . import protocol

_lock = threading.Lock()
_lib = None
_lib_failed = False
_cache = {}


def _load():
    global _lib, _lib_failed
    if _lib is not None or _lib_failed:
        return _lib
    names = ["libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda"), "nvcuda.dll"]
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if lib.cuInit(0) != 0:
                continue
        except AttributeError:
            continue
        _lib = lib
        return lib
    _lib_failed = True
    return None


def device_uuid(ordinal):
    """'GPU-…' for the CUDA device ordinal (a position in CUDA_VISIBLE_DEVICES),
    or None when the driver library or the device is not there."""
    ordinal = int(ordinal)
    with _lock:
        if ordinal in _cache:
            return _cache[ordinal]
        lib = _load()
        if lib is None:
            return None
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal)) != 0:
            return None
        raw = (ctypes.c_ubyte * 16)()
        fn = getattr(lib, "cuDeviceGetUuid_v2", None) or getattr(lib, "cuDeviceGetUuid", None)
        if fn is None or fn(ctypes.byref(raw), dev) != 0:
            return None
        uuid = protocol.uuid_from_bytes(bytes(raw))
        _cache[ordinal] = uuid
        return uuid


def _reset_after_fork():
    global _lock
    _lock = threading.Lock()
