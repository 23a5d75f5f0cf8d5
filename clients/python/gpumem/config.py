"""Configuration from arguments and environment variables."""

import logging
import math
import os

log = logging.getLogger("gpumem")

DEFAULT_SOCKET = "/run/gpumem/allocstats.sock"
DEFAULT_INTERVAL = 1.0
MIN_INTERVAL = 0.05
MAX_INTERVAL = 60.0  # the most a daemon's welcome may set (the idle timeout is minutes)

_TRUE = ("1", "true", "yes", "on")
_warned_interval = False


def disabled(environ=None):
    """True when GPUMEM_DISABLE asks the client to do nothing."""
    env = os.environ if environ is None else environ
    return env.get("GPUMEM_DISABLE", "").strip().lower() in _TRUE


DEFAULT_OOM_WAIT = 4.0  # seconds a process that dies of an OOM waits for the verdict


def oom_message(environ=None):
    """False when GPUMEM_OOM_MESSAGE turns the verdict on stderr off."""
    env = os.environ if environ is None else environ
    return env.get("GPUMEM_OOM_MESSAGE", "").strip().lower() not in ("0", "false", "no", "off")


def warnings(environ=None):
    """False when GPUMEM_WARNINGS turns the daemon's warnings on stderr off."""
    env = os.environ if environ is None else environ
    return env.get("GPUMEM_WARNINGS", "").strip().lower() not in ("0", "false", "no", "off")


def warn_before(environ=None):
    """Seconds of estimated time to OOM under which the daemon should warn
    (GPUMEM_WARN_BEFORE; 0: never), or None for the daemon's default."""
    env = os.environ if environ is None else environ
    value = env.get("GPUMEM_WARN_BEFORE", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return int(min(seconds, 7 * 86400))


def oom_wait(environ=None):
    """Seconds to wait at exit for the verdicts of OOMs sent (GPUMEM_OOM_WAIT)."""
    env = os.environ if environ is None else environ
    try:
        seconds = float(env.get("GPUMEM_OOM_WAIT", DEFAULT_OOM_WAIT))
    except (TypeError, ValueError):
        return DEFAULT_OOM_WAIT
    if not math.isfinite(seconds) or seconds < 0:
        return DEFAULT_OOM_WAIT
    return min(seconds, 30.0)


def socket_paths(explicit=None, environ=None):
    """Where to look for the daemon, in order. An explicit path or
    GPUMEM_SOCKET is the only candidate; otherwise default_socket_paths().
    Every candidate still has to pass the ownership checks in _ownership."""
    env = os.environ if environ is None else environ
    given = explicit or env.get("GPUMEM_SOCKET")
    if given:
        return [str(given)]
    return default_socket_paths(env)


def default_socket_paths(environ=None):
    """The candidates without GPUMEM_SOCKET: DEFAULT_SOCKET, then the places
    a daemon started without root falls back to: $XDG_RUNTIME_DIR/gpumem/ and
    $TMPDIR (or /tmp)/gpumem-<uid>/, with this process's uid (a researcher
    runs both as the same user). DEFAULT_SOCKET is read at each call, so a
    test can point it at a directory of its own."""
    env = os.environ if environ is None else environ
    paths = [DEFAULT_SOCKET]
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg:
        paths.append(os.path.join(xdg, "gpumem", "allocstats.sock"))
    getuid = getattr(os, "getuid", None)
    if getuid is not None:
        tmp = env.get("TMPDIR") or "/tmp"
        paths.append(os.path.join(tmp, "gpumem-%d" % getuid(), "allocstats.sock"))
    return paths


def parse_interval(value):
    """Seconds as a float >= MIN_INTERVAL, or None when value is not usable."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return max(seconds, MIN_INTERVAL)


def interval(explicit=None, environ=None):
    """(seconds, fixed): fixed is True when the user chose the interval, so
    the daemon's welcome must not override it."""
    global _warned_interval
    if explicit is not None:
        seconds = parse_interval(explicit)
        if seconds is not None:
            return seconds, True
        _warn_interval_once("interval=%r" % (explicit,))
        return DEFAULT_INTERVAL, True
    env = os.environ if environ is None else environ
    raw = env.get("GPUMEM_INTERVAL")
    if raw is None or raw.strip() == "":
        return DEFAULT_INTERVAL, False
    seconds = parse_interval(raw.strip())
    if seconds is not None:
        return seconds, True
    _warn_interval_once("GPUMEM_INTERVAL=%r" % (raw,))
    return DEFAULT_INTERVAL, True


def _warn_interval_once(what):
    global _warned_interval
    if _warned_interval:
        return
    _warned_interval = True
    log.warning("gpumem: invalid %s (want seconds > 0); using %.1f s", what, DEFAULT_INTERVAL)
