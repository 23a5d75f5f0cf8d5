"""Which daemon sockets the client trusts, against socket squatting.

Another user on the machine could create the socket the client looks for
first (say /tmp/gpumem-1000/allocstats.sock before user 1000's daemon runs)
and read what the client sends. So the client connects to a candidate only
when, with symbolic links resolved:

- the directory holding the socket is owned by root or by this process's
  uid, or was given to another user by root: its parent directory is owned
  by root and writable by nobody else (systemd's RuntimeDirectory= does
  this for a daemon with DynamicUser=, /run/gpumem in
  deploy/systemd/gpumem_exporter.service);
- the path is a socket owned by root, by this process's uid or by the
  owner of that directory.

It then connects to the resolved path, the one it checked. A symbolic link
to a socket of someone else is refused like that socket itself.
"""

import os
import stat


class Untrusted(Exception):
    """A candidate socket the client must not use; the message says why."""


def trusted_uids():
    uids = {0}
    for name in ("getuid", "geteuid"):
        f = getattr(os, name, None)
        if f is not None:
            uids.add(f())
    return uids


def resolve(path, uids=None):
    """The path to connect to for the candidate `path`: its real path, once
    the checks above pass. Raises Untrusted when they fail, OSError when it
    cannot look (ENOENT: nothing there, as connect would say)."""
    uids = trusted_uids() if uids is None else uids
    real = os.path.realpath(path)
    directory = os.path.dirname(real)
    d = os.stat(directory)
    if not stat.S_ISDIR(d.st_mode):
        raise Untrusted("%s is not a directory" % directory)
    if d.st_uid not in uids and not _given_away_by_root(directory):
        raise Untrusted("its directory %s belongs to uid %d, not to root or uid %s" % (
            directory, d.st_uid, _uid_list(uids)))
    s = os.lstat(real)
    if not stat.S_ISSOCK(s.st_mode):
        raise Untrusted("%s is not a socket" % real)
    if s.st_uid not in uids and s.st_uid != d.st_uid:
        raise Untrusted("the socket %s belongs to uid %d, not to root, uid %s or the directory's owner" % (
            real, s.st_uid, _uid_list(uids)))
    return real


def _given_away_by_root(directory):
    """True when only root can have created (or chowned) directory: its
    parent is root's and writable by no one else."""
    p = os.stat(os.path.dirname(directory))
    return p.st_uid == 0 and not p.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _uid_list(uids):
    return "/".join(str(u) for u in sorted(uids) if u != 0) or "0"
