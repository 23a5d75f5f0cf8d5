"""The client's one writer to stderr: the paragraph printed for a verdict, a
warning or the end of a warning, in order and at a bounded rate.

Order. A process that dies of an out-of-memory error prints its traceback
from an exception hook (sys.excepthook, threading.excepthook) while the
daemon's verdict may already be arriving on the sender thread: the daemon
answers in milliseconds, a busy process's hook can take longer. The
client's hooks hold the output while the hook they chain to writes the
traceback, and release it after (with stderr flushed); what arrived
meanwhile is printed then. PyTorch's observer runs before the error even
starts to unwind, so a verdict that comes after an observed OOM also waits
for a hook to release it, or for the process's exit, or, where the program
caught the error and no hook ever runs, for UNWIND_GRACE seconds. One
paragraph is written at a time (a lock), never inside another.

Rate. What a daemon sends is untrusted: each kind of paragraph has a token
bucket (BUCKETS), and what exceeds it is dropped and counted; the next
paragraph printed says how many were. Held paragraphs are bounded too
(MAX_HELD).
"""

import sys
import threading
import time

# Seconds a verdict that arrives after an observed OOM waits for the
# traceback when no hook releases it (the program caught the error).
UNWIND_GRACE = 2.0
MAX_HELD = 8
# kind: (burst, seconds per token). Verdicts come one per OOM the process
# raised; warnings as the daemon foresees one, a few an hour at most.
BUCKETS = {"verdict": (5, 10.0), "warning": (3, 30.0)}


def paragraph(head, summary, remedy, last, extra=()):
    """The lines, each but the head indented under "gpumem:"."""
    lines = [head]
    if summary:
        lines.append("gpumem:   " + summary)
    if remedy:
        lines.append("gpumem:   First: " + remedy)
    for line in extra:
        lines.append("gpumem:   " + line)
    lines.append("gpumem:   " + last)
    return "\n".join(lines) + "\n"


class Writer(object):
    """Writes paragraphs to a stream (stderr when None) one at a time, in
    order behind tracebacks, at a bounded rate. Every method is safe from
    any thread and never raises."""

    def __init__(self, stream=None, clock=time.monotonic, buckets=None, grace=UNWIND_GRACE):
        self._stream = stream
        self._clock = clock
        self._grace = grace
        self._lock = threading.RLock()
        self._holds = 0  # hooks writing a traceback now
        self._unwinding_since = None  # an OOM observed whose error has not reached a hook
        self._held = []  # (kind, text) waiting for the traceback
        self._buckets = {k: [float(b), float(b), float(p), clock()] for k, (b, p) in (BUCKETS if buckets is None else buckets).items()}
        self.dropped = 0  # paragraphs not printed since the last one printed
        self.dropped_total = 0

    def _out(self):
        return self._stream if self._stream is not None else sys.stderr

    # -- order --

    def hold(self):
        """A hook is about to write a traceback: output waits until release()."""
        with self._lock:
            self._holds += 1

    def release(self):
        """The hook's traceback is written: flush stderr, then print what waited."""
        with self._lock:
            if self._holds > 0:
                self._holds -= 1
            if self._holds == 0:
                self._unwinding_since = None
                try:
                    self._out().flush()
                except Exception:
                    pass
                self._flush_held()

    def oom_observed(self):
        """An OOM error is about to be raised (PyTorch's observer): output
        waits for its traceback (a hook's release), the exit, or the grace.
        Takes no lock: the observer runs inside the allocator, and the lock
        may be held by a write to a full pipe."""
        self._unwinding_since = self._clock()

    def _waiting(self):
        if self._holds > 0:
            return True
        since = self._unwinding_since
        if since is None:
            return False
        if self._clock() - since >= self._grace:
            self._unwinding_since = None
            return False
        return True

    def poll(self):
        """Print what waited once nothing holds it any more (the grace ran
        out); the sender thread calls it every cycle."""
        with self._lock:
            if self._held and not self._waiting():
                self._flush_held()

    def flush(self):
        """At exit: print everything held, whatever holds it."""
        with self._lock:
            self._holds = 0
            self._unwinding_since = None
            try:
                self._out().flush()
            except Exception:
                pass
            self._flush_held()

    def _flush_held(self):
        held, self._held = self._held, []
        for kind, text in held:
            self._emit(kind, text)

    # -- writing --

    def write(self, kind, text):
        """Print text (a paragraph of kind) now, or once the traceback is
        written; False when the rate limit dropped it."""
        try:
            with self._lock:
                if not self._take(kind):
                    self.dropped += 1
                    self.dropped_total += 1
                    return False
                if self._waiting():
                    if len(self._held) >= MAX_HELD:
                        self.dropped += 1
                        self.dropped_total += 1
                        return False
                    self._held.append((kind, text))
                    return True
                self._emit(kind, text)
                return True
        except Exception:
            return False

    def _take(self, kind):
        b = self._buckets.get(kind)
        if b is None:
            return True
        tokens, burst, per, last = b
        now = self._clock()
        tokens = min(burst, tokens + max(0.0, now - last) / per)
        b[3] = now
        if tokens < 1.0:
            b[0] = tokens
            return False
        b[0] = tokens - 1.0
        return True

    def _emit(self, kind, text):
        if self.dropped:
            text += "gpumem:   (%d more message%s from the daemon not printed: too many at once)\n" % (
                self.dropped, "" if self.dropped == 1 else "s")
            self.dropped = 0
        try:
            out = self._out()
            out.write(text)
            out.flush()
        except Exception:
            pass  # a message about memory must not be what stops the process


writer = Writer()


def show(render, value, stream=None, kind="verdict"):
    """Print render(value) through the process's writer (or straight to
    stream, for tests and tools); never raises."""
    try:
        text = render(value)
        if stream is not None:
            stream.write(text)
            stream.flush()
            return
        writer.write(kind, text)
    except Exception:
        pass


def reset_after_fork():
    global writer
    writer = Writer()
