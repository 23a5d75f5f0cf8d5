"""The sender: one daemon thread that pushes allocator stats to gpumem_exporter.

Everything that can block (connect, send, receive) happens on that thread,
with timeouts. The caller's thread only starts and stops it; PyTorch's
out-of-memory observer only appends to a bounded queue (see _oom).
"""

import atexit
import errno
import logging
import os
import random
import select
import socket
import threading
import time

from . import _cuda, _framework_oom, _oom, _ownership, _paragraph, _verdict, _warning, config, protocol, sources as _sources

log = logging.getLogger("gpumem")

HEARTBEAT = 10.0  # a full-state push at the first cycle of each such period
SEND_TIMEOUT = 1.0
CONNECT_TIMEOUT = 1.0
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
STABLE_CONNECTION = 5.0  # a connection that lived this long resets the backoff
WELCOME_WAIT = 0.2
OOM_MAX_AGE = 60.0  # older queued OOM events are dropped, not sent late

_NO_DAEMON = (errno.ENOENT, errno.ECONNREFUSED)
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # EPIPE, not SIGPIPE


class Client(object):
    """A sender. Most code wants gpumem.start(); tests and tools build one."""

    def __init__(self, socket_path=None, interval=None, heartbeat=None,
                 send_timeout=None, connect_timeout=None,
                 backoff_initial=None, backoff_max=None, sources=None):
        def pick(value, default):
            return float(default if value is None else value)

        self.socket_paths = config.socket_paths(socket_path)
        self.socket_path = self.socket_paths[0]  # the one in use, or tried first
        self.interval, self._interval_fixed = config.interval(interval)
        self.heartbeat = pick(heartbeat, HEARTBEAT)
        self.send_timeout = pick(send_timeout, SEND_TIMEOUT)
        self.connect_timeout = pick(connect_timeout, CONNECT_TIMEOUT)
        self.backoff_initial = pick(backoff_initial, BACKOFF_INITIAL)
        self.backoff_max = pick(backoff_max, BACKOFF_MAX)
        self.sources = sources if sources is not None else _sources.default_sources()
        self._torch = next((s for s in self.sources if isinstance(s, _sources.TorchSource)), None)

        self.server = None  # the daemon's "server" from its welcome
        self.verdicts = []  # the daemon's verdicts on this process's OOMs, parsed
        self.show_verdicts = config.oom_message()
        self.warnings = []  # the daemon's warnings to this process, parsed
        self.show_warnings = config.warnings()
        # OOMs sent whose verdict has not come; the daemon's welcome says
        # whether one will (None: no welcome read yet on this connection).
        self._awaiting = 0
        self._daemon_verdicts = None
        self.connects = 0  # connections made
        self.connect_attempts = 0  # passes over the candidate sockets
        self.dropped_lines = 0  # lines not sent because a send failed

        self._sock = None
        self._rbuf = b""
        self._sent = {}  # uuid -> entry last sent on this connection
        self._last_full = None  # when all devices were last sent on it
        self._connected_at = 0.0
        self._backoff = self.backoff_initial
        self._next_connect = 0.0
        self._logged = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = None

    # -- control, from the caller's thread --

    def start(self):
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="gpumem", daemon=True)
        _oom.wake = self._wake.set
        self._thread.start()

    def running(self):
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def stop(self, timeout=1.0):
        """Stop the thread; True when it has ended within timeout."""
        self._stop.set()
        self._wake.set()
        if _oom.wake == self._wake.set:
            _oom.wake = None
        t = self._thread
        if t is None:
            self._close()
            return True
        if t is not threading.current_thread():
            t.join(timeout)
        return not t.is_alive()

    def wake(self):
        self._wake.set()

    # -- the thread --

    def _run(self):
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self._cycle(time.monotonic())
                _paragraph.writer.poll()  # what waited for a traceback that never came
            except Exception as e:
                self._log_once("cycle", logging.WARNING, "gpumem: unexpected error, continuing: %r", e)
                self._drop_connection("error")
            if self._stop.is_set():
                break
            self._wake.wait(self._wait_time())
        self._close()

    def _wait_time(self, wall=None):
        if self._sock is None:
            pending = self._next_connect - time.monotonic()
            if pending > 0:
                return pending
        return grid_wait(time.time() if wall is None else wall, self.interval)

    def _cycle(self, now):
        if self._torch is not None:
            self._torch.ensure_oom_observer()
        if self._sock is None:
            if now < self._next_connect:
                return
            entries = self._collect()
            # Connect only with something to say: a process that imported a
            # framework but never touched a GPU stays off the daemon.
            if not entries and not _oom.events:
                return
            if not self._connect():
                return
        else:
            if not self._read_incoming():
                return
            entries = None
        oom_uuids = self._send_ooms(now)
        if oom_uuids is None:
            return
        if entries is None or oom_uuids:
            entries = self._collect()
        # After an OOM, the devices concerned are pushed even if unchanged.
        self._send_stats(entries, now, force=oom_uuids)

    def _collect(self):
        entries = []
        for s in self.sources:
            entries.extend(s.entries())
        return protocol.merge_entries(entries)

    # -- connection --

    def _connect(self):
        s, err = None, None
        for path in self.socket_paths:
            try:
                target = _ownership.resolve(path)
            except _ownership.Untrusted as e:
                self._log_once("untrusted %s %s" % (path, e), logging.WARNING,
                               "gpumem: not connecting to %s: %s", path, e)
                continue
            except (OSError, ValueError) as e:
                if err is None or getattr(err, "errno", None) in _NO_DAEMON:
                    err = e
                continue
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(self.connect_timeout)
                s.connect(target)
                s.settimeout(self.send_timeout)
                self.socket_path = path
                break
            except (OSError, ValueError) as e:
                s.close()
                s = None
                # Report the first failure that is not "nobody there".
                if err is None or getattr(err, "errno", None) in _NO_DAEMON:
                    err = e
        self.connect_attempts += 1  # once every candidate has been tried
        if s is None:
            self._connect_failed(err)
            return False
        self._sock = s
        self._rbuf = b""
        self._sent = {}
        self._last_full = None
        self._daemon_verdicts = None
        self._connected_at = time.monotonic()
        self.connects += 1
        log.debug("gpumem: connected to %s", self.socket_path)
        hello = protocol.hello(_sources.frameworks(self.sources), config.warn_before())
        if not self._send([protocol.encode(hello)]):
            return False
        # The welcome is optional: wait briefly, then read it whenever it comes.
        try:
            select.select([s], [], [], min(WELCOME_WAIT, self.interval))
        except (OSError, ValueError):
            pass
        return self._read_incoming()

    def _connect_failed(self, e):
        code = getattr(e, "errno", None)
        if e is None:
            pass  # every candidate was refused, and each refusal was logged
        elif code in _NO_DAEMON:
            self._log_once("no-daemon", logging.INFO, "gpumem: no daemon at %s; will retry",
                           " or ".join(self.socket_paths))
        elif isinstance(e, socket.timeout) or code in (errno.EAGAIN, errno.EWOULDBLOCK):
            self._log_once("busy", logging.DEBUG, "gpumem: daemon at %s busy: %r; will retry", self.socket_path, e)
        else:
            self._log_once("connect-%s" % code, logging.WARNING,
                           "gpumem: cannot connect to %s: %s; will retry", self.socket_path, e)
        self._schedule_reconnect()

    def _schedule_reconnect(self):
        delay = min(self._backoff, self.backoff_max) * random.uniform(0.8, 1.2)
        self._next_connect = time.monotonic() + delay
        self._backoff = min(self._backoff * 2, self.backoff_max)

    def _drop_connection(self, why):
        s, self._sock = self._sock, None
        self._sent = {}
        self._awaiting = 0  # a verdict comes only on the connection that sent the OOM
        self._rbuf = b""
        if s is None:
            return
        log.debug("gpumem: connection to %s closed: %s", self.socket_path, why)
        try:
            s.close()
        except OSError:
            pass
        if time.monotonic() - self._connected_at >= STABLE_CONNECTION:
            self._backoff = self.backoff_initial
        self._schedule_reconnect()

    def _close(self):
        s, self._sock = self._sock, None
        if s is not None:
            try:
                s.close()
            except OSError:
                pass

    def _send(self, lines):
        """Send whole lines or drop the connection (a timed-out send may have
        written part of a line, and a daemon that does not read would only
        make us buffer): nothing is kept for later."""
        data = b"".join(lines)
        try:
            self._sock.sendall(data, _SEND_FLAGS)
            return True
        except (OSError, ValueError) as e:
            self.dropped_lines += len(lines)
            self._drop_connection("send: %r" % (e,))
            return False

    def _read_incoming(self):
        """Read what the daemon sent without waiting; False if it hung up."""
        s = self._sock
        try:
            while s is not None and select.select([s], [], [], 0)[0]:
                data = s.recv(65536)
                if not data:
                    self._drop_connection("closed by the daemon")
                    return False
                self._rbuf += data
                while b"\n" in self._rbuf:
                    line, self._rbuf = self._rbuf.split(b"\n", 1)
                    self._handle(protocol.parse_line(line))
                if len(self._rbuf) > protocol.MAX_LINE:
                    self._rbuf = b""
        except (OSError, ValueError) as e:
            self._drop_connection("receive: %r" % (e,))
            return False
        return True

    def _handle(self, msg):
        if not msg:
            return
        if msg.get("type") == "verdict":
            self._handle_verdict(msg)
            return
        if msg.get("type") == "warning":
            self._handle_warning(msg)
            return
        if msg.get("type") != "welcome":
            return
        # What a daemon answers is untrusted input too: the server string is
        # cut to printable text, the interval bounded on both sides.
        self._daemon_verdicts = msg.get("oom_verdict") is True
        server = msg.get("server")
        if isinstance(server, str):
            self.server = "".join(ch if ch.isprintable() else "?" for ch in server[:64])
        ms = protocol.non_negative_int(msg.get("interval_ms"))
        if ms and not self._interval_fixed:
            self.interval = min(max(ms / 1000.0, config.MIN_INTERVAL), config.MAX_INTERVAL)

    def _handle_verdict(self, msg):
        v = _verdict.parse(msg)
        if v is None or self._awaiting <= 0:
            return  # no OOM of ours is waiting: a daemon's stray line
        self._awaiting -= 1
        if len(self.verdicts) < _oom.MAX_EVENTS:
            self.verdicts.append(v)
        if self.show_verdicts:
            _verdict.show(v)

    def _handle_warning(self, msg):
        w = _warning.parse(msg)
        if w is None:
            return
        if len(self.warnings) < _oom.MAX_EVENTS:
            self.warnings.append(w)
        if self.show_warnings:
            _warning.show(w)
        _warning.dispatch(w)

    def pending_verdicts(self):
        """True while an OOM is queued or sent and its verdict may still come."""
        if _oom.events:
            return True
        return self._awaiting > 0 and self._daemon_verdicts is not False

    def wait_for_verdicts(self, timeout):
        """Wait up to timeout seconds for the verdicts of the OOMs queued or
        sent (at exit, so that a process dying of an OOM still prints why);
        True when none is left pending."""
        deadline = time.monotonic() + timeout
        while self.pending_verdicts():
            if not self.running() or time.monotonic() >= deadline:
                return False
            self.wake()
            time.sleep(0.02)
        return True

    # -- messages --

    def _send_ooms(self, now):
        """Send queued OOM events; None if the connection failed, else the set
        of UUIDs they were about."""
        lines = []
        uuids = set()
        while _oom.events:
            # Counted as awaiting its verdict before it leaves the queue: a
            # process exiting meanwhile (pending_verdicts, on its main
            # thread) sees it in one place or the other, never in neither.
            self._awaiting += 1
            try:
                ev = _oom.events.popleft()
            except IndexError:
                self._awaiting -= 1
                break
            if isinstance(ev, dict):  # JAX, CuPy: read in their exception hook
                uuid, entry = ev["uuid"], ev["entry"]
                alloc, limit, free, when = ev["requested"], ev["limit"], ev["free"], ev["when"]
            else:
                device, alloc, limit, free, when, stats = ev
                uuid = entry = None
            if now - when > OOM_MAX_AGE:
                self._awaiting -= 1
                continue
            if uuid is None:
                uuid = self._oom_uuid(device)
                if uuid is None:
                    self._awaiting -= 1
                    self._log_once("oom-uuid", logging.DEBUG, "gpumem: no UUID for OOM on device %r", device)
                    continue
                # The allocator's state at the failure goes first, so that the
                # daemon's OOM report shows what was held when it happened.
                entry = self._oom_entry(device, stats)
            if entry is not None:
                lines.extend(protocol.stats_lines([entry]))
            lines.append(protocol.encode(protocol.oom(uuid, alloc, limit, free)))
            uuids.add(uuid)
        if lines and not self._send(lines):
            return None
        return uuids

    def _oom_entry(self, device, stats):
        if self._torch is None or not stats:
            return None
        try:
            return self._torch.entry_from_stats(int(device), stats)
        except Exception:
            return None

    def _oom_uuid(self, device):
        if self._torch is None:
            return None
        try:
            return self._torch.uuid(int(device))
        except Exception:
            return None

    def _send_stats(self, entries, now, force=()):
        # The heartbeat goes at the first push of each heartbeat period of
        # the (host-wide) monotonic clock, so a node's clients send theirs
        # in the same cycle.
        period = max(self.heartbeat, self.interval)
        full = self._last_full is None or int(now // period) != int(self._last_full // period)
        if full:
            todo = entries
        else:
            todo = [e for e in entries if e["uuid"] in force or self._sent.get(e["uuid"]) != e]
        if not todo:
            return True
        if not self._send(protocol.stats_lines(todo)):
            return False
        for e in todo:
            self._sent[e["uuid"]] = e
        if full:
            self._last_full = now
        return True

    def _log_once(self, key, level, fmt, *args):
        if key in self._logged:
            return
        self._logged.add(key)
        try:
            log.log(level, fmt, *args)
        except Exception:
            pass

    def _abandon_after_fork(self):
        """In a forked child: forget the parent's connection. Closing our copy
        of the descriptor leaves the parent's connection open (no shutdown)."""
        self._thread = None
        self._close()


def grid_wait(now, every):
    """Seconds from now (clock time) to the first instant half-way between
    two whole multiples of every since the epoch that is at least every/2
    away. Every client of a node wakes at those instants, so their
    messages reach the daemon together, one wake-up for all of them; the
    daemon polls NVML on the whole multiples (when every is its interval),
    and keeping the messages off that instant keeps them out of the poll's
    busy stretch, where the Go runtime's monitor spins."""
    d = every - ((now - every / 2.0) % every)
    if d < every / 2.0:
        d += every
    return d


# -- the process-wide client --

_lock = threading.Lock()
_client = None
_atexit_registered = False


def start(socket_path=None, interval=None):
    """Start pushing allocator stats from a daemon thread. Idempotent; returns
    at once; never raises. True when the client runs, False when it does not
    (GPUMEM_DISABLE, or an error, which is logged)."""
    global _client, _atexit_registered
    try:
        if config.disabled():
            log.debug("gpumem: disabled by GPUMEM_DISABLE")
            return False
        if not hasattr(socket, "AF_UNIX"):
            log.info("gpumem: Unix sockets are not available here; not starting")
            return False
        with _lock:
            if _client is not None and _client.running():
                return True
            c = Client(socket_path=socket_path, interval=interval)
            if c._torch is not None:
                # Attached (or queued for when CUDA initialises) before the
                # caller's first allocation, not a cycle later.
                c._torch.ensure_oom_observer()
            c.start()
            _client = c
            # JAX's and CuPy's OOMs, where they end the program or a thread.
            _framework_oom.install()
            if not _atexit_registered:
                atexit.register(_stop_at_exit)
                _atexit_registered = True
        return True
    except Exception as e:
        try:
            log.warning("gpumem: could not start: %r", e)
        except Exception:
            pass
        return False


def stop(timeout=1.0):
    """Stop the client started by start(); True when its thread has ended."""
    global _client
    try:
        with _lock:
            c, _client = _client, None
        _framework_oom.uninstall()
        if c is None:
            return True
        return c.stop(timeout)
    except Exception:
        return False


def _stop_at_exit():
    """At exit: wait (bounded) for the verdicts of this process's OOMs, so a
    process that dies of an uncaught OutOfMemoryError prints why after
    PyTorch's traceback, then stop."""
    c = _client
    try:
        if c is not None and c.show_verdicts:
            c.wait_for_verdicts(config.oom_wait())
        # The tracebacks are written by now (sys.excepthook runs before
        # atexit): what waited for them is printed.
        _paragraph.writer.flush()
    except Exception:
        pass
    stop(0.5)


def collect():
    """The messages the client would send right now on a new connection:
    hello, then stats (full state; split as on the wire)."""
    srcs = _sources.default_sources()
    entries = []
    for s in srcs:
        entries.extend(s.entries())
    msgs = [protocol.hello(_sources.frameworks(srcs))]
    msgs.extend(protocol.stats_messages(protocol.merge_entries(entries)))
    return msgs


def _after_fork_in_child():
    """A forked child (a DataLoader worker, say) must not write to the parent's
    connection; it does not start a client of its own."""
    global _client, _lock
    _lock = threading.Lock()
    c, _client = _client, None
    _oom.reset_after_fork()
    _cuda._reset_after_fork()
    _paragraph.reset_after_fork()
    if c is not None:
        try:
            c._abandon_after_fork()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
