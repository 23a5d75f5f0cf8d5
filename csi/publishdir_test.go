package csi

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

func TestParseOwner(t *testing.T) {
	tests := []struct {
		in            string
		uid, gid      int
		ok            bool
		wantErrSubstr string
	}{
		{in: "", ok: false},
		{in: "65532:65532", uid: 65532, gid: 65532, ok: true},
		{in: "0:0", uid: 0, gid: 0, ok: true},
		{in: "65532", wantErrSubstr: "want uid:gid"},
		{in: "nonroot:nonroot", wantErrSubstr: "uid \"nonroot\""},
		{in: "1:-1", wantErrSubstr: "gid \"-1\""},
	}
	for _, tt := range tests {
		uid, gid, ok, err := ParseOwner(tt.in)
		if tt.wantErrSubstr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErrSubstr) {
				t.Errorf("ParseOwner(%q): got error %v, want one saying %q", tt.in, err, tt.wantErrSubstr)
			}
			continue
		}
		if err != nil || uid != tt.uid || gid != tt.gid || ok != tt.ok {
			t.Errorf("ParseOwner(%q) = %d, %d, %v, %v; want %d, %d, %v, nil", tt.in, uid, gid, ok, err, tt.uid, tt.gid, tt.ok)
		}
	}
}

func TestPreparePublishDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "gpumem")
	// Our own ids work for any user; a foreign owner needs root.
	owners := []string{"", strconv.Itoa(os.Getuid()) + ":" + strconv.Itoa(os.Getgid())}
	if os.Getuid() == 0 {
		owners = append(owners, "65532:65532")
	}
	for _, owner := range owners {
		if err := PreparePublishDir(dir, owner); err != nil {
			t.Fatalf("PreparePublishDir(%q): %v", owner, err)
		}
		fi := mustLstat(t, dir)
		if fi.Mode().Perm() != 0o755 || !fi.IsDir() {
			t.Fatalf("publish dir mode %v, want a 0755 directory", fi.Mode())
		}
		if uid := ownerOf(fi); uid != uint32(os.Getuid()) {
			t.Fatalf("publish dir owned by uid %d, want root's (the plugin's, %d)", uid, os.Getuid())
		}
		sock := mustLstat(t, filepath.Join(dir, SocketDir))
		if sock.Mode().Perm() != 0o755 || !sock.IsDir() {
			t.Fatalf("socket dir mode %v, want a 0755 directory", sock.Mode())
		}
		if link, err := os.Readlink(filepath.Join(dir, SocketName)); err != nil || link != filepath.Join(SocketDir, SocketName) {
			t.Fatalf("%s links to %q (%v), want %s/%s", SocketName, link, err, SocketDir, SocketName)
		}
		if owner == "" {
			continue
		}
		uid, gid, _, _ := ParseOwner(owner)
		st := sock.Sys().(*syscall.Stat_t)
		if int(st.Uid) != uid || int(st.Gid) != gid {
			t.Fatalf("socket dir owned by %d:%d, want %s", st.Uid, st.Gid, owner)
		}
	}
	if err := PreparePublishDir(dir, "nobody"); err == nil {
		t.Fatal("PreparePublishDir accepted owner \"nobody\"")
	}
}

// A publish directory that the exporter's uid owned (as every install did
// before the directory became root's) is taken back: what that uid left
// there goes, a link it planted where the socket directory goes is
// replaced, not followed, and the socket is reached through root's link.
func TestPreparePublishDirTakesTheDirectoryBackFromTheExporter(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to chown")
	}
	const exporter = 65532
	base := t.TempDir()
	dir := filepath.Join(base, "gpumem")
	victim := filepath.Join(base, "victim")
	for _, p := range []string{dir, victim} {
		mustMkdir(t, p)
	}
	for name, kind := range map[string]string{"allocstats.sock": "file", "sitecustomize.py": "file", SocketDir: "link"} {
		p := filepath.Join(dir, name)
		if kind == "link" {
			if err := os.Symlink(victim, p); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, []byte("import evil\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, exporter, exporter); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(dir, exporter, exporter); err != nil {
		t.Fatal(err)
	}

	if err := PreparePublishDir(dir, "65532:65532"); err != nil {
		t.Fatal(err)
	}
	if uid := ownerOf(mustLstat(t, dir)); uid != 0 {
		t.Errorf("publish dir owned by uid %d, want root", uid)
	}
	if exists(t, filepath.Join(dir, "sitecustomize.py")) {
		t.Error("a file the exporter's uid left in the publish directory is still there")
	}
	if fi := mustLstat(t, filepath.Join(dir, SocketDir)); !fi.IsDir() || ownerOf(fi) != exporter {
		t.Errorf("socket dir %v owned by %d, want a real directory of uid %d", fi.Mode(), ownerOf(fi), exporter)
	}
	if uid := ownerOf(mustLstat(t, victim)); uid != 0 {
		t.Errorf("the planted link's target was given to uid %d", uid)
	}
	if fi := mustLstat(t, filepath.Join(dir, SocketName)); fi.Mode()&os.ModeSymlink == 0 || ownerOf(fi) != 0 {
		t.Errorf("%s is %v of uid %d, want root's link", SocketName, fi.Mode(), ownerOf(fi))
	}
}

func mustLstat(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

func ownerOf(fi os.FileInfo) uint32 { return fi.Sys().(*syscall.Stat_t).Uid }

// writeClient makes a client tree like the image's /opt/gpumem/clients, its
// files saying version.
func writeClient(t *testing.T, dir, version string) {
	t.Helper()
	files := map[string]string{
		"gpumem/__init__.py":         "VERSION = " + version + "\n",
		"gpumem/client.py":           "# client " + version + "\n",
		"autostart/sitecustomize.py": "# autostart " + version + "\n",
		"gpumem/__pycache__/x.pyc":   "bytecode",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		mustMkdir(t, filepath.Dir(p))
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// tree lists dir's files (relative path -> content, symlinks as "-> dest").
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			out[rel] = "-> " + l
			return err
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			out[rel] = string(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func entriesOf(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func TestInstallClientsCopiesTheTreeReadableByAll(t *testing.T) {
	src, publish := t.TempDir(), t.TempDir()
	writeClient(t, src, "1")
	if err := os.Symlink("../gpumem", filepath.Join(src, "autostart", "gpumem")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "gpumem", "tool.sh"), []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Leftover of an install that was killed half-way.
	mustMkdir(t, filepath.Join(publish, tempClientsPrefix+"123", "gpumem"))

	if err := InstallClients(src, publish); err != nil {
		t.Fatal(err)
	}
	got := tree(t, filepath.Join(publish, ClientsDir))
	want := map[string]string{
		"gpumem/__init__.py":         "VERSION = 1\n",
		"gpumem/client.py":           "# client 1\n",
		"gpumem/tool.sh":             "#!/bin/sh\n",
		"autostart/sitecustomize.py": "# autostart 1\n",
		"autostart/gpumem":           "-> ../gpumem",
	}
	if len(got) != len(want) {
		t.Fatalf("installed %v, want %v (no __pycache__)", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("installed %s = %q, want %q", k, got[k], v)
		}
	}
	modes := map[string]fs.FileMode{
		"":                           0o755 | fs.ModeDir,
		"gpumem":                     0o755 | fs.ModeDir,
		"gpumem/__init__.py":         0o644,
		"gpumem/tool.sh":             0o755,
		"autostart/sitecustomize.py": 0o644,
	}
	for rel, mode := range modes {
		fi, err := os.Stat(filepath.Join(publish, ClientsDir, rel))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s/%s has mode %v, want %v", ClientsDir, rel, fi.Mode(), mode)
		}
	}
	if names := entriesOf(t, publish); len(names) != 1 || names[0] != ClientsDir {
		t.Fatalf("publish dir holds %v, want only %s (stale and temporary copies removed)", names, ClientsDir)
	}
}

// Each install replaces the whole tree in one rename: a pod reading the
// client while it is replaced, from the directory it opened, finds the
// old client or the new one complete, never a part of each.
func TestInstallClientsSwapsWholeTrees(t *testing.T) {
	publish := t.TempDir()
	dst := filepath.Join(publish, ClientsDir)
	srcs := map[string]string{"1": t.TempDir(), "2": t.TempDir()}
	for v, dir := range srcs {
		writeClient(t, dir, v)
	}
	wantTree := func(v string) map[string]string {
		return map[string]string{
			"gpumem/__init__.py":         "VERSION = " + v + "\n",
			"gpumem/client.py":           "# client " + v + "\n",
			"autostart/sitecustomize.py": "# autostart " + v + "\n",
		}
	}
	sameTree := func(got, want map[string]string) bool {
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}
	if err := InstallClients(srcs["1"], publish); err != nil {
		t.Fatal(err)
	}

	// A pod: it opens the client's directory and reads its files from
	// there. A read that fails (the old tree being removed) is retried; a
	// complete read must be one version.
	stop := make(chan struct{})
	mixed := make(chan string, 1)
	var reads atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			root, err := os.OpenRoot(dst)
			if err != nil {
				continue
			}
			got := map[string]string{}
			for name := range wantTree("1") {
				b, err := root.ReadFile(name)
				if err != nil {
					break
				}
				got[name] = string(b)
			}
			root.Close()
			if len(got) < 3 {
				continue
			}
			reads.Add(1)
			if !sameTree(got, wantTree("1")) && !sameTree(got, wantTree("2")) {
				select {
				case mixed <- fmt.Sprint(got):
				default:
				}
			}
		}
	}()
	for i := 0; i < 200; i++ {
		v := []string{"2", "1"}[i%2]
		if err := InstallClients(srcs[v], publish); err != nil {
			t.Fatalf("install %s: %v", v, err)
		}
		if got := tree(t, dst); !sameTree(got, wantTree(v)) {
			t.Fatalf("after installing %s: %v", v, got)
		}
		if names := entriesOf(t, publish); len(names) != 1 {
			t.Fatalf("after installing %s the publish dir holds %v, want only %s", v, names, ClientsDir)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case m := <-mixed:
		t.Fatalf("a reader found parts of two clients: %s", m)
	default:
	}
	if reads.Load() == 0 {
		t.Fatal("the reader never read the client complete")
	}
}

func TestInstallClientsFailureKeepsTheOldClient(t *testing.T) {
	publish, good, bad := t.TempDir(), t.TempDir(), t.TempDir()
	writeClient(t, good, "1")
	if err := InstallClients(good, publish); err != nil {
		t.Fatal(err)
	}
	writeClient(t, bad, "2")
	if err := syscall.Mkfifo(filepath.Join(bad, "gpumem", "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := InstallClients(bad, publish)
	if err == nil || !strings.Contains(err.Error(), "not a file, directory or symlink") {
		t.Fatalf("installing a tree with a fifo: got %v, want an error naming it", err)
	}
	if got := tree(t, filepath.Join(publish, ClientsDir))["gpumem/__init__.py"]; got != "VERSION = 1\n" {
		t.Fatalf("after a failed install the client says %q, want the old one", got)
	}
	if names := entriesOf(t, publish); len(names) != 1 {
		t.Fatalf("a failed install left %v", names)
	}
	if err := InstallClients(filepath.Join(t.TempDir(), "missing"), publish); err == nil {
		t.Fatal("installing from a missing directory succeeded")
	}
}
