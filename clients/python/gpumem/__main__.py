"""python -m gpumem: show (or send once) what this client would report.

    python -m gpumem --import torch --init-cuda
    python -m gpumem --send

stdout gets the JSON lines, one message a line; stderr gets the socket path,
whether a daemon answers there, why no device is listed when none is, and,
with --send, what happened.
"""

import argparse
import importlib
import json
import socket
import sys

from . import __version__, _ownership, client, config, protocol, sources


def _why_no_devices():
    """Why the stats name no device: no framework loaded in this process, or
    one loaded that has not used a GPU yet (the client never makes it)."""
    loaded = [name for name, _ in sources.frameworks(sources.default_sources())]
    if not loaded:
        return ("no devices to report: no framework (torch, jax, cupy) is loaded in this process, and the "
                "client reports only what a framework already loaded holds; try "
                "python -m gpumem --import torch --init-cuda, or call gpumem.start() in the program that trains")
    return ("no devices to report: %s is loaded but has used no GPU in this process yet, and the client "
            "never initialises CUDA itself; with torch, add --init-cuda (a small tensor on cuda:0)"
            % ", ".join(loaded))


def _reachable(path, timeout=1.0):
    try:
        target = _ownership.resolve(path)
    except _ownership.Untrusted as e:
        return False, "refused: %s" % (e,)
    except (OSError, ValueError) as e:
        return False, "not reachable: %s" % (e,)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(target)
        return True, "reachable"
    except (OSError, ValueError) as e:
        return False, "not reachable: %s" % (e,)
    finally:
        s.close()


def _send_once(path, msgs, timeout=1.0):
    """Send msgs on one connection; return the daemon's welcome (or None)."""
    target = _ownership.resolve(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(target)
        s.sendall(protocol.encode(msgs[0]))
        welcome = None
        try:
            buf = b""
            while b"\n" not in buf:
                data = s.recv(65536)
                if not data:
                    break
                buf += data
            if buf:
                welcome = protocol.parse_line(buf.split(b"\n", 1)[0])
        except socket.timeout:
            pass
        for m in msgs[1:]:
            if m.get("type") == "stats" and not m.get("devices"):
                continue  # nothing to report
            s.sendall(protocol.encode(m))
        return welcome
    finally:
        s.close()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m gpumem", description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", help="daemon socket (default: $GPUMEM_SOCKET or %s)" % config.DEFAULT_SOCKET)
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import a framework first (torch, jax, cupy); repeatable")
    p.add_argument("--init-cuda", action="store_true",
                   help="with torch: allocate one small tensor on cuda:0 first "
                        "(creates a CUDA context there, so there is something to report)")
    p.add_argument("--send", action="store_true", help="send the messages to the daemon once")
    p.add_argument("--version", action="version", version="gpumem " + __version__)
    args = p.parse_args(argv)

    for name in args.imports:
        try:
            importlib.import_module(name)
        except Exception as e:
            print("gpumem: import %s failed: %r" % (name, e), file=sys.stderr)
            return 2
    if args.init_cuda:
        try:
            import torch
            torch.zeros(1, device="cuda:0")
        except Exception as e:
            print("gpumem: --init-cuda failed: %r" % (e,), file=sys.stderr)
            return 2

    msgs = client.collect()
    for m in msgs:
        print(json.dumps(m, separators=(",", ":")))
    if not any(m.get("type") == "stats" and m.get("devices") for m in msgs):
        print("gpumem: " + _why_no_devices(), file=sys.stderr)
    paths = config.socket_paths(args.socket)
    path = paths[0]
    for candidate in paths:
        ok, how = _reachable(candidate)
        if ok:
            path = candidate
            break
    if not args.send:
        for candidate in paths:
            print("gpumem: socket %s: %s" % (candidate, _reachable(candidate)[1]), file=sys.stderr)
        return 0
    try:
        welcome = _send_once(path, msgs)
    except _ownership.Untrusted as e:
        print("gpumem: socket %s: refused: %s" % (path, e), file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print("gpumem: socket %s: send failed: %s" % (path, e), file=sys.stderr)
        return 1
    print("gpumem: sent %d message(s); welcome: %s" % (
        sum(1 for m in msgs if m.get("type") != "stats" or m.get("devices")),
        json.dumps(welcome) if welcome else "none"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

