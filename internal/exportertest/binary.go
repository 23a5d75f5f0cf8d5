package exportertest

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// cacheKeep is how many built exporters, besides the one in use, stay in
// the cache (other worktrees, the other race mode); older ones go when a
// new one is built, unless a test process is using them.
const cacheKeep = 3

// binaryLocks hold, for the life of this process, a shared lock on the
// cache entry of each binary it runs, so that no other process prunes it;
// built remembers those binaries, so that a second call in the process
// returns at once instead of waiting for the exclusive lock its own
// shared one blocks.
var (
	binaryMu    sync.Mutex
	binaryLocks []*os.File
	builtByKey  = map[string]string{}
)

// Binary returns the path of gpumem_exporter built from the module at
// moduleDir, with -race when race is set. The build is kept in
// os.UserCacheDir()/gpumem_exporter-attack/<key>, where the key hashes
// every file the build reads from the module (the main package's
// dependencies in the module: Go, cgo and embedded files), go.mod and
// go.sum, the Go version and the build flags and environment: a run of the
// tests reuses it until one of them changes. A lock (flock) on the entry
// makes parallel `go test` processes build it once. Call it once per
// process; later calls with the same arguments return the same path.
func Binary(moduleDir string, race bool) (string, error) {
	var flags []string
	if race {
		flags = append(flags, "-race")
	}
	key, err := buildKey(moduleDir, flags)
	if err != nil {
		return "", err
	}
	binaryMu.Lock()
	defer binaryMu.Unlock()
	if bin, ok := builtByKey[key]; ok {
		return bin, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	root := filepath.Join(cache, "gpumem_exporter-attack")
	dir := filepath.Join(root, key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "gpumem_exporter")
	built := false
	// The shared lock on "lock", held for the process's whole run, keeps
	// the entry from being pruned, and shared holders never block each
	// other. A missing binary is built under the exclusive lock of a
	// second file, "build", so that parallel processes build it once.
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH); err != nil {
		lock.Close()
		return "", fmt.Errorf("locking %s: %w", dir, err)
	}
	if _, err := os.Stat(bin); err != nil {
		b, err := build(moduleDir, dir, bin, flags)
		if err != nil {
			lock.Close()
			return "", err
		}
		built = b
	}
	// Mark the entry used (the pruner also spares entries used in the
	// last minute).
	now := time.Now()
	os.Chtimes(dir, now, now)
	binaryLocks = append(binaryLocks, lock)
	builtByKey[key] = bin
	if built {
		prune(root, key)
	}
	return bin, nil
}

// ExporterBinary is the exporter a package's end-to-end tests run: the
// file that the environment variable env names, or else the module at
// moduleDir built by Binary, with -race when race is set. The first
// answer, an error included, is kept: later calls in the process with the
// same arguments return it at once.
func ExporterBinary(env, moduleDir string, race bool) (string, error) {
	q := exporterQuery{env, moduleDir, race}
	exporterMu.Lock()
	defer exporterMu.Unlock()
	if a, ok := exporterAnswers[q]; ok {
		return a.path, a.err
	}
	path := os.Getenv(env)
	var err error
	if path == "" {
		path, err = Binary(moduleDir, race)
	}
	exporterAnswers[q] = exporterAnswer{path, err}
	return path, err
}

// exporterAnswers are ExporterBinary's answers in this process.
var (
	exporterMu      sync.Mutex
	exporterAnswers = map[exporterQuery]exporterAnswer{}
)

type exporterQuery struct {
	env, moduleDir string
	race           bool
}

type exporterAnswer struct {
	path string
	err  error
}

// BuiltWithRace says whether the Go program at path was built with the
// race detector (-race), as its build information records.
func BuiltWithRace(path string) (bool, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("reading the build info of %s: %w", path, err)
	}
	for _, s := range info.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true, nil
		}
	}
	return false, nil
}

// build builds bin under the exclusive lock of dir's "build" file, unless
// another process built it meanwhile; it says whether it built it.
func build(moduleDir, dir, bin string, flags []string) (bool, error) {
	lock, err := os.OpenFile(filepath.Join(dir, "build"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return false, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return false, fmt.Errorf("locking %s for the build: %w", dir, err)
	}
	if _, err := os.Stat(bin); err == nil {
		return false, nil
	}
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	cmd := exec.Command("go", append(append([]string{"build"}, flags...), "-o", tmp, ".")...)
	cmd.Dir = moduleDir
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("go build %s: %v\n%s", strings.Join(flags, " "), err, out)
	}
	return true, os.Rename(tmp, bin)
}

// prune removes the cache entries beyond the cacheKeep most recently used,
// except the one in use by this process and any another process holds.
func prune(root, keep string) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	type entry struct {
		name string
		used time.Time
	}
	var old []entry
	for _, ent := range ents {
		info, err := ent.Info()
		if err != nil || !ent.IsDir() || ent.Name() == keep {
			continue
		}
		old = append(old, entry{ent.Name(), info.ModTime()})
	}
	sort.Slice(old, func(i, j int) bool { return old[i].used.After(old[j].used) })
	for i, ent := range old {
		if i < cacheKeep || time.Since(ent.used) < time.Minute {
			continue
		}
		dir := filepath.Join(root, ent.name)
		lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			continue
		}
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.RemoveAll(dir)
		}
		lock.Close()
	}
}

// buildKey hashes what a build of the module's main package reads.
func buildKey(moduleDir string, flags []string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "flags %q\n", flags)
	goEnv, err := exec.Command("go", "env", "GOVERSION", "GOOS", "GOARCH", "GOAMD64", "GOEXPERIMENT", "GOFLAGS",
		"CGO_ENABLED", "CC", "CGO_CFLAGS", "CGO_CPPFLAGS", "CGO_LDFLAGS").Output()
	if err != nil {
		return "", fmt.Errorf("go env: %w", err)
	}
	fmt.Fprintf(h, "env %s\n", goEnv)
	files := []string{filepath.Join(moduleDir, "go.mod"), filepath.Join(moduleDir, "go.sum")}
	list := exec.Command("go", append(append([]string{"list"}, flags...), "-deps", "-json=Dir,Module,GoFiles,CgoFiles,CFiles,CXXFiles,HFiles,SFiles,SysoFiles,EmbedFiles", ".")...)
	list.Dir = moduleDir
	out, err := list.Output()
	if err != nil {
		return "", fmt.Errorf("go list -deps: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Dir    string
			Module *struct{ Main bool }
			sourceFiles
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("go list -deps: %w", err)
		}
		if p.Module == nil || !p.Module.Main {
			continue // the module cache is keyed by go.sum
		}
		for _, group := range p.groups() {
			for _, f := range group {
				files = append(files, filepath.Join(p.Dir, f))
			}
		}
	}
	sort.Strings(files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(moduleDir, f)
		fmt.Fprintf(h, "file %s %d\n", rel, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// sourceFiles are the files of a package that go build reads (go list's
// names).
type sourceFiles struct {
	GoFiles, CgoFiles, CFiles, CXXFiles, HFiles []string
	SFiles, SysoFiles, EmbedFiles               []string
}

func (s sourceFiles) groups() [][]string {
	return [][]string{s.GoFiles, s.CgoFiles, s.CFiles, s.CXXFiles, s.HFiles, s.SFiles, s.SysoFiles, s.EmbedFiles}
}
