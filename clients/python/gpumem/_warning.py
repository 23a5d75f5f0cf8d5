"""The daemon's warning that this process is about to run out of GPU memory.

When the daemon foresees, from the climb of the process's active memory,
that it would run out of memory soon, it sends a warning message: when,
how fast it climbs, what the ceiling is, the cause it foresees (a leak or
a growing batch) and the first remedy. The client prints one paragraph to
stderr (GPUMEM_WARNINGS=0 turns it off) and calls the functions registered
with gpumem.on_oom_risk, in a thread of its own, so that a training loop
can save its work before the failure. What a daemon sends is untrusted: only
known causes, bounded numbers and printable text are kept.
"""

import logging
import math
import queue
import threading

from . import _paragraph, protocol
from ._verdict import _text

log = logging.getLogger("gpumem")

CAUSES = ("leak", "growth")
MAX_CALLBACKS = 64


class OOMRisk(object):
    """A warning, as a callback registered with gpumem.on_oom_risk gets it.

    eta_seconds: estimated seconds until the process runs out of memory at
    its current climb; climb_bytes_per_minute: how fast active memory
    climbs; active_bytes, ceiling_bytes: where it stands and what the
    allocator can hold at most (ceiling: "limit" or "gpu"); cause: "leak"
    or "growth"; gpu, uuid: the device; summary, remedy: the daemon's words.
    """

    __slots__ = ("eta_seconds", "climb_bytes_per_minute", "active_bytes", "ceiling_bytes", "ceiling",
                 "cause", "gpu", "uuid", "summary", "remedy")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def __repr__(self):
        return "OOMRisk(cause=%r, gpu=%r, eta_seconds=%r)" % (self.cause, self.gpu, self.eta_seconds)


def _number(value):
    """A finite non-negative number, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def parse(msg):
    """A warning message as an OOMRisk, or None when it is not one."""
    if not isinstance(msg, dict) or msg.get("type") != "warning":
        return None
    eta = _number(msg.get("eta_seconds"))
    cause = msg.get("cause")
    if eta is None or cause not in CAUSES:
        return None
    gpu = msg.get("gpu")
    ceiling = msg.get("ceiling")
    return OOMRisk(
        eta_seconds=float(eta),
        climb_bytes_per_minute=protocol.non_negative_int(msg.get("climb_bytes_per_minute")),
        active_bytes=protocol.non_negative_int(msg.get("active_bytes")),
        ceiling_bytes=protocol.non_negative_int(msg.get("ceiling_bytes")),
        ceiling=ceiling if ceiling in ("limit", "gpu") else None,
        cause=cause,
        gpu=gpu if isinstance(gpu, str) and gpu.isdigit() and len(gpu) <= 4 else None,
        uuid=protocol.uuid_from_text(msg.get("uuid")) if isinstance(msg.get("uuid"), str) else None,
        summary=_text(msg.get("summary")),
        remedy=_text(msg.get("remedy")),
    )


def _when(seconds):
    if seconds < 120:
        return "%.0f s" % seconds
    if seconds < 7200:
        return "%.0f minutes" % (seconds / 60)
    return "%.1f hours" % (seconds / 3600)


def paragraph(w):
    """The lines printed for a warning."""
    where = "GPU %s" % w.gpu if w.gpu is not None else "the GPU"
    what = "a leak" if w.cause == "leak" else "a growing batch"
    head = "gpumem: this process may run out of GPU memory on %s in about %s (%s)." % (where, _when(w.eta_seconds), what)
    return _paragraph.paragraph(head, w.summary, w.remedy,
                                "Save your work now if it cannot wait (gpumem.on_oom_risk runs your own function on this"
                                " warning; GPUMEM_WARNINGS=0 turns this message off).")


def show(w, stream=None):
    """Write the paragraph to stderr; never raises."""
    _paragraph.show(paragraph, w, stream, kind="warning")


_lock = threading.Lock()
_callbacks = []
_queue = queue.Queue(maxsize=16)
_worker = None


def on_oom_risk(fn):
    """Call fn(risk) with an OOMRisk each time the daemon warns that this
    process may run out of GPU memory: from a thread of the client's own,
    never inside the framework's allocator. Returns fn, so it can decorate."""
    if not callable(fn):
        raise TypeError("gpumem.on_oom_risk needs a callable")
    with _lock:
        if fn not in _callbacks:
            if len(_callbacks) >= MAX_CALLBACKS:
                raise ValueError("gpumem.on_oom_risk: at most %d functions" % MAX_CALLBACKS)
            _callbacks.append(fn)
    return fn


def remove_oom_risk(fn):
    """Stop calling fn on warnings."""
    with _lock:
        if fn in _callbacks:
            _callbacks.remove(fn)


def dispatch(w):
    """Hand w to the registered functions in the callback thread; never
    blocks (a warning that finds the queue full is dropped)."""
    global _worker
    with _lock:
        if not _callbacks:
            return
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_run, name="gpumem-oom-risk", daemon=True)
            _worker.start()
    try:
        _queue.put_nowait(w)
    except queue.Full:
        pass


def _run():
    while True:
        w = _queue.get()
        with _lock:
            fns = list(_callbacks)
        for fn in fns:
            try:
                fn(w)
            except Exception:
                log.exception("gpumem: a function registered with gpumem.on_oom_risk raised")
