package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeGo is a go command that fails when run: a script that must not build
// anything gets it first on PATH.
func fakeGo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go"), []byte("#!/bin/sh\necho 'go was run' >&2\nexit 99\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func executable(t *testing.T, path string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// scripts/kube-apiserver.sh builds nothing when it has a kube-apiserver:
// $KUBE_APISERVER, or one built before on this machine, in a cache outside
// the clone keyed by version. It prints the path alone on stdout.
func TestKubeAPIServerScriptReusesABuiltBinary(t *testing.T) {
	cache := t.TempDir()
	built := executable(t, filepath.Join(cache, "gpumem_exporter", "kube-apiserver", "v1.37.2", "kube-apiserver"))
	home := t.TempDir()
	inHome := executable(t, filepath.Join(home, ".cache", "gpumem_exporter", "kube-apiserver", "v1.37.2", "kube-apiserver"))
	other := executable(t, filepath.Join(t.TempDir(), "my-kube-apiserver"))
	notExec := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(notExec, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		env      []string
		want     string // stdout; empty: the script fails
		stderr   string
		exitCode int
	}{
		{"built before, in XDG_CACHE_HOME", []string{"XDG_CACHE_HOME=" + cache}, built, "built before", 0},
		{"built before, in HOME/.cache", []string{"HOME=" + home, "XDG_CACHE_HOME="}, inHome, "built before", 0},
		{"GPUMEM_CACHE", []string{"GPUMEM_CACHE=" + filepath.Join(cache, "gpumem_exporter")}, built, "built before", 0},
		{"KUBE_APISERVER first", []string{"XDG_CACHE_HOME=" + cache, "KUBE_APISERVER=" + other}, other, "using $KUBE_APISERVER", 0},
		{"KUBE_APISERVER not executable", []string{"KUBE_APISERVER=" + notExec}, "", "is not an executable file", 2},
		// The fake go fails with 99: the script went on to build.
		{"another version is built anew", []string{"XDG_CACHE_HOME=" + cache, "KUBE_APISERVER_VERSION=v1.36.0"}, "", "go was run", 99},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append(os.Environ(), "PATH="+fakeGo(t)+":"+os.Getenv("PATH"), "KUBE_APISERVER=", "GPUMEM_CACHE=", "TMPDIR="+t.TempDir())
			env = append(env, tc.env...)
			cmd := exec.Command("scripts/kube-apiserver.sh")
			cmd.Env = env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			code := 0
			if e, ok := err.(*exec.ExitError); ok {
				code = e.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.exitCode || strings.TrimSpace(string(out)) != tc.want || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit %d, stdout %q, stderr with %q", code, out, stderr.String(), tc.exitCode, tc.want, tc.stderr)
			}
		})
	}
}

// Building one, the script says what it builds and how far it has come,
// and leaves the binary in the cache, where the next run finds it.
func TestKubeAPIServerScriptBuildsIntoTheCacheWithProgress(t *testing.T) {
	dir := t.TempDir()
	gomod := filepath.Join(dir, "kubernetes.mod")
	if err := os.WriteFile(gomod, []byte("module k8s.io/kubernetes\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A go command that resolves nothing and compiles three packages, a
	// second apart.
	fake := `#!/bin/bash
case "$1 $2" in
"mod download") printf '{\n\t"GoMod": "%s",\n}\n' "$FAKE_GOMOD" ;;
"list -deps") printf 'a\nb\nc\n' ;;
"build -v")
  while [ "$1" != -o ]; do shift; done
  for p in a b c; do echo "$p" >&2; sleep 1.1; done
  echo "#!/bin/sh" >"$2"; chmod +x "$2" ;;
esac
`
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	run := func() (string, string) {
		cmd := exec.Command("scripts/kube-apiserver.sh")
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "KUBE_APISERVER=", "GPUMEM_CACHE=", "XDG_CACHE_HOME="+cache,
			"TMPDIR="+t.TempDir(), "FAKE_GOMOD="+gomod, "KUBE_APISERVER_PROGRESS_SECONDS=1")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v; stderr:\n%s", err, stderr.String())
		}
		return strings.TrimSpace(string(out)), stderr.String()
	}
	want := filepath.Join(cache, "gpumem_exporter", "kube-apiserver", "v1.37.2", "kube-apiserver")
	path, log := run()
	if path != want {
		t.Errorf("stdout %q, want %q", path, want)
	}
	for _, w := range []string{"building kube-apiserver v1.37.2 into " + filepath.Dir(want) + ": 3 packages", "compiled 2 of at most 3 packages", "built " + want} {
		if !strings.Contains(log, w) {
			t.Errorf("stderr does not say %q:\n%s", w, log)
		}
	}
	if path, log := run(); path != want || !strings.Contains(log, "built before") {
		t.Errorf("second run: stdout %q, stderr %q; want the same binary, built before", path, log)
	}
}
