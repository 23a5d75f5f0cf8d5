//go:build linux

package csi

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountsAt lists this process's mountinfo entries at path p (after symlinks).
func mountsAt(t *testing.T, p string) []mountEntry {
	t.Helper()
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries, err := parseMountInfo(f)
	if err != nil {
		t.Fatal(err)
	}
	var at []mountEntry
	for _, e := range entries {
		if e.mountPoint == p {
			at = append(at, e)
		}
	}
	return at
}

// mountOptions returns the per-mount options of the topmost mount at p.
func mountOptions(t *testing.T, p string) []string {
	t.Helper()
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var opts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 5 && unescapeMountPath(fields[4]) == p {
			opts = strings.Split(fields[5], ",")
		}
	}
	return opts
}

// cleanupMounts unmounts whatever a failed test left at targets, so that
// t.TempDir's removal does not walk into a bind of the publish directory.
func cleanupMounts(t *testing.T, targets ...string) {
	t.Cleanup(func() {
		for _, target := range targets {
			for i := 0; i < maxStackedMounts && len(mountsAt(t, target)) > 0; i++ {
				_ = unix.Unmount(target, unix.MNT_DETACH)
			}
		}
	})
}

func TestRealPublishIsReadOnlyAndUnpublishLeavesNothing(t *testing.T) {
	requireMount(t)
	d, publishDir, targets := newTestDriver(t, NewMounter())
	ctx := context.Background()
	target := filepath.Join(targets, "uid", "volumes", "kubernetes.io~csi", "gpumem", "mount")
	cleanupMounts(t, target)
	// A socket path must fit in 108 bytes: a pod dials /run/gpumem/..., the
	// test dials through a short link to the target.
	short := shortDir(t)
	if err := os.Symlink(target, filepath.Join(short, "m")); err != nil {
		t.Fatal(err)
	}

	// The exporter's socket, served from the publish directory.
	l, err := net.Listen("unix", filepath.Join(publishDir, "allocstats.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()

	for i := 0; i < 2; i++ {
		if _, err := d.NodePublishVolume(ctx, kubeletPublish(target)); err != nil {
			t.Fatalf("publish #%d: %v", i+1, err)
		}
	}
	if n := len(mountsAt(t, target)); n != 1 {
		t.Fatalf("two publishes left %d mounts at the target, want 1", n)
	}
	opts := strings.Join(mountOptions(t, target), ",")
	for _, want := range []string{"ro", "nosuid", "nodev", "noexec"} {
		if !strings.Contains(","+opts+",", ","+want+",") {
			t.Errorf("target mounted with %q, want %s among them", opts, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(target, "marker")); err != nil || string(b) != "published\n" {
		t.Fatalf("reading the publish directory through the target: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(target, "pod-wrote-this"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("writing under the target: got %v, want EROFS", err)
	}
	if err := os.Mkdir(filepath.Join(target, "dir"), 0o755); !errors.Is(err, unix.EROFS) {
		t.Fatalf("mkdir under the target: got %v, want EROFS", err)
	}
	// A read-only mount still lets a client connect to the socket.
	c, err := net.Dial("unix", filepath.Join(short, "m", "allocstats.sock"))
	if err != nil {
		t.Fatalf("connecting to the socket through the read-only mount: %v", err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("the exporter's side did not accept: %v", err)
	}

	for i := 0; i < 2; i++ {
		if _, err := d.NodeUnpublishVolume(ctx, unpublishReq(target)); err != nil {
			t.Fatalf("unpublish #%d: %v", i+1, err)
		}
	}
	if n := len(mountsAt(t, target)); n != 0 {
		t.Fatalf("unpublish left %d mounts at the target", n)
	}
	if exists(t, target) {
		t.Fatalf("unpublish left the target directory")
	}
	if b, err := os.ReadFile(filepath.Join(publishDir, "marker")); err != nil || string(b) != "published\n" {
		t.Fatalf("the publish directory changed: %q, %v", b, err)
	}
}

func TestRealPublishAfterRestart(t *testing.T) {
	requireMount(t)
	d, publishDir, targets := newTestDriver(t, NewMounter())
	ctx := context.Background()
	before := filepath.Join(targets, "before", "mount")
	after := filepath.Join(targets, "after", "mount")
	cleanupMounts(t, before, after)
	if _, err := d.NodePublishVolume(ctx, kubeletPublish(before)); err != nil {
		t.Fatal(err)
	}

	restarted := restartDriver(t, NewMounter(), publishDir)
	for _, target := range []string{before, after} {
		if _, err := restarted.NodePublishVolume(ctx, kubeletPublish(target)); err != nil {
			t.Fatalf("publish %s after restart: %v", target, err)
		}
		if n := len(mountsAt(t, target)); n != 1 {
			t.Fatalf("%s holds %d mounts after restart, want 1", target, n)
		}
		if _, err := os.Stat(filepath.Join(target, "marker")); err != nil {
			t.Fatalf("publish dir not visible at %s: %v", target, err)
		}
	}
	for _, target := range []string{before, after} {
		if _, err := restarted.NodeUnpublishVolume(ctx, unpublishReq(target)); err != nil {
			t.Fatalf("unpublish %s after restart: %v", target, err)
		}
		if len(mountsAt(t, target)) != 0 || exists(t, target) {
			t.Fatalf("unpublish after restart left %s behind", target)
		}
	}
}

// A plugin killed between the bind and the remount leaves a writable bind;
// the next publish makes it one read-only mount.
func TestRealPublishRepairsAWritableBind(t *testing.T) {
	requireMount(t)
	d, publishDir, targets := newTestDriver(t, NewMounter())
	target := filepath.Join(targets, "mount")
	mustMkdir(t, target)
	cleanupMounts(t, target)
	if err := unix.Mount(publishDir, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if st, _ := NewMounter().Check(target, publishDir); !st.Mounted || !st.OfSource || st.ReadOnly {
		t.Fatalf("Check of a writable bind = %+v, want mounted, of source, not read-only", st)
	}
	if _, err := d.NodePublishVolume(context.Background(), kubeletPublish(target)); err != nil {
		t.Fatal(err)
	}
	if n := len(mountsAt(t, target)); n != 1 {
		t.Fatalf("%d mounts at the target, want 1", n)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("writing under the repaired target: got %v, want EROFS", err)
	}
}

func TestRealCheckTellsSourcesApart(t *testing.T) {
	requireMount(t)
	m := NewMounter()
	dir := t.TempDir()
	src, other, target := filepath.Join(dir, "src"), filepath.Join(dir, "other"), filepath.Join(dir, "target")
	for _, p := range []string{src, other, target} {
		mustMkdir(t, p)
	}
	cleanupMounts(t, target)
	if st, err := m.Check(target, src); err != nil || st.Mounted {
		t.Fatalf("Check before mounting = %+v, %v; want not mounted", st, err)
	}
	if st, err := m.Check(filepath.Join(dir, "missing"), src); err != nil || st.Mounted {
		t.Fatalf("Check of a missing target = %+v, %v; want not mounted, no error", st, err)
	}
	if err := m.BindReadOnly(other, target); err != nil {
		t.Fatal(err)
	}
	if st, err := m.Check(target, src); err != nil || !st.Mounted || st.OfSource || !st.ReadOnly {
		t.Fatalf("Check of a bind of another directory = %+v, %v; want mounted, read-only, not of source", st, err)
	}
	if err := m.Unmount(target); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(target); err == nil {
		t.Fatal("unmounting a target that is not mounted succeeded")
	}
}

// What a pod runs: the client imports from the read-only mount.
func TestRealPublishedClientImports(t *testing.T) {
	requireMount(t)
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found: skipping the import check")
	}
	client := filepath.Join("..", "clients", "python")
	for _, sub := range []string{"gpumem", "autostart"} {
		if _, err := os.Stat(filepath.Join(client, sub)); err != nil {
			t.Fatalf("the repository's client: %v", err)
		}
	}
	d, publishDir, targets := newTestDriver(t, NewMounter())
	// The image holds gpumem/ and autostart/ side by side, as here.
	staged := t.TempDir()
	for _, sub := range []string{"gpumem", "autostart"} {
		if err := copyTree(filepath.Join(client, sub), mkdirIn(t, staged, sub)); err != nil {
			t.Fatal(err)
		}
	}
	if err := InstallClients(staged, publishDir); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(targets, "mount")
	cleanupMounts(t, target)
	if _, err := d.NodePublishVolume(context.Background(), kubeletPublish(target)); err != nil {
		t.Fatal(err)
	}
	defer d.NodeUnpublishVolume(context.Background(), unpublishReq(target))

	cmd := exec.Command(python, "-c", "import gpumem, sitecustomize; print(gpumem.__file__); print(sitecustomize.__file__)")
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+filepath.Join(target, ClientsDir, "autostart")+":"+filepath.Join(target, ClientsDir),
		"PYTHONDONTWRITEBYTECODE=1", "GPUMEM_DISABLE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 importing the published client: %v\n%s", err, out)
	}
	for _, want := range []string{filepath.Join(target, ClientsDir, "gpumem", "__init__.py"), filepath.Join(target, ClientsDir, "autostart", "sitecustomize.py")} {
		if !strings.Contains(string(out), want) {
			t.Errorf("python3 did not import %s from the mount:\n%s", want, out)
		}
	}
}

func mkdirIn(t *testing.T, parent, name string) string {
	t.Helper()
	p := filepath.Join(parent, name)
	mustMkdir(t, p)
	return p
}

// shortDir is a temporary directory with a short path (for socket paths).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gcsi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
