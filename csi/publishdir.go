package csi

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpumem/gpumem_exporter/allocstats/wire"
)

// ClientsDir is the publish directory's subdirectory holding the Python
// client: pods see <mount>/python/gpumem and <mount>/python/autostart.
const ClientsDir = "python"

// tempClientsPrefix names the directories InstallClients builds before the
// rename; leftovers of an interrupted run are removed at the next.
const tempClientsPrefix = ".python-"

// SocketDir is the publish directory's subdirectory where the exporter
// creates its socket: the only part of the publish directory that is not
// root's. The exporter container mounts it (and nothing else of the
// publish directory) where it creates allocstats.sock.
const SocketDir = "socket"

// SocketName is the exporter's socket in SocketDir. The publish directory
// holds a root-owned link of that name to it, so that pods find the socket
// at <mount>/allocstats.sock, where the clients look.
const SocketName = wire.SocketName

// ParseOwner parses "uid:gid". An empty string means "leave ownership
// alone" and returns ok false.
func ParseOwner(s string) (uid, gid int, ok bool, err error) {
	if s == "" {
		return 0, 0, false, nil
	}
	u, g, found := strings.Cut(s, ":")
	if !found {
		return 0, 0, false, fmt.Errorf("owner %q: want uid:gid (numbers)", s)
	}
	uid, err = strconv.Atoi(u)
	if err != nil || uid < 0 {
		return 0, 0, false, fmt.Errorf("owner %q: uid %q is not a non-negative number", s, u)
	}
	gid, err = strconv.Atoi(g)
	if err != nil || gid < 0 {
		return 0, 0, false, fmt.Errorf("owner %q: gid %q is not a non-negative number", s, g)
	}
	return uid, gid, true, nil
}

// PreparePublishDir makes dir what every pod imports from and no one but
// root may change: a real directory owned by root, mode 0755, holding the
// socket directory SocketDir (given to owner, "uid:gid", when owner is not
// empty, so that the exporter container, running as that user, can create
// its socket there) and a root-owned link SocketName to the socket in it.
// Anything else in dir that is not root's (left by an exporter that owned
// the directory before) is removed; so is a SocketDir that is not a real
// directory. Without root (tests) ownership is left as it is.
func PreparePublishDir(dir, owner string) error {
	uid, gid, chown, err := ParseOwner(owner)
	if err != nil {
		return err
	}
	root := os.Geteuid() == 0
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating publish directory: %w", err)
	}
	if fi, err := os.Lstat(dir); err != nil {
		return fmt.Errorf("publish directory: %w", err)
	} else if !fi.IsDir() {
		return fmt.Errorf("publish directory %s is %s, not a directory", dir, fi.Mode().Type())
	}
	if root {
		if err := os.Lchown(dir, 0, 0); err != nil {
			return fmt.Errorf("giving the publish directory to root: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("setting the publish directory's mode: %w", err)
	}
	if err := removeForeign(dir, root); err != nil {
		return err
	}
	sock := filepath.Join(dir, SocketDir)
	if err := os.Mkdir(sock, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating the socket directory: %w", err)
	}
	if chown {
		if err := os.Lchown(sock, uid, gid); err != nil {
			return fmt.Errorf("setting the socket directory's owner: %w", err)
		}
	}
	if err := os.Chmod(sock, 0o755); err != nil {
		return fmt.Errorf("setting the socket directory's mode: %w", err)
	}
	return linkSocket(dir)
}

// removeForeign removes from the publish directory what is not root's
// (when running as root) and a SocketDir that is not a real directory.
func removeForeign(dir string, root bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading the publish directory: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("publish directory: %w", err)
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		keep := e.Name() == SocketDir && fi.IsDir() ||
			e.Name() != SocketDir && (!root || st == nil || st.Uid == 0)
		if keep {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("removing %s, which is not root's, from the publish directory: %w", p, err)
		}
	}
	return nil
}

// linkSocket makes <dir>/SocketName a link to SocketDir/SocketName,
// replacing whatever stands there in one rename.
func linkSocket(dir string) error {
	want := filepath.Join(SocketDir, SocketName)
	p := filepath.Join(dir, SocketName)
	if got, err := os.Readlink(p); err == nil && got == want {
		return nil
	}
	tmp := p + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(want, tmp); err != nil {
		return fmt.Errorf("linking the socket: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("linking the socket: %w", err)
	}
	return nil
}

// InstallClients copies the tree src (the client image's gpumem/ and
// autostart/) to <publishDir>/python. The copy is built in a temporary
// directory beside it and then swapped in by one rename, so a pod sees the
// old client or the new one, never a part of either. Files become 0644
// (0755 where executable) and directories 0755, readable by any pod user;
// __pycache__ directories are skipped.
func InstallClients(src, publishDir string) error {
	if err := removeStaleTemps(publishDir); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(publishDir, tempClientsPrefix)
	if err != nil {
		return fmt.Errorf("creating a temporary client directory: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("setting the client directory's mode: %w", err)
	}
	if err := copyTree(src, tmp); err != nil {
		return fmt.Errorf("copying the client from %s: %w", src, err)
	}
	dst := filepath.Join(publishDir, ClientsDir)
	if err := swapInto(tmp, dst); err != nil {
		return fmt.Errorf("installing the client at %s: %w", dst, err)
	}
	ok = true
	return nil
}

// swapInto puts the directory tmp at dst, atomically where the kernel can.
// tmp is gone afterwards (it may have held the old dst).
func swapInto(tmp, dst string) error {
	err := os.Rename(tmp, dst)
	if err == nil {
		return nil
	}
	if _, serr := os.Lstat(dst); serr != nil {
		return err // dst missing: the rename failed for another reason
	}
	// dst exists, and rename(2) does not replace a non-empty directory:
	// exchange the two, then drop the old one.
	if err := exchange(tmp, dst); err == nil {
		return os.RemoveAll(tmp)
	}
	// No exchange on this filesystem: move the old one aside first (a
	// moment without a client, never a half one).
	old := tmp + ".old"
	if err := os.Rename(dst, old); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Rename(old, dst)
		return err
	}
	return os.RemoveAll(old)
}

func removeStaleTemps(publishDir string) error {
	entries, err := os.ReadDir(publishDir)
	if err != nil {
		return fmt.Errorf("reading the publish directory: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempClientsPrefix) {
			if err := os.RemoveAll(filepath.Join(publishDir, e.Name())); err != nil {
				return fmt.Errorf("removing a stale client copy: %w", err)
			}
		}
	}
	return nil
}

// copyTree copies the contents of src into the existing directory dst:
// directories, regular files and symlinks (as links); anything else is an
// error.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel == "." {
			if !d.IsDir() {
				return fmt.Errorf("%s is not a directory", src)
			}
			return nil
		}
		out := filepath.Join(dst, rel)
		switch t := d.Type(); {
		case t.IsDir():
			if d.Name() == "__pycache__" {
				return filepath.SkipDir
			}
			if err := os.Mkdir(out, 0o755); err != nil {
				return err
			}
			return os.Chmod(out, 0o755) // past the umask
		case t&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, out)
		case t.IsRegular():
			return copyFile(p, out)
		default:
			return fmt.Errorf("%s: not a file, directory or symlink (%s)", p, t)
		}
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	mode := fs.FileMode(0o644)
	if fi.Mode()&0o111 != 0 {
		mode = 0o755
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil { // past the umask
		out.Close()
		return err
	}
	return out.Close()
}
