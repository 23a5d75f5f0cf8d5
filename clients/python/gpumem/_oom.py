"""PyTorch's out-of-memory observer.

PyTorch calls the observer from inside the caching allocator, on the thread
whose allocation failed, just before it raises OutOfMemoryError, after the
allocator released its lock. The observer reads memory_stats() of that one
device (so that the daemon learns the allocator's state at the failure, not
after the exception freed tensors), appends to a bounded queue and wakes the
sender thread: no I/O, no lock that the sender could hold for long. torch
offers no way to detach an observer, so it stays registered for the life of
the process (after stop() it only fills the bounded queue).
"""

import collections
import threading
import time

from . import _paragraph

MAX_EVENTS = 64

events = collections.deque(maxlen=MAX_EVENTS)
# A callable that wakes the running client's thread, or None.
wake = None
# torch._C of the torch the observer was attached to (attach once per process),
# and of the torch a lazy attach was queued for (torch.cuda._lazy_call).
registered_to = None
queued_to = None
attach_lock = threading.Lock()
# torch.cuda.memory_stats, set when the observer is attached.
snapshot = None


def observer(device, alloc, device_allocated_limit, device_free):
    """(device index, rounded bytes requested, allowed maximum, free bytes)."""
    stats = None
    try:
        read = snapshot
        if read is not None:
            stats = read(device)
    except Exception:
        stats = None
    try:
        # The verdict waits for the traceback of the error raised next.
        _paragraph.writer.oom_observed()
        events.append((device, alloc, device_allocated_limit, device_free, time.monotonic(), stats))
        w = wake
        if w is not None:
            w()
    except Exception:
        pass  # an exception here would surface inside the allocator


def reset_after_fork():
    global events, wake
    events = collections.deque(maxlen=MAX_EVENTS)
    wake = None
