"""Which daemon sockets the client trusts, against socket squatting.

Another user on the machine could create the socket the client looks for
first (say /tmp/gpumem-1000/allocstats.sock before user 1000's daemon runs),
or a symbolic link there to a directory of their own, and read what the
client sends. So the client resolves a candidate one component at a time,
without trusting what another user controls on the way:

- every symbolic link on the way is owned by root or by this process's uid
  (a link anyone else made, $TMPDIR/gpumem-<uid> pointing at their home
  say, is refused, wherever it points);
- every directory it looks a name up in, but the socket's own, is owned by
  root or by this process's uid and writable by no one else (unless it is
  sticky, like /tmp: then only the owner of a name can move it);

and then, on the path so resolved:

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

import errno
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


_MAX_LINKS = 40  # as the kernel's ELOOP


def resolve(path, uids=None):
    """The path to connect to for the candidate `path`: its real path, once
    the checks above pass. Raises Untrusted when they fail, OSError when it
    cannot look (ENOENT: nothing there, as connect would say)."""
    uids = trusted_uids() if uids is None else uids
    real, lookups, untrusted_link = _walk(path, uids)
    directory = os.path.dirname(real)
    d = os.lstat(directory)
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
    if untrusted_link:
        raise Untrusted(untrusted_link)
    for where, st in lookups:
        if where == directory:
            continue  # the socket's own directory, checked above
        if st.st_uid not in uids:
            raise Untrusted("the path goes through %s, which belongs to uid %d, not to root or uid %s" % (
                where, st.st_uid, _uid_list(uids)))
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise Untrusted("the path goes through %s, which other users can write to" % where)
    if d.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not d.st_mode & stat.S_ISVTX:
        raise Untrusted("its directory %s can be written to by other users" % directory)
    return real


def _walk(path, uids):
    """Resolves path one component at a time, like the kernel, without
    following a link more than _MAX_LINKS times. Returns the real path, the
    directories a name was looked up in (path, lstat) and, if a link on the
    way belongs to another user, why it is refused (the caller says so once
    its other checks, whose messages are more telling, have passed)."""
    path = os.fspath(path)
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    todo = [c for c in reversed(path.split("/")) if c]
    cur, links, lookups, untrusted_link = "/", 0, [], None
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        here = os.lstat(cur)
        if not stat.S_ISDIR(here.st_mode):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), cur)
        lookups.append((cur, here))
        nxt = os.path.join(cur, name)
        st = os.lstat(nxt)
        if not stat.S_ISLNK(st.st_mode):
            cur = nxt
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        if st.st_uid not in uids and untrusted_link is None:
            untrusted_link = "%s is a symbolic link of uid %d, not of root or uid %s" % (
                nxt, st.st_uid, _uid_list(uids))
        target = os.readlink(nxt)
        todo.extend(c for c in reversed(target.split("/")) if c)
        if target.startswith("/"):
            cur = "/"
    return cur, lookups, untrusted_link


def _given_away_by_root(directory):
    """True when only root can have created (or chowned) directory: its
    parent is root's and writable by no one else."""
    p = os.stat(os.path.dirname(directory))
    return p.st_uid == 0 and not p.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _uid_list(uids):
    return "/".join(str(u) for u in sorted(uids) if u != 0) or "0"
