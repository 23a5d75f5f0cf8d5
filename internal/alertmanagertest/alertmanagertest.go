// Package alertmanagertest runs a real Alertmanager for tests, with a
// webhook receiver that records every notification: Debian's
// prometheus-alertmanager (or an alertmanager on PATH), skipped with a
// message where absent, except in CI.
package alertmanagertest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// Binaries are the names Alertmanager's binary goes by: Debian's package
// and the upstream release.
var Binaries = []string{"prometheus-alertmanager", "alertmanager"}

// need returns the path of the first of names on PATH, or skips the test
// (fails it when CI is set).
func need(t testing.TB, what string, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	msg := fmt.Sprintf("%s is not on PATH (Debian: apt-get install prometheus-alertmanager)", strings.Join(names, " or "))
	if os.Getenv("CI") != "" {
		t.Fatalf("%s, and CI is set: the %s test is required there", msg, what)
	}
	t.Skip(msg)
	return ""
}

// Amtool is the path of amtool, or skips the test (fails it in CI).
func Amtool(t testing.TB) string {
	t.Helper()
	return need(t, "amtool", "amtool")
}

// Binary is the path of Alertmanager, or skips the test (fails it in CI).
func Binary(t testing.TB) string {
	t.Helper()
	return need(t, "Alertmanager", Binaries...)
}

// Alertmanager is a running Alertmanager, stopped when the test ends.
type Alertmanager struct {
	URL string // http://host:port
	log *exportertest.SyncBuffer
}

// Start runs Alertmanager with the configuration text config (no
// clustering, its storage in a temporary directory) and waits until it is
// ready.
func Start(t testing.TB, config string) *Alertmanager {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, err := exportertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	am := &Alertmanager{URL: "http://" + addr, log: &exportertest.SyncBuffer{}}
	cmd := exec.Command(bin,
		"--config.file="+cfg,
		"--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--cluster.listen-address=", // no gossip port: tests run side by side
		"--log.level=debug",
	)
	cmd.Stdout, cmd.Stderr = am.log, am.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("alertmanager log:\n%s", am.log.String())
		}
	})
	ready := exportertest.Within(20*time.Second, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		resp, err := http.Get(am.URL + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	select {
	case <-done:
		t.Fatalf("alertmanager exited at start:\n%s", am.log.String())
	default:
	}
	if !ready {
		t.Fatalf("alertmanager not ready within 20 s:\n%s", am.log.String())
	}
	return am
}

// Log is Alertmanager's output so far.
func (a *Alertmanager) Log() string { return a.log.String() }

// PostedAlert is an alert as Prometheus posts it to /api/v2/alerts.
type PostedAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
	StartsAt    time.Time         `json:"startsAt,omitempty"`
	EndsAt      time.Time         `json:"endsAt,omitempty"`
}

// Post sends alerts as Prometheus does.
func (a *Alertmanager) Post(t testing.TB, alerts ...PostedAlert) {
	t.Helper()
	body, err := json.Marshal(alerts)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(a.URL+"/api/v2/alerts", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /api/v2/alerts: %d %s", resp.StatusCode, b)
	}
}

// AlertState is an alert as /api/v2/alerts lists it: its labels and
// whether it is active, suppressed (inhibited or silenced) or unprocessed.
type AlertState struct {
	Labels map[string]string `json:"labels"`
	Status struct {
		State       string   `json:"state"`
		InhibitedBy []string `json:"inhibitedBy"`
		SilencedBy  []string `json:"silencedBy"`
	} `json:"status"`
}

// Alerts lists the alerts Alertmanager holds.
func (a *Alertmanager) Alerts(t testing.TB) []AlertState {
	t.Helper()
	resp, err := http.Get(a.URL + "/api/v2/alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []AlertState
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("decoding /api/v2/alerts: %v", err)
	}
	return out
}

// Notification is the body of one webhook notification (Alertmanager's
// webhook format, version 4).
type Notification struct {
	Receiver          string            `json:"receiver"`
	Status            string            `json:"status"` // firing or resolved
	GroupLabels       map[string]string `json:"groupLabels"`
	CommonLabels      map[string]string `json:"commonLabels"`
	CommonAnnotations map[string]string `json:"commonAnnotations"`
	GroupKey          string            `json:"groupKey"`
	Alerts            []struct {
		Status      string            `json:"status"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
		StartsAt    time.Time         `json:"startsAt"`
		EndsAt      time.Time         `json:"endsAt"`
	} `json:"alerts"`
	Received time.Time `json:"-"` // when the receiver got it
	Path     string    `json:"-"` // the URL path it was posted to
}

// Webhook is a webhook receiver that records every notification.
type Webhook struct {
	URL string // the base URL; any path under it is accepted

	mu    sync.Mutex
	notes []Notification
}

// NewWebhook starts a receiver, closed when the test ends.
func NewWebhook(t testing.TB) *Webhook {
	t.Helper()
	w := &Webhook{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var n Notification
		if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		n.Received, n.Path = time.Now(), r.URL.Path
		w.mu.Lock()
		w.notes = append(w.notes, n)
		w.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	w.URL = srv.URL
	return w
}

// Notifications returns every notification received so far, in order.
func (w *Webhook) Notifications() []Notification {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Notification(nil), w.notes...)
}
