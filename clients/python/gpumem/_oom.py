"""PyTorch's out-of-memory observer.

PyTorch calls the observer from inside the caching allocator, on the thread
whose allocation failed, just before it raises OutOfMemoryError. So it only
appends to a bounded queue and wakes the sender thread: no I/O, no torch
call, no lock that the sender could hold for long. torch offers no way to
detach an observer, so it stays registered for the life of the process
(after stop() it only fills the bounded queue).
"""

import collections
import time

MAX_EVENTS = 64

events = collections.deque(maxlen=MAX_EVENTS)
# A callable that wakes the running client's thread, or None.
wake = None
# torch._C of the torch the observer was attached to (attach once per process).
registered_to = None


def observer(device, alloc, device_allocated_limit, device_free):
    """(device index, rounded bytes requested, allowed maximum, free bytes)."""
    try:
        events.append((device, alloc, device_allocated_limit, device_free, time.monotonic()))
        w = wake
        if w is not None:
            w()
    except Exception:
        pass  # an exception here would surface inside the allocator


def reset_after_fork():
    global events, wake
    events = collections.deque(maxlen=MAX_EVENTS)
    wake = None
