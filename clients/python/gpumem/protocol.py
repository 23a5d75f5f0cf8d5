"""Wire protocol v1: building, checking and encoding messages.

One JSON object per line, UTF-8 (ASCII in practice), at most MAX_LINE bytes
including the newline. Every message carries "v":1 and "type".
"""

import json
import numbers
import re

from ._version import CLIENT

VERSION = 1
MAX_LINE = 64 * 1024

# Fields of a device entry in a stats message, in the order they are sent.
DEVICE_FIELDS = (
    "reserved_bytes",
    "active_bytes",
    "allocated_bytes",
    "inactive_split_bytes",
    "peak_reserved_bytes",
    "peak_active_bytes",
    "limit_bytes",
    "alloc_retries",
    "ooms",
)
# Fields that can be added when several allocators report the same GPU.
ADDITIVE_FIELDS = (
    "reserved_bytes",
    "active_bytes",
    "allocated_bytes",
    "inactive_split_bytes",
    "alloc_retries",
    "ooms",
)

_HEX = "0123456789abcdef"


def non_negative_int(value):
    """value as a non-negative int, or None (bools, negatives, NaN, junk)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        n = int(value)
    elif isinstance(value, numbers.Real):
        f = float(value)
        if f != f or f in (float("inf"), float("-inf")) or f != int(f):
            return None
        n = int(f)
    else:
        try:
            n = int(value)  # numpy scalars and the like
        except Exception:
            return None
    return n if n >= 0 else None


def uuid_from_bytes(raw):
    """16 raw bytes -> 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx', or None."""
    if isinstance(raw, str):
        raw = raw.encode("latin-1")
    try:
        raw = bytes(bytearray(raw))
    except Exception:
        return None
    if len(raw) != 16:
        return None
    h = "".join(_HEX[b >> 4] + _HEX[b & 15] for b in bytearray(raw))
    return "GPU-%s-%s-%s-%s-%s" % (h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])


_UUID_BODY = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_UUID_HEX = re.compile(r"^[0-9a-fA-F]{32}$")


def uuid_from_text(text):
    """A UUID as a library prints it (dashed hex, 32 hex digits, or already
    prefixed with GPU-/MIG-) -> the prefixed dashed form; None if it is not
    a UUID (an old object's repr, for one)."""
    if text is None:
        return None
    s = str(text).strip()
    prefix = "GPU-"
    if s[:4] in ("GPU-", "MIG-"):
        prefix, s = s[:4], s[4:]
    if _UUID_HEX.match(s):
        s = "%s-%s-%s-%s-%s" % (s[0:8], s[8:12], s[12:16], s[16:20], s[20:32])
    if not _UUID_BODY.match(s):
        return None
    return prefix + s.lower()


def device_entry(uuid, fields):
    """A stats device entry with only known, valid fields; None without a
    usable uuid or reserved_bytes (both are required)."""
    if not uuid or not isinstance(uuid, str):
        return None
    entry = {"uuid": uuid}
    for name in DEVICE_FIELDS:
        n = non_negative_int(fields.get(name))
        if n is not None:
            entry[name] = n
    if "reserved_bytes" not in entry:
        return None
    return entry


def merge_entries(entries):
    """One entry per uuid. Where several allocators report the same GPU, their
    current values and counters are added, the smallest limit is kept, and
    peaks are dropped (a sum of peaks is no peak)."""
    merged = {}
    order = []
    for e in entries:
        u = e["uuid"]
        if u not in merged:
            merged[u] = dict(e)
            order.append(u)
            continue
        m = merged[u]
        for name in ADDITIVE_FIELDS:
            if name in m and name in e:
                m[name] += e[name]
            else:
                m.pop(name, None)
        if "reserved_bytes" not in m:
            m["reserved_bytes"] = e["reserved_bytes"]  # cannot happen; keep valid
        for name in ("peak_reserved_bytes", "peak_active_bytes"):
            m.pop(name, None)
        if "limit_bytes" in e:
            m["limit_bytes"] = min(m.get("limit_bytes", e["limit_bytes"]), e["limit_bytes"])
    return [merged[u] for u in order]


def hello(frameworks, warn_before=None):
    """frameworks: list of (name, version or None), in detection order;
    warn_before: seconds of estimated time to OOM under which the daemon is
    asked to warn (None: its default)."""
    msg = {"v": VERSION, "type": "hello"}
    if frameworks:
        msg["framework"] = ",".join(name for name, _ in frameworks)
        version = frameworks[0][1]
        if version:
            msg["framework_version"] = str(version)
    msg["client"] = CLIENT
    n = non_negative_int(warn_before)
    if n is not None:
        msg["warn_before_seconds"] = n
    return msg


def oom(uuid, requested, limit, free):
    msg = {"v": VERSION, "type": "oom", "uuid": uuid}
    for name, value in (("requested_bytes", requested), ("limit_bytes", limit), ("free_bytes", free)):
        n = non_negative_int(value)
        if n is not None:
            msg[name] = n
    return msg


def encode(msg):
    """msg as one line of bytes, newline included."""
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode("utf-8")


_STATS_HEAD = b'{"v":1,"type":"stats","devices":['
_STATS_TAIL = b"]}\n"


def stats_lines(entries, max_line=MAX_LINE):
    """Encoded stats lines carrying entries, split so no line exceeds max_line.
    An entry that alone would not fit is dropped."""
    lines = []
    parts = []
    size = len(_STATS_HEAD) + len(_STATS_TAIL)
    for e in entries:
        enc = json.dumps(e, separators=(",", ":")).encode("utf-8")
        if len(_STATS_HEAD) + len(enc) + len(_STATS_TAIL) > max_line:
            continue
        extra = len(enc) + (1 if parts else 0)
        if parts and size + extra > max_line:
            lines.append(_STATS_HEAD + b",".join(parts) + _STATS_TAIL)
            parts = []
            size = len(_STATS_HEAD) + len(_STATS_TAIL)
            extra = len(enc)
        parts.append(enc)
        size += extra
    if parts:
        lines.append(_STATS_HEAD + b",".join(parts) + _STATS_TAIL)
    return lines


def stats_messages(entries, max_line=MAX_LINE):
    """Like stats_lines, as dicts (for collect() and `python -m gpumem`)."""
    if not entries:
        return [{"v": VERSION, "type": "stats", "devices": []}]
    return [json.loads(line.decode("utf-8")) for line in stats_lines(entries, max_line)]


def parse_line(line):
    """A received line as a dict, or None."""
    try:
        msg = json.loads(line.decode("utf-8"))
    except Exception:
        return None
    return msg if isinstance(msg, dict) else None
