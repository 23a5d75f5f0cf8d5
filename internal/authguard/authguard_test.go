package authguard

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"golang.org/x/crypto/bcrypt"
)

// fakeToolkit stands for exporter-toolkit's basic auth: it accepts user
// with pass (calling the inside handler) and refuses anything else with
// 401. A password in block waits for the channel, as a comparison behind
// the toolkit's mutex does.
type fakeToolkit struct {
	mu         sync.Mutex
	user, pass string
	block      map[string]chan struct{}
	inner      http.Handler
}

func (f *fakeToolkit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user, pass, ok := r.BasicAuth()
	f.mu.Lock()
	wantUser, wantPass, wait := f.user, f.pass, f.block[pass]
	f.mu.Unlock()
	if wait != nil {
		<-wait
	}
	if !ok || user != wantUser || pass != wantPass {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	f.inner.ServeHTTP(w, r)
}

func (f *fakeToolkit) setPassword(p string) {
	f.mu.Lock()
	f.pass = p
	f.mu.Unlock()
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// guarded builds g in front of a fakeToolkit around an OK handler, as
// Protect and the toolkit would.
func guarded(o Options) (*Guard, *fakeToolkit, http.Handler, *clock) {
	c := &clock{t: time.Unix(1e9, 0)}
	o.now = c.now
	g := New(o)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	g.Protect(srv)
	tk := &fakeToolkit{user: "prometheus", pass: "secret", block: map[string]chan struct{}{}, inner: srv.Handler}
	srv.Handler = tk
	g.install(srv)
	return g, tk, srv.Handler, c
}

func request(h http.Handler, source, user, pass string) int {
	r := httptest.NewRequest("GET", "/metrics", nil)
	r.RemoteAddr = source
	if user != "" || pass != "" {
		r.SetBasicAuth(user, pass)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

func TestNewCredentialsAreCheckedOneAtATimeAndNeverQueued(t *testing.T) {
	_, tk, h, _ := guarded(Options{})
	if got := request(h, "10.0.0.1:1", "prometheus", "secret"); got != http.StatusOK {
		t.Fatalf("the right credentials: status %d, want 200", got)
	}
	// A comparison in progress holds the slot.
	release := make(chan struct{})
	tk.block["slow-guess"] = release
	inFlight := make(chan int)
	go func() { inFlight <- request(h, "10.0.0.2:1", "prometheus", "slow-guess") }()
	waitFor(t, func() bool { return len(tkSlot(h)) == 1 })

	tests := []struct {
		name       string
		source     string
		user, pass string
		want       int
	}{
		{"credentials accepted before go on", "10.0.0.1:2", "prometheus", "secret", http.StatusOK},
		{"credentials accepted before go on from the sprayer's host too", "10.0.0.2:2", "prometheus", "secret", http.StatusOK},
		{"a new password is refused at once", "10.0.0.3:1", "prometheus", "guess", http.StatusTooManyRequests},
		{"a new user is refused at once", "10.0.0.3:2", "admin", "guess", http.StatusTooManyRequests},
		{"no credentials go to the toolkit, which needs no comparison", "10.0.0.3:3", "", "", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		if got := request(h, tt.source, tt.user, tt.pass); got != tt.want {
			t.Errorf("%s: status %d, want %d", tt.name, got, tt.want)
		}
	}
	close(release)
	if got := <-inFlight; got != http.StatusUnauthorized {
		t.Errorf("the slow wrong guess: status %d, want 401 from the toolkit", got)
	}
	if got := request(h, "10.0.0.3:4", "prometheus", "guess"); got != http.StatusUnauthorized {
		t.Errorf("a new password once the slot is free: status %d, want 401 from the toolkit", got)
	}
}

// tkSlot reaches the Guard's slot through the front handler.
func tkSlot(h http.Handler) chan struct{} { return h.(*front).g.slot }

func TestEachSourceGetsABurstThenItsRate(t *testing.T) {
	_, _, h, c := guarded(Options{Rate: 1, Burst: 3})
	for i := range 3 {
		if got := request(h, "192.0.2.7:1000", "prometheus", fmt.Sprint("guess", i)); got != http.StatusUnauthorized {
			t.Fatalf("guess %d within the burst: status %d, want 401 from the toolkit", i, got)
		}
	}
	if got := request(h, "192.0.2.7:1001", "prometheus", "guess-3"); got != http.StatusTooManyRequests {
		t.Errorf("a guess past the burst: status %d, want 429", got)
	}
	if got := request(h, "198.51.100.1:1000", "prometheus", "secret"); got != http.StatusOK {
		t.Errorf("another source's new credentials: status %d, want 200", got)
	}
	if got := request(h, "192.0.2.7:1002", "prometheus", "secret"); got != http.StatusOK {
		t.Errorf("credentials accepted before, from the source without tokens: status %d, want 200", got)
	}
	c.add(time.Second)
	if got := request(h, "192.0.2.7:1003", "prometheus", "guess-4"); got != http.StatusUnauthorized {
		t.Errorf("a guess a second later: status %d, want 401 from the toolkit", got)
	}
	if got := request(h, "192.0.2.7:1004", "prometheus", "guess-5"); got != http.StatusTooManyRequests {
		t.Errorf("a second guess in that second: status %d, want 429", got)
	}
}

func TestAnIPv6HostIsOneSourceForItsWhole64(t *testing.T) {
	g := New(Options{})
	same := [][2]string{
		{"[2001:db8:1:2::1]:80", "[2001:db8:1:2:ffff:ffff:ffff:ffff]:443"},
		{"192.0.2.1:1", "192.0.2.1:2"},
	}
	for _, p := range same {
		if g.bucketOf(p[0]) != g.bucketOf(p[1]) {
			t.Errorf("%s and %s are one source, got two buckets", p[0], p[1])
		}
	}
	// Different /64s fall in different buckets unless their hashes meet:
	// of many, most must differ.
	seen := map[int]bool{}
	for i := range 64 {
		seen[g.bucketOf(fmt.Sprintf("[2001:db8:%x::1]:80", i))] = true
	}
	if len(seen) < 32 {
		t.Errorf("64 /64 networks share %d buckets, want them spread", len(seen))
	}
}

func TestASprayNeverEvictsAcceptedCredentials(t *testing.T) {
	g, _, h, c := guarded(Options{})
	if got := request(h, "10.0.0.1:1", "prometheus", "secret"); got != http.StatusOK {
		t.Fatalf("the right credentials: status %d, want 200", got)
	}
	for i := range 2000 {
		request(h, fmt.Sprintf("10.%d.%d.1:1", i/250, i%250), "prometheus", fmt.Sprint("guess", i))
		c.add(time.Millisecond)
	}
	g.slot <- struct{}{} // a comparison in progress
	defer func() { <-g.slot }()
	if got := request(h, "10.0.0.1:2", "prometheus", "secret"); got != http.StatusOK {
		t.Errorf("the right credentials after 2000 wrong ones: status %d, want 200 without a comparison slot", got)
	}
}

func TestCredentialsTheToolkitNoLongerAcceptsAreForgotten(t *testing.T) {
	g, tk, h, _ := guarded(Options{})
	if got := request(h, "10.0.0.1:1", "prometheus", "secret"); got != http.StatusOK {
		t.Fatalf("the right credentials: status %d, want 200", got)
	}
	tk.setPassword("rotated")
	if got := request(h, "10.0.0.1:2", "prometheus", "secret"); got != http.StatusUnauthorized {
		t.Fatalf("the old password after a rotation: status %d, want 401 from the toolkit", got)
	}
	g.slot <- struct{}{}
	defer func() { <-g.slot }()
	if got := request(h, "10.0.0.1:3", "prometheus", "secret"); got != http.StatusTooManyRequests {
		t.Errorf("the old password again while a comparison runs: status %d, want 429 (it is new again)", got)
	}
}

// TestInFrontOfExporterToolkit serves through exporter-toolkit's own basic
// auth: the Guard must be outside it.
func TestInFrontOfExporterToolkit(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "basic_auth_users:\n  prometheus: %s\n", hash), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := New(Options{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	g.Protect(srv)
	done := make(chan error, 1)
	go func() {
		done <- web.ServeMultiple([]net.Listener{l}, srv, &web.FlagConfig{WebConfigFile: &cfg}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { srv.Close(); <-done })
	url := "http://" + l.Addr().String() + "/metrics"
	get := func(user, pass string) int {
		req, _ := http.NewRequest("GET", url, nil)
		req.SetBasicAuth(user, pass)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("prometheus", "wrong"); got != http.StatusUnauthorized {
		t.Errorf("a wrong password: status %d, want 401", got)
	}
	if got := get("prometheus", "secret"); got != http.StatusOK {
		t.Errorf("the right password: status %d, want 200", got)
	}
	g.slot <- struct{}{} // a comparison in progress
	if got := get("prometheus", "guess"); got != http.StatusTooManyRequests {
		t.Errorf("a new password while a comparison runs: status %d, want 429 from the guard in front of the toolkit", got)
	}
	if got := get("prometheus", "secret"); got != http.StatusOK {
		t.Errorf("the accepted password while a comparison runs: status %d, want 200", got)
	}
	<-g.slot
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("condition not reached in 5 s")
}
