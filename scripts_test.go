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

// scripts/gotest.sh lists every skipped test with its reason at the end
// (or adds them to $GOTEST_SKIPS for make test to list), and prints a
// failing package's failing tests as go test does, without the lines of
// those that passed or skipped.
func TestGotestListsSkippedTestsWithTheirReasons(t *testing.T) {
	script, err := filepath.Abs("scripts/gotest.sh")
	if err != nil {
		t.Fatal(err)
	}
	skips := `  example.invalid/gotest/skips TestNeedsFrobtool: skips_test.go:15: frobtool is not installed; apt-get install frobtool
  example.invalid/gotest/skips TestSkipsWithoutReason: (no reason given)
  example.invalid/gotest/skips TestSub/two: skips_test.go:25: needs root to chown
`
	for _, tc := range []struct {
		name     string
		env      []string
		fails    bool
		has, not []string
	}{
		{"passing", nil, false, []string{"ok\texample.invalid/gotest/skips", "Skipped tests (3), with their reasons:\n" + skips},
			[]string{"=== RUN", "passing test's line"}},
		{"failing", []string{"GOTEST_FIXTURE_FAIL=1"}, true,
			[]string{"printed by the failing test\n    skips_test.go:37: wrong: got 1\n--- FAIL: TestFails", "FAIL\texample.invalid/gotest/skips", "Skipped tests (3)"},
			[]string{"=== RUN", "passing test's line", "passing subtest's line", "looking for frobtool", "--- PASS", "--- SKIP"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(script, "--", "./...")
			cmd.Dir = "testdata/gotest"
			cmd.Env = append(os.Environ(), append(tc.env, "GOTEST_BIN="+t.TempDir(), "GOTEST_SKIPS=", "GOFLAGS=-mod=mod")...)
			out, err := cmd.CombinedOutput()
			if (err != nil) != tc.fails {
				t.Fatalf("err = %v, want failure %v; output:\n%s", err, tc.fails, out)
			}
			for _, w := range tc.has {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not say %q:\n%s", w, out)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(string(out), w) {
					t.Errorf("output says %q:\n%s", w, out)
				}
			}
		})
	}

	// -C DIR runs the packages of the module at DIR too (the repository's
	// deploy/ module), their binaries apart from the first module's, even
	// where two packages share a name.
	for _, tc := range []struct {
		name  string
		env   []string
		fails bool
		has   []string
	}{
		{"two modules", nil, false, []string{"ok\texample.invalid/gotest/skips", "ok\texample.invalid/gotestother/skips",
			"Skipped tests (4), with their reasons:\n", "  example.invalid/gotestother/skips TestNeedsEtcd: skips_test.go:11: etcd is not installed\n"}},
		{"failing in the second module", []string{"GOTEST_FIXTURE_FAIL_OTHER=1"}, true, []string{"ok\texample.invalid/gotest/skips",
			"failed in the other module\n--- FAIL: TestFailsInTheOtherModule", "FAIL\texample.invalid/gotestother/skips"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(script, "--", "./...", "-C", "other", "./...")
			cmd.Dir = "testdata/gotest"
			cmd.Env = append(os.Environ(), append(tc.env, "GOTEST_BIN="+t.TempDir(), "GOTEST_SKIPS=", "GOFLAGS=-mod=mod")...)
			out, err := cmd.CombinedOutput()
			if (err != nil) != tc.fails {
				t.Fatalf("err = %v, want failure %v; output:\n%s", err, tc.fails, out)
			}
			for _, w := range tc.has {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not say %q:\n%s", w, out)
				}
			}
		})
	}

	t.Run("GOTEST_SKIPS", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "skipped")
		cmd := exec.Command(script, "--", "./...")
		cmd.Dir = "testdata/gotest"
		cmd.Env = append(os.Environ(), "GOTEST_BIN="+t.TempDir(), "GOTEST_SKIPS="+file, "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil || strings.Contains(string(out), "Skipped tests") {
			t.Fatalf("err = %v; output (want no list: the caller lists):\n%s", err, out)
		}
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(got), "\n"); n != 3 || !strings.Contains(string(got), "example.invalid/gotest/skips\tTestSub/two\tskips_test.go:25: needs root to chown\n") {
			t.Errorf("%s has %d lines, want the 3 skipped tests as package<TAB>test<TAB>reason:\n%s", file, n, got)
		}
	})
}

// scripts/python_tests.py runs the Python tests as unittest discover does
// and lists the skipped ones with their reasons.
func TestPythonTestsListSkippedTestsWithTheirReasons(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	file := filepath.Join(t.TempDir(), "skipped")
	for _, tc := range []struct {
		skips string
		want  string
	}{
		{"", "Skipped tests (2), with their reasons:\n  python test_skips.Fixture.test_install: pip or venv is not available\n  python test_skips.Fixture.test_needs_root: needs root to chown\n"},
		{file, ""},
	} {
		cmd := exec.Command(python, "scripts/python_tests.py", "testdata/pytests")
		cmd.Env = append(os.Environ(), "GOTEST_SKIPS="+tc.skips, "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.Output() // unittest's own report goes to stderr
		if err != nil {
			t.Fatalf("GOTEST_SKIPS=%q: %v", tc.skips, err)
		}
		if string(out) != tc.want {
			t.Errorf("GOTEST_SKIPS=%q: stdout %q, want %q", tc.skips, out, tc.want)
		}
	}
	got, _ := os.ReadFile(file)
	if want := "python\ttest_skips.Fixture.test_install\tpip or venv is not available\npython\ttest_skips.Fixture.test_needs_root\tneeds root to chown\n"; string(got) != want {
		t.Errorf("GOTEST_SKIPS file %q, want %q", got, want)
	}
}

// Every script under scripts/ has its line in scripts/README.md, which
// says what it does and how to run it.
func TestEveryScriptHasItsLineInTheScriptsREADME(t *testing.T) {
	readme, err := os.ReadFile("scripts/README.md")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir("scripts", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "README.md" || strings.Contains(path, "__pycache__") {
			return err
		}
		rel := strings.TrimPrefix(path, "scripts/")
		if !strings.Contains(string(readme), "`"+rel+"`") {
			t.Errorf("%s has no line in scripts/README.md", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
