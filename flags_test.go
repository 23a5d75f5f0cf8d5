package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"

	"github.com/gpumem/gpumem_exporter/allocstats"
)

// Every bad value is an error that names its flag (and, for a web
// configuration file, the file) and says what to do, from parseFlags:
// before anything is created or listens.
func TestParseFlagsErrorsNameTheFlagAndWhatToDo(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badYAML := write("bad-yaml.yml", "basic_auth_users:\n  alice: x\n bob\n")
	shortHash := write("short-hash.yml", "basic_auth_users:\n  alice: notabcrypthash\n")
	unknownKey := write("unknown-key.yml", "tls_server_confg: {}\n")
	missingCert := write("missing-cert.yml", "tls_server_config:\n  cert_file: nowhere.crt\n  key_file: nowhere.key\n")
	for _, tc := range []struct {
		arg  string
		want []string // all in the error
	}{
		{"--nvml.backend=simulatd", []string{"--nvml.backend", "nvml, simulated", `"simulatd"`}},
		{"--log.level=verbose", []string{"--log.level", "debug, info, warn, error", `"verbose"`}},
		{"--log.format=text", []string{"--log.format", "logfmt, json"}},
		{"--nvml.simulated.scenario=leaky", []string{"--nvml.simulated.scenario", "mix", `"leaky"`}},
		{"--nvml.simulated.speed=fast", []string{"--nvml.simulated.speed", `"fast"`}},
		{"--nvml.simulated.seed=one", []string{"--nvml.simulated.seed", `"one"`}},
		{"--web.config.file=" + badYAML, []string{"--web.config.file=" + badYAML, "yaml", "fix the file", "web-configuration.md"}},
		{"--web.config.file=" + shortHash, []string{"--web.config.file=" + shortHash, "bcrypt", "fix the file"}},
		{"--web.config.file=" + unknownKey, []string{"--web.config.file=" + unknownKey, "tls_server_confg"}},
		{"--web.config.file=" + missingCert, []string{"--web.config.file=" + missingCert, "nowhere.crt"}},
		{"--web.config.file=" + filepath.Join(dir, "absent.yml"), []string{"--web.config.file=" + filepath.Join(dir, "absent.yml"), "no such file"}},
	} {
		t.Run(tc.arg, func(t *testing.T) {
			_, err := parseFlags(kingpin.New("test", ""), []string{tc.arg})
			if err == nil {
				t.Fatalf("%s: parsed without an error", tc.arg)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not say %q", tc.arg, err, w)
				}
			}
		})
	}
}

// Good values of the flags whose parsing is ours parse to what they say.
func TestParseFlagsGoodValues(t *testing.T) {
	webConfig := filepath.Join(t.TempDir(), "web.yml")
	// bcrypt of "secret", cost 4.
	if err := os.WriteFile(webConfig, []byte("basic_auth_users:\n  alice: $2a$04$YxEOWHqyw.apnX7WLrbfy.K37lvIPr/CSGhMOTQKcFN3ADy6xYs8O\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags(kingpin.New("test", ""), []string{"--nvml.backend=simulated", "--log.level=debug", "--log.format=json",
		"--nvml.simulated.scenario=leak", "--nvml.simulated.speed=60", "--nvml.simulated.seed=-7", "--web.config.file=" + webConfig})
	if err != nil {
		t.Fatal(err)
	}
	if o.nvmlBackend != "simulated" || o.logLevel != "debug" || o.logFormat != "json" || o.simScenario != "leak" || o.simSpeed != 60 || o.simSeed != -7 {
		t.Errorf("parsed %+v", o)
	}
	o, err = parseFlags(kingpin.New("test", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.nvmlBackend != "nvml" || o.logLevel != "info" || o.logFormat != "logfmt" || o.simScenario != "mix" || o.simSpeed != 1 || o.simSeed != 1 {
		t.Errorf("defaults %+v", o)
	}
}

// An allocator socket that cannot be used fails at start-up naming the flag
// and what to do, before anything listens.
func TestSocketErrorsNameTheFlag(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing", "a.sock")
	o, err := parseFlags(kingpin.New("test", ""), []string{"--allocstats.socket=" + missing})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := socketServer(o, allocstats.NewStore(time.Minute), nil, log.NewNopLogger())
	if err == nil {
		srv.Close()
		t.Fatalf("--allocstats.socket=%s: the server listened", missing)
	}
	for _, want := range []string{"--allocstats.socket=" + missing, "does not exist", "make that directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// Events on pods are on by default and off with --no-kubernetes.oom-events
// (kubeevents.Start then starts nothing).
func TestOOMEventsAreOnByDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--no-kubernetes.oom-events"}, false},
	} {
		o, err := parseFlags(kingpin.New("test", ""), tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if o.oomEvents != tc.want {
			t.Errorf("%v: oom events %v, want %v", tc.args, o.oomEvents, tc.want)
		}
	}
}
