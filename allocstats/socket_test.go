package allocstats

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func newListeningServer(t *testing.T, path string) (*Server, error) {
	t.Helper()
	srv, err := NewServer(Config{SocketPath: path}, NewStore(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = srv.Listen()
	if err == nil {
		t.Cleanup(func() { srv.shutdown() })
	}
	return srv, err
}

func TestListenReplacesAStaleSocket(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "s.sock")
	dead, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	dead.SetUnlinkOnClose(false)
	dead.Close() // a daemon that died: the file stays, nothing answers
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the stale socket file is missing: %v", err)
	}
	if _, err := newListeningServer(t, path); err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the new socket does not answer: %v", err)
	}
	c.Close()
}

func TestListenRefusesWhenAnotherDaemonListens(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "s.sock")
	live, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	_, err = newListeningServer(t, path)
	if err == nil || !strings.Contains(err.Error(), "another daemon is listening on "+path) {
		t.Errorf("Listen on a live socket: err = %v, want another daemon is listening", err)
	}
}

func TestListenNeverRemovesAFileThatIsNotASocket(t *testing.T) {
	path := filepath.Join(shortTempDir(t), "s.sock")
	if err := os.WriteFile(path, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := newListeningServer(t, path); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a regular file: err = %v, want an error", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "keep me" {
		t.Errorf("the regular file was changed: %q, %v", b, err)
	}
}

func TestListenRefusesAnUnusableExplicitPath(t *testing.T) {
	blocker := filepath.Join(shortTempDir(t), "f")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(blocker, "s.sock")
	srv, err := NewServer(Config{SocketPath: path, SocketExplicit: true}, NewStore(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Listen on an explicit unusable path: err = %v, want an error naming %s", err, path)
	}
}

func TestListenCreatesTheDirectory(t *testing.T) {
	dir := filepath.Join(shortTempDir(t), "a", "b")
	if _, err := newListeningServer(t, filepath.Join(dir, "s.sock")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("socket directory: %v, %v; want mode 0755", fi, err)
	}
}

func TestResolveSocketPath(t *testing.T) {
	base := shortTempDir(t)
	blocker := filepath.Join(base, "file") // a regular file: nothing can be created under it
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	unusable := filepath.Join(blocker, "gpumem", "allocstats.sock")
	xdg := filepath.Join(base, "xdg")
	tmp := filepath.Join(base, "tmp")
	uid := os.Getuid()

	t.Run("explicit path in an existing directory is kept", func(t *testing.T) {
		want := filepath.Join(base, "my.sock")
		got, err := resolveSocketPath(true, want, xdg, tmp, uid)
		if err != nil || got != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	})
	t.Run("explicit path in a missing directory is an error, and nothing is created", func(t *testing.T) {
		missing := filepath.Join(base, "typo", "my.sock")
		if got, err := resolveSocketPath(true, missing, xdg, tmp, uid); err == nil || !strings.Contains(err.Error(), "does not exist") {
			t.Errorf("got %q, %v; want an error saying the directory does not exist", got, err)
		}
		if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
			t.Errorf("the directory of an explicit path was created: %v", err)
		}
	})
	t.Run("explicit unusable path is an error", func(t *testing.T) {
		got, err := resolveSocketPath(true, unusable, xdg, tmp, uid)
		if err == nil || !strings.Contains(err.Error(), unusable) {
			t.Errorf("got %q, %v; want an error naming %s", got, err, unusable)
		}
	})
	t.Run("explicit path too long for a socket is an error", func(t *testing.T) {
		long := filepath.Join(base, strings.Repeat("d", 120), "s.sock")
		if _, err := resolveSocketPath(true, long, xdg, tmp, uid); err == nil || !strings.Contains(err.Error(), "longer than") {
			t.Errorf("err = %v, want the path length refused", err)
		}
	})
	t.Run("default falls back to XDG_RUNTIME_DIR", func(t *testing.T) {
		got, err := resolveSocketPath(false, unusable, xdg, tmp, uid)
		if want := filepath.Join(xdg, "gpumem", "allocstats.sock"); err != nil || got != want {
			t.Errorf("got %q, %v; want %q", got, err, want)
		}
	})
	t.Run("default falls back to the temporary directory", func(t *testing.T) {
		for _, x := range []string{"", "relative", blocker} {
			got, err := resolveSocketPath(false, unusable, x, tmp, uid)
			want := filepath.Join(tmp, "gpumem-"+strconv.Itoa(uid), "allocstats.sock")
			if err != nil || got != want {
				t.Errorf("XDG_RUNTIME_DIR=%q: got %q, %v; want %q", x, got, err, want)
			}
		}
	})
	t.Run("fallback directories owned by someone else or writable by others are refused", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			setup func(t *testing.T, dir string)
		}{
			{"owned by another uid", func(t *testing.T, dir string) {
				if os.Getuid() != 0 {
					t.Skip("chown needs root")
				}
				if err := os.Chown(dir, 65534, 65534); err != nil {
					t.Fatal(err)
				}
			}},
			{"group-writable", func(t *testing.T, dir string) {
				if err := os.Chmod(dir, 0o775); err != nil {
					t.Fatal(err)
				}
			}},
			{"a symbolic link", func(t *testing.T, dir string) {
				real := dir + ".real"
				if err := os.Rename(dir, real); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(real, dir); err != nil {
					t.Fatal(err)
				}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				root := shortTempDir(t)
				xdg := filepath.Join(root, "xdg")
				squatted := filepath.Join(xdg, "gpumem")
				if err := os.MkdirAll(squatted, 0o700); err != nil {
					t.Fatal(err)
				}
				tmp := filepath.Join(root, "tmp")
				if err := os.MkdirAll(filepath.Join(tmp, "gpumem-"+strconv.Itoa(uid)), 0o755); err != nil {
					t.Fatal(err)
				}
				tc.setup(t, squatted)
				tc.setup(t, filepath.Join(tmp, "gpumem-"+strconv.Itoa(uid)))
				got, err := resolveSocketPath(false, unusable, xdg, tmp, uid)
				if err == nil {
					t.Fatalf("resolved to %s, in a squatted directory", got)
				}
				if !strings.Contains(err.Error(), filepath.Join(xdg, "gpumem")) {
					t.Errorf("err = %v, want it to name the XDG directory", err)
				}
			})
		}
	})
	t.Run("temporary directory owned by someone else is refused", func(t *testing.T) {
		other := uid + 1 // the directory the test creates belongs to uid
		if _, err := resolveSocketPath(false, unusable, "", tmp, other); err == nil {
			t.Error("a temporary directory owned by another uid was accepted")
		} else if !strings.Contains(err.Error(), "owned by uid") {
			t.Errorf("err = %v, want it to name the ownership", err)
		}
	})
	t.Run("empty path means the default", func(t *testing.T) {
		// Only the fallback is checked: the test must not create /run/gpumem.
		if _, err := os.Stat(filepath.Dir(DefaultSocketPath)); err != nil && os.Getuid() == 0 {
			t.Skip("would create " + filepath.Dir(DefaultSocketPath))
		}
		got, err := resolveSocketPath(true, "", xdg, tmp, uid)
		if err != nil || (got != DefaultSocketPath && !strings.HasPrefix(got, xdg) && !strings.HasPrefix(got, tmp)) {
			t.Errorf("got %q, %v", got, err)
		}
	})
}
