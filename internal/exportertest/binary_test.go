package exportertest

import (
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"
)

func TestBuildKeyDependsOnTheFlags(t *testing.T) {
	t.Parallel()
	plain, err := buildKey("../..", nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := buildKey("../..", nil)
	if err != nil {
		t.Fatal(err)
	}
	race, err := buildKey("../..", []string{"-race"})
	if err != nil {
		t.Fatal(err)
	}
	if plain != again || plain == race {
		t.Errorf("keys %s, %s (again) and %s (-race): want the same tree and flags to give the same key, other flags another", plain, again, race)
	}
}

// Pruning keeps the entry in use, the most recently used others, entries
// used in the last minute and entries another process holds a lock on.
func TestPruneSparesWhatIsInUse(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	now := time.Now()
	for name, age := range map[string]time.Duration{
		"mine": 3 * time.Hour,
		"f1":   5 * time.Second, "f2": 10 * time.Second, "f3": 20 * time.Second, "f4": 30 * time.Second,
		"old": time.Hour, "held": 2 * time.Hour,
	} {
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(dir, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	lock, err := os.Create(filepath.Join(root, "held", "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	prune(root, "mine")
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	sort.Strings(left)
	if got, want := filepath.Join(left...), filepath.Join("f1", "f2", "f3", "f4", "held", "mine"); got != want {
		t.Errorf("entries left %v, want %s", left, want)
	}
}

// The variable's binary is used without a build, and the first answer
// stays for the process although the variable changes.
func TestExporterBinaryTakesTheVariableAndKeepsItsAnswer(t *testing.T) {
	const env = "GPUMEM_EXPORTERTEST_BINARY"
	t.Setenv(env, "/opt/gpumem_exporter")
	got, err := ExporterBinary(env, "/nonexistent", false)
	if err != nil || got != "/opt/gpumem_exporter" {
		t.Fatalf("ExporterBinary = %q, %v; want the variable's path and no build", got, err)
	}
	t.Setenv(env, "/elsewhere")
	if again, _ := ExporterBinary(env, "/nonexistent", false); again != got {
		t.Errorf("a second call = %q, want the first answer %q", again, got)
	}
}

func TestBuiltWithRaceReadsTheBuildInfo(t *testing.T) {
	t.Parallel()
	race, err := BuiltWithRace(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if race != RaceEnabled {
		t.Errorf("BuiltWithRace(this test binary) = %v, want %v", race, RaceEnabled)
	}
	if _, err := BuiltWithRace(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("BuiltWithRace of a missing file gave no error")
	}
}
