"""Out-of-memory errors of JAX and CuPy, seen where they end a thread or the
process.

Neither framework offers an observer like PyTorch's: the error is only an
exception. When it reaches the interpreter's exception hook (sys.excepthook:
it kills the program) or a thread's (threading.excepthook: it kills that
thread), the arrays the failing code held are still referenced by the
traceback, so the framework's figures are those at the failure. The hook
reads them, parses the request size from the error's message, queues an
OOM event for the sender thread (as the PyTorch observer does) and hands
the exception on to the hook it replaced, which prints the traceback; the
client's output waits meanwhile (_paragraph), so the verdict comes after
the traceback however fast the daemon answers. At exit the client waits,
bounded, for the daemon's verdict and prints it.

An error the program catches never reaches a hook and is not reported;
nor is one under IPython or Jupyter, which do not call sys.excepthook.

The hooks chain: each calls the one it replaced (the user's, or Python's
default). uninstall() puts the replaced hooks back where ours are still
the ones installed; where another hook was installed on top of ours since,
ours stays in that chain and only passes exceptions on.
"""

import re
import sys
import threading
import time

from . import _cuda, _oom, _paragraph, protocol, sources as _sources

JAX = "jax"
CUPY = "cupy"

# How far along __cause__ / __context__ an OOM is looked for: JAX re-raises
# with a filtered traceback, the original as the cause.
MAX_CHAIN = 8
MAX_MESSAGE = 4096  # characters of a message that are parsed

_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}

# The request in XLA's messages, most exact first:
#   "Out of memory while trying to allocate 85899345920 bytes."
#   "Failed to allocate request for 80.00GiB (85899345920B) on device ordinal 0"
#   "Out of memory allocating 85899345920 bytes."
#   "Failed to allocate 80.00GiB"
_JAX_SIZES = (
    re.compile(r"\((\d+)B\)"),
    re.compile(r"allocat\w*(?: request for)? (\d+) bytes"),
    re.compile(r"allocat\w*(?: request for)? (\d+(?:\.\d+)?)\s*([KMGT]i?B)\b", re.I),
)
_JAX_ORDINAL = re.compile(r"device ordinal (\d+)")
# "Out of memory allocating 85,899,345,920 bytes (allocated so far: 0 bytes,
# limit set to: 1,073,741,824 bytes)."
_CUPY_SIZE = re.compile(r"allocating ([\d,]+) bytes")
_CUPY_LIMIT = re.compile(r"limit set to: ([\d,]+) bytes")


def _int(text):
    try:
        return int(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def parse_jax(message):
    """(requested bytes, device ordinal) from an XLA RESOURCE_EXHAUSTED
    message; either may be None."""
    message = str(message)[:MAX_MESSAGE]
    requested = None
    for i, rx in enumerate(_JAX_SIZES):
        m = rx.search(message)
        if m is None:
            continue
        if i < 2:
            requested = _int(m.group(1))
        else:
            requested = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
        break
    m = _JAX_ORDINAL.search(message)
    return requested, (int(m.group(1)) if m else None)


def parse_cupy(message):
    """(requested bytes, pool limit bytes) from CuPy's OutOfMemoryError
    message; either may be None."""
    message = str(message)[:MAX_MESSAGE]
    m = _CUPY_SIZE.search(message)
    requested = _int(m.group(1)) if m else None
    m = _CUPY_LIMIT.search(message)
    return requested, (_int(m.group(1)) if m else None)


def _module_of(exc):
    return getattr(type(exc), "__module__", "") or ""


def recognise(exc):
    """The framework whose out-of-memory error exc is (JAX or CUPY), looking
    along its causes, with that exception; (None, None) for anything else."""
    seen = 0
    while exc is not None and seen < MAX_CHAIN:
        seen += 1
        name = type(exc).__name__
        module = _module_of(exc)
        if name in ("XlaRuntimeError", "JaxRuntimeError") and (module.startswith("jax") or module.startswith("jaxlib")):
            if str(exc)[:MAX_MESSAGE].lstrip().startswith("RESOURCE_EXHAUSTED"):
                return JAX, exc
        if name == "OutOfMemoryError" and module.startswith("cupy"):
            return CUPY, exc
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return None, None


def _jax_event(exc):
    requested, ordinal = parse_jax(exc)
    if requested is None:
        return None
    entries = _sources.JaxSource().entries()
    entry = None
    if ordinal is not None:
        uuid = _cuda.device_uuid(ordinal)
        entry = next((e for e in entries if e["uuid"] == uuid), None)
    if entry is None and entries:
        # No ordinal in the message: the device whose allocator is fullest.
        entry = max(entries, key=lambda e: e.get("active_bytes", 0))
    if entry is None:
        return None
    return {"uuid": entry["uuid"], "requested": requested, "limit": entry.get("limit_bytes"), "entry": entry}


def _cupy_event(exc):
    requested, limit = parse_cupy(exc)
    if requested is None:
        requested = getattr(exc, "_size", None)  # CuPy keeps the figures too
    if limit is None:
        limit = getattr(exc, "_limit", None) or None
    if requested is None:
        return None
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    # The failing thread's device: CuPy allocates on the current one, which
    # has a context by now (also when the first allocation failed, with
    # the pool still empty).
    device = int(cupy.cuda.runtime.getDevice())
    uuid = _sources.CupySource()._uuid(cupy, device)
    if uuid is None:
        return None
    pool = cupy.get_default_memory_pool()
    entry = protocol.device_entry(uuid, {"reserved_bytes": pool.total_bytes(), "active_bytes": pool.used_bytes()})
    if entry is None:
        return None
    try:
        pool_limit = pool.get_limit()
        if pool_limit:
            limit = pool_limit
    except Exception:
        pass
    if limit:
        entry["limit_bytes"] = int(limit)
    return {"uuid": entry["uuid"], "requested": requested, "limit": limit, "entry": entry}


def event(exc):
    """The OOM event of exc (a dict the sender sends as stats then oom), or
    None when exc is no framework OOM or its figures cannot be read."""
    framework, oom = recognise(exc)
    try:
        if framework == JAX:
            ev = _jax_event(oom)
        elif framework == CUPY:
            ev = _cupy_event(oom)
        else:
            return None
    except Exception:
        return None
    if ev is None:
        return None
    ev["framework"] = framework
    ev["free"] = None  # the daemon reads NVML after the event
    ev["when"] = time.monotonic()
    return ev


def note(exc):
    """Queue exc's OOM event for the sender and wake it; never raises."""
    try:
        ev = event(exc)
        if ev is None:
            return False
        _oom.events.append(ev)
        w = _oom.wake
        if w is not None:
            w()
        return True
    except Exception:
        return False


# -- the hooks --

_lock = threading.Lock()
_active = False
_prev_sys = None
_prev_thread = None
# Python's own thread hook (threading.__excepthook__ is 3.10+).
_default_thread_hook = getattr(threading, "__excepthook__", getattr(threading, "excepthook", None))


def _sys_hook(exc_type, exc, tb):
    # The client's output waits while the hook chained to writes the
    # traceback: a verdict that the daemon answers at once comes after it.
    _paragraph.writer.hold()
    try:
        if _active:
            note(exc)
        prev = _prev_sys if _prev_sys is not None else sys.__excepthook__
        prev(exc_type, exc, tb)
    finally:
        _paragraph.writer.release()


def _thread_hook(args):
    _paragraph.writer.hold()
    try:
        if _active and args.exc_type is not SystemExit:
            note(args.exc_value)
        prev = _prev_thread if _prev_thread is not None else _default_thread_hook
        prev(args)
    finally:
        _paragraph.writer.release()


def install():
    """Install both hooks over the ones in place (idempotent)."""
    global _active, _prev_sys, _prev_thread
    with _lock:
        if sys.excepthook is not _sys_hook and _prev_sys is None:
            _prev_sys = sys.excepthook
            sys.excepthook = _sys_hook
        if hasattr(threading, "excepthook") and threading.excepthook is not _thread_hook and _prev_thread is None:
            _prev_thread = threading.excepthook
            threading.excepthook = _thread_hook
        _active = True


def uninstall():
    """Put the replaced hooks back where ours are still the ones installed;
    elsewhere ours only passes exceptions on from now."""
    global _active, _prev_sys, _prev_thread
    with _lock:
        _active = False
        if sys.excepthook is _sys_hook:
            sys.excepthook = _prev_sys if _prev_sys is not None else sys.__excepthook__
            _prev_sys = None
        if hasattr(threading, "excepthook") and threading.excepthook is _thread_hook:
            threading.excepthook = _prev_thread if _prev_thread is not None else _default_thread_hook
            _prev_thread = None


def installed():
    return _active
