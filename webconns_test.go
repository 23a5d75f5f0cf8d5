package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// TestSecurityShedListenerClosesIdleConnectionsFirst: at the cap a new
// connection closes the longest-idle one; a connection serving a request
// is never closed.
func TestSecurityShedListenerClosesIdleConnectionsFirst(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newShedListener(inner, 4)
	release := make(chan struct{})
	srv := &http.Server{ConnState: connState, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		io.WriteString(w, "ok")
	})}
	go srv.Serve(l)
	defer srv.Close()
	addr := inner.Addr().String()
	get := func(path string) error {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + addr + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if string(body) != "ok" {
			return fmt.Errorf("body %q", body)
		}
		return nil
	}
	slow := make(chan error, 1)
	go func() { slow <- get("/slow") }()
	exportertest.Eventually(t, 5*time.Second, "the slow request in progress", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for c := range l.conns {
			if c.busy {
				return true
			}
		}
		return false
	})
	var idle []net.Conn
	for i := 0; i < 50; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	for i := 0; i < 5; i++ {
		if err := get("/"); err != nil {
			t.Fatalf("request %d beside 50 idle connections: %v", i, err)
		}
	}
	close(release)
	if err := <-slow; err != nil {
		t.Errorf("the request in progress was cut: %v", err)
	}
	l.mu.Lock()
	open, shed := len(l.conns), l.shed
	l.mu.Unlock()
	if open > 4 || shed < 40 {
		t.Errorf("%d connections open (cap 4), %d shed", open, shed)
	}
}
