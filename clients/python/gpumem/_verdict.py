"""The daemon's verdict on an out-of-memory error, printed to stderr.

The daemon answers each oom message with a verdict message: the cause (one
of CAUSES), one sentence with the figures that decided it, and the first
remedy. What a daemon sends is untrusted input like any other: the client
prints only a known cause, printable text of bounded length, and a UUID
that parses as one.
"""

from . import _paragraph, protocol

CAUSES = ("limit", "fragmentation", "neighbours", "too_large", "leak", "growth", "contexts", "unknown")
MAX_TEXT = 800  # characters of the summary or the remedy that are printed


def _text(value):
    """value as printable one-line text of at most MAX_TEXT characters, or ''."""
    if not isinstance(value, str):
        return ""
    s = "".join(ch if ch.isprintable() else " " for ch in value[:MAX_TEXT * 2])
    s = " ".join(s.split())
    if len(s) > MAX_TEXT:
        s = s[:MAX_TEXT - 3] + "..."
    return s


def parse(msg):
    """A verdict message as a dict of checked fields, or None when it is not one."""
    if not isinstance(msg, dict) or msg.get("type") != "verdict":
        return None
    cause = msg.get("cause")
    if cause not in CAUSES:
        cause = "unknown"
    contributing = msg.get("contributing")
    if not isinstance(contributing, list):
        contributing = []
    contributing = [c for c in contributing[:len(CAUSES)] if c in CAUSES and c != cause]
    gpu = msg.get("gpu")
    return {
        "cause": cause,
        "contributing": contributing,
        "uuid": protocol.uuid_from_text(msg.get("uuid")) if isinstance(msg.get("uuid"), str) else None,
        "gpu": gpu if isinstance(gpu, str) and gpu.isdigit() and len(gpu) <= 4 else None,
        "requested": protocol.non_negative_int(msg.get("requested_bytes")),
        "summary": _text(msg.get("summary")),
        "remedy": _text(msg.get("remedy")),
    }


def paragraph(v):
    """The lines printed for a parsed verdict."""
    where = "GPU %s" % v["gpu"] if v["gpu"] is not None else "the GPU"
    if v["uuid"]:
        where += " (%s)" % v["uuid"]
    head = "gpumem: why CUDA ran out of memory on %s: %s" % (where, v["cause"])
    if v["contributing"]:
        head += " (also: %s)" % ", ".join(v["contributing"])
    return _paragraph.paragraph(head, v["summary"], v["remedy"],
                                "Every process on that GPU at the time: /api/v1/oom-reports on gpumem_exporter"
                                " (GPUMEM_OOM_MESSAGE=0 turns this message off).")


def show(v, stream=None):
    """Write the paragraph to stderr; never raises."""
    _paragraph.show(paragraph, v, stream, kind="verdict")
