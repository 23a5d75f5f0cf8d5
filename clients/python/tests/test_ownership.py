"""The client connects only to sockets that no other user can have put in its
way (gpumem/_ownership.py). Cases with another owner need root (os.chown)."""

import contextlib
import errno
import io
import logging
import os
import stat

from tests.helpers import FakeDaemon, GpumemTestCase, torch_stats, wait_until
import gpumem
import gpumem.__main__
import gpumem.client
from gpumem import _ownership

OTHER = 65534  # nobody
THIRD = 65533
ROOT = os.geteuid() == 0


class Layout(object):
    """Builds directories and sockets under base with chosen owners and
    modes; chown needs root."""

    def __init__(self, test, base):
        self.test = test
        self.base = base

    def dir(self, rel, mode=0o755, owner=None):
        path = os.path.join(self.base, rel)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, owner, -1)
        return path

    def socket(self, rel, owner=None):
        path = os.path.join(self.base, rel)
        d = FakeDaemon(path)
        self.test.daemons.append(d)
        if owner is not None:
            os.chown(path, owner, -1)
        return path, d


class ResolveTest(GpumemTestCase):
    """Table of layouts: (name, needs root, build(layout) -> socket path,
    None when accepted or a fragment of the refusal)."""

    def build_cases(self):
        def own_dir(l):
            l.dir("own", 0o700)
            return l.socket("own/s.sock")[0]

        def others_dir_in_shared_tmp(l):
            l.dir("tmp", 0o1777)
            l.dir("tmp/gpumem-0", 0o755, owner=OTHER)
            return l.socket("tmp/gpumem-0/s.sock", owner=OTHER)[0]

        def others_dir_even_with_our_socket(l):
            l.dir("tmp", 0o1777)
            l.dir("tmp/gpumem-0", 0o755, owner=OTHER)
            return l.socket("tmp/gpumem-0/s.sock")[0]

        def others_socket_in_own_dir(l):
            l.dir("own", 0o700)
            return l.socket("own/s.sock", owner=OTHER)[0]

        def dir_given_away_by_root(l):
            # systemd: RuntimeDirectory=gpumem of a DynamicUser= service.
            l.dir("run", 0o755)
            l.dir("run/gpumem", 0o755, owner=OTHER)
            return l.socket("run/gpumem/s.sock", owner=OTHER)[0]

        def given_away_dir_with_a_third_users_socket(l):
            l.dir("run", 0o755)
            l.dir("run/gpumem", 0o777, owner=OTHER)
            return l.socket("run/gpumem/s.sock", owner=THIRD)[0]

        def dir_in_a_group_writable_parent(l):
            l.dir("run", 0o775)
            l.dir("run/gpumem", 0o755, owner=OTHER)
            return l.socket("run/gpumem/s.sock", owner=OTHER)[0]

        def link_to_a_socket_of_someone_else(l):
            l.dir("tmp", 0o1777)
            l.dir("tmp/theirs", 0o755, owner=OTHER)
            target = l.socket("tmp/theirs/s.sock", owner=OTHER)[0]
            l.dir("own", 0o700)
            os.symlink(target, os.path.join(l.base, "own", "s.sock"))
            return os.path.join(l.base, "own", "s.sock")

        def link_to_our_own_socket(l):
            l.dir("own", 0o700)
            l.dir("other", 0o700)
            target = l.socket("other/s.sock")[0]
            os.symlink(target, os.path.join(l.base, "own", "s.sock"))
            return os.path.join(l.base, "own", "s.sock")

        def linked_directory_of_someone_else(l):
            l.dir("tmp", 0o1777)
            l.dir("tmp/theirs", 0o755, owner=OTHER)
            l.socket("tmp/theirs/s.sock", owner=OTHER)
            os.symlink(os.path.join(l.base, "tmp", "theirs"), os.path.join(l.base, "tmp", "gpumem-0"))
            return os.path.join(l.base, "tmp", "gpumem-0", "s.sock")

        def link_of_another_user_to_their_home(l):
            # $TMPDIR/gpumem-<uid> made, by another user, a link to their
            # own home: a directory of theirs under a root-owned 0755
            # parent, as /home/<user> is, which alone would pass for a
            # directory root gave away.
            l.dir("tmp", 0o1777)
            l.dir("home", 0o755)
            l.dir("home/them", 0o755, owner=OTHER)
            l.socket("home/them/s.sock", owner=OTHER)
            link = os.path.join(l.base, "tmp", "gpumem-0")
            os.symlink(os.path.join(l.base, "home", "them"), link)
            os.lchown(link, OTHER, -1)
            return os.path.join(link, "s.sock")

        def link_of_another_user_to_our_socket(l):
            l.dir("tmp", 0o1777)
            l.dir("own", 0o700)
            target = l.socket("own/s.sock")[0]
            link = os.path.join(l.base, "tmp", "s.sock")
            os.symlink(target, link)
            os.lchown(link, OTHER, -1)
            return link

        def through_another_users_directory(l):
            l.dir("theirs", 0o755, owner=OTHER)
            l.dir("theirs/own", 0o700)
            return l.socket("theirs/own/s.sock")[0]

        def through_a_world_writable_directory(l):
            l.dir("shared", 0o777)
            l.dir("shared/own", 0o700)
            return l.socket("shared/own/s.sock")[0]

        def own_dir_writable_by_all(l):
            l.dir("own", 0o777)
            return l.socket("own/s.sock")[0]

        def relative_link_through_dotdot(l):
            l.dir("own", 0o700)
            l.dir("own/a", 0o700)
            l.socket("own/s.sock")
            os.symlink("../s.sock", os.path.join(l.base, "own", "a", "s.sock"))
            return os.path.join(l.base, "own", "a", "s.sock")

        def not_a_socket(l):
            l.dir("own", 0o700)
            path = os.path.join(l.base, "own", "s.sock")
            open(path, "w").close()
            return path

        return [
            ("own directory and socket", False, own_dir, None),
            ("link to our own socket", False, link_to_our_own_socket, None),
            ("not a socket", False, not_a_socket, "is not a socket"),
            ("another user's directory in a shared /tmp", True, others_dir_in_shared_tmp, "belongs to uid 65534"),
            ("our socket in another user's directory", True, others_dir_even_with_our_socket, "belongs to uid 65534"),
            ("another user's socket in our directory", True, others_socket_in_own_dir, "the socket"),
            ("a directory root gave away", True, dir_given_away_by_root, None),
            ("a third user's socket in a given-away directory", True,
             given_away_dir_with_a_third_users_socket, "belongs to uid 65533"),
            ("a directory in a group-writable parent", True, dir_in_a_group_writable_parent, "belongs to uid 65534"),
            ("a link to another user's socket", True, link_to_a_socket_of_someone_else, "belongs to uid 65534"),
            ("a linked directory of another user", True, linked_directory_of_someone_else, "belongs to uid 65534"),
            ("another user's link to their home", True, link_of_another_user_to_their_home,
             "is a symbolic link of uid 65534"),
            ("another user's link to our socket", True, link_of_another_user_to_our_socket,
             "is a symbolic link of uid 65534"),
            ("a path through another user's directory", True, through_another_users_directory,
             "which belongs to uid 65534"),
            ("a path through a world-writable directory", False, through_a_world_writable_directory,
             "which other users can write to"),
            ("a socket directory writable by all", False, own_dir_writable_by_all, "can be written to by other users"),
            ("our relative link through ..", False, relative_link_through_dotdot, None),
        ]

    def test_resolve(self):
        for i, (name, needs_root, build, refusal) in enumerate(self.build_cases()):
            with self.subTest(name):
                if needs_root and not ROOT:
                    self.skipTest("needs root to chown")
                base = os.path.join(self.tmp, "case%d" % i)
                os.mkdir(base, 0o700)
                path = build(Layout(self, base))
                if refusal is None:
                    real = _ownership.resolve(path)
                    self.assertEqual(real, os.path.realpath(path))
                    self.assertTrue(stat.S_ISSOCK(os.lstat(real).st_mode))
                else:
                    with self.assertRaises(_ownership.Untrusted, msg="%s must be refused" % name) as cm:
                        _ownership.resolve(path)
                    self.assertIn(refusal, str(cm.exception))

    def test_nothing_there_is_no_daemon_not_a_refusal(self):
        with self.assertRaises(OSError) as cm:
            _ownership.resolve(os.path.join(self.tmp, "missing", "s.sock"))
        self.assertEqual(cm.exception.errno, errno.ENOENT)
        with self.assertRaises(OSError) as cm:
            _ownership.resolve(os.path.join(self.tmp, "s.sock"))
        self.assertEqual(cm.exception.errno, errno.ENOENT)


class ClientRefusesSquattersTest(GpumemTestCase):
    """A squatter (uid 65534) listens where the client looks: given
    explicitly, at the $XDG_RUNTIME_DIR fallback or at the $TMPDIR fallback,
    each in a shared writable directory. The client never connects, logs the
    reason once, keeps running, and still finds a trusted daemon."""

    def squat(self, shared, rel):
        """A shared sticky directory holding the squatter's rel path."""
        l = Layout(self, shared)
        l.dir(".", 0o1777)
        l.dir(os.path.dirname(rel), 0o755, owner=OTHER)
        return l.socket(rel, owner=OTHER)

    def test_every_candidate_is_checked(self):
        if not ROOT:
            self.skipTest("needs root to chown")
        cases = [
            ("GPUMEM_SOCKET", lambda shared: ("GPUMEM_SOCKET", shared, "gpumem/allocstats.sock")),
            ("XDG_RUNTIME_DIR", lambda shared: ("XDG_RUNTIME_DIR", shared, "gpumem/allocstats.sock")),
            ("TMPDIR", lambda shared: ("TMPDIR", shared, "gpumem-%d/allocstats.sock" % os.getuid())),
        ]
        self.install_torch({0: {"stats": torch_stats(5 << 20)}})
        for i, (name, how) in enumerate(cases):
            with self.subTest(name):
                var, shared, rel = how(os.path.join(self.tmp, "shared%d" % i))
                path, squatter = self.squat(shared, rel)
                os.environ.pop("GPUMEM_SOCKET", None)
                os.environ["XDG_RUNTIME_DIR"] = self.host.xdg_runtime_dir
                os.environ["TMPDIR"] = self.host.tmpdir
                os.environ[var] = path if var == "GPUMEM_SOCKET" else shared
                with self.assertLogs("gpumem", logging.WARNING) as logs:
                    c = self.client(socket_path=None, backoff_initial=0.01, backoff_max=0.01)
                    self.assertIn(path, c.socket_paths)
                    wait_until(lambda: c.connect_attempts >= 5, what="five connection attempts")
                c.stop(2.0)
                self.assertEqual(squatter.conns, [], "the client connected to the squatter's %s" % path)
                refusals = [r.getMessage() for r in logs.records if "not connecting" in r.getMessage()]
                self.assertEqual(len(refusals), 1, "the reason is logged once: %r" % refusals)
                self.assertIn(path, refusals[0])
                self.assertIn("belongs to uid 65534", refusals[0])

    def test_a_link_to_another_users_directory_is_refused(self):
        """$TMPDIR/gpumem-<uid> is the squatter's link to its own home, where
        its daemon listens: the client must not follow it."""
        if not ROOT:
            self.skipTest("needs root to chown")
        tmpdir = os.path.join(self.tmp, "shared-tmp")
        l = Layout(self, self.tmp)
        l.dir("shared-tmp", 0o1777)
        l.dir("home", 0o755)
        l.dir("home/squatter", 0o755, owner=OTHER)
        _, squatter = l.socket("home/squatter/allocstats.sock", owner=OTHER)
        link = os.path.join(tmpdir, "gpumem-%d" % os.getuid())
        os.symlink(os.path.join(self.tmp, "home", "squatter"), link)
        os.lchown(link, OTHER, -1)
        os.environ.pop("GPUMEM_SOCKET", None)
        os.environ["XDG_RUNTIME_DIR"] = self.host.xdg_runtime_dir
        os.environ["TMPDIR"] = tmpdir
        self.install_torch({0: {"stats": torch_stats(5 << 20)}})
        with self.assertLogs("gpumem", logging.WARNING) as logs:
            c = self.client(socket_path=None, backoff_initial=0.01, backoff_max=0.01)
            wait_until(lambda: c.connect_attempts >= 5, what="five connection attempts")
        c.stop(2.0)
        self.assertEqual(squatter.conns, [], "the client followed the squatter's link %s" % link)
        self.assertTrue(any("is a symbolic link of uid 65534" in r.getMessage() for r in logs.records),
                        [r.getMessage() for r in logs.records])

    def test_a_trusted_candidate_after_a_refused_one_is_used(self):
        if not ROOT:
            self.skipTest("needs root to chown")
        squatted, squatter = self.squat(os.path.join(self.tmp, "shared"), "gpumem/allocstats.sock")
        good = self.daemon()
        self.install_torch({0: {"stats": torch_stats(5 << 20)}})
        c = self.client(start=False)
        c.socket_paths = [squatted, self.sock]
        with self.assertLogs("gpumem", logging.WARNING):
            c.start()
            wait_until(lambda: good.messages("stats"), what="stats at the trusted socket")
        self.assertEqual(c.socket_path, self.sock)
        self.assertEqual(squatter.conns, [])

    def test_start_never_raises_and_keeps_running(self):
        if not ROOT:
            self.skipTest("needs root to chown")
        path, squatter = self.squat(os.path.join(self.tmp, "shared"), "gpumem/allocstats.sock")
        os.environ["GPUMEM_SOCKET"] = path
        self.install_torch({0: {"stats": torch_stats(5 << 20)}})
        with self.assertLogs("gpumem", logging.WARNING):
            self.assertTrue(gpumem.start())
            wait_until(lambda: gpumem.client._client.connect_attempts >= 1, what="a connection attempt")
        self.assertTrue(gpumem.client._client.running())
        self.assertEqual(squatter.conns, [])

    def test_python_m_gpumem_says_why(self):
        if not ROOT:
            self.skipTest("needs root to chown")
        path, squatter = self.squat(os.path.join(self.tmp, "shared"), "gpumem/allocstats.sock")
        for args, want_rc in (([], 0), (["--send"], 1)):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = gpumem.__main__.main(["--socket", path] + args)
            self.assertEqual(rc, want_rc, err.getvalue())
            self.assertIn("refused: its directory", err.getvalue())
        self.assertEqual(squatter.conns, [])
