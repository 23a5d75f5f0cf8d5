package connshed

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem_exporter/internal/exportertest"
)

// server serves on a Listener capped at max, with Configure's hooks; auth,
// when set, stands outside them as exporter-toolkit's basic auth does.
// /slow waits for release.
func server(t *testing.T, max int, auth bool, release <-chan struct{}) *Listener {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(inner, max)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		io.WriteString(w, "ok")
	})}
	Configure(srv)
	if auth {
		next := srv.Handler
		srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "prometheus" || p != "secret" {
				http.Error(w, "Unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l
}

func get(client *http.Client, url string, auth bool) error {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return err
	}
	if auth {
		req.SetBasicAuth("prometheus", "secret")
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		return fmt.Errorf("%d %q", resp.StatusCode, body)
	}
	return nil
}

func (l *Listener) counts() (open int, shed uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns), l.shed
}

// TestAtTheCapTheConnectionsTheServerWaitsOnAreClosed: whatever a client
// does with many connections (send nothing, half a header, a header whose
// body never comes, with or without basic auth refusing it), a new
// connection and a kept-alive one are both served, a request in a handler
// is never cut, and the cap holds.
func TestAtTheCapTheConnectionsTheServerWaitsOnAreClosed(t *testing.T) {
	t.Parallel()
	attacks := []struct{ name, payload string }{
		{"nothing", ""},
		{"half a header", "GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: sl"},
		{"a body that never comes", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"},
		{"a chunked body that never comes", "GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"},
	}
	for _, auth := range []bool{false, true} {
		for _, a := range attacks {
			t.Run(fmt.Sprintf("%s, basic auth %v", a.name, auth), func(t *testing.T) {
				t.Parallel()
				const max = 8
				release := make(chan struct{})
				l := server(t, max, auth, release)
				url := "http://" + l.Addr().String()
				keepAlive := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
				fresh := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
				if err := get(keepAlive, url+"/", auth); err != nil {
					t.Fatalf("before the attack: %v", err)
				}
				slow := make(chan error, 1)
				go func() { slow <- get(fresh, url+"/slow", auth) }()
				exportertest.Eventually(t, 5*time.Second, "the slow request in a handler", func() bool {
					l.mu.Lock()
					defer l.mu.Unlock()
					for c := range l.conns {
						if c.rankLocked() == serving {
							return true
						}
					}
					return false
				})
				for i := 0; i < 5*max; i++ {
					c, err := net.Dial("tcp", l.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					io.WriteString(c, a.payload)
					if i%max == max-1 {
						if err := get(fresh, url+"/", auth); err != nil {
							t.Errorf("a new connection after %d attacking ones: %v", i+1, err)
						}
					}
				}
				var reused bool
				trace := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
				req, _ := http.NewRequestWithContext(trace, "GET", url+"/", nil)
				if auth {
					req.SetBasicAuth("prometheus", "secret")
				}
				resp, err := keepAlive.Do(req)
				if err != nil {
					t.Fatalf("the kept-alive client after the attack: %v", err)
				}
				resp.Body.Close()
				if !reused {
					t.Errorf("the kept-alive client's connection was closed by the attack; want it kept over the attacker's")
				}
				close(release)
				if err := <-slow; err != nil {
					t.Errorf("the request in a handler was cut: %v", err)
				}
				if open, shed := l.counts(); open > max {
					t.Errorf("%d connections open (cap %d), %d closed to make room", open, max, shed)
				}
			})
		}
	}
}

// TestAConnectionNotReadYetIsNotClosed: until the server has begun to
// read a connection its client cannot be judged (its request may be
// waiting in the kernel); at the cap a connection the server is reading
// goes instead, even if newer, and when the server has read none Accept
// waits until it reads one.
func TestAConnectionNotReadYetIsNotClosed(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(inner, 2)
	defer l.Close()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	accept := func() net.Conn {
		t.Helper()
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// read starts the server's read of c, as a connection's goroutine
	// does, and reports when it ends (the connection closed under it).
	read := func(c net.Conn) <-chan struct{} {
		done := make(chan struct{})
		go func() { c.Read(make([]byte, 1)); close(done) }()
		exportertest.Eventually(t, 5*time.Second, "the read begun", func() bool { return c.(*conn).read.Load() })
		return done
	}
	dial()
	notRead := accept()
	dial()
	readClosed := read(accept())
	dial()
	newest := accept() // at the cap: closes the one being read
	select {
	case <-readClosed:
	case <-time.After(5 * time.Second):
		t.Fatalf("the connection being read is open; want it closed for the new one")
	}
	dial()
	got := make(chan net.Conn, 1)
	go func() { c, _ := l.Accept(); got <- c }()
	select {
	case <-got:
		t.Fatalf("Accept closed a connection the server had not read; want it to wait")
	case <-time.After(300 * time.Millisecond):
	}
	notReadClosed := read(notRead)
	select {
	case c := <-got:
		if c == nil {
			t.Fatalf("Accept failed")
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Accept still waits after the server began to read a connection")
	}
	select {
	case <-notReadClosed:
	case <-time.After(5 * time.Second):
		t.Errorf("the oldest connection, once read, is still open; want it closed for the new one")
	}
	if newest.(*conn).read.Load() {
		t.Errorf("test bug: the newest connection was read")
	}
}

// TestABodyIsRefusedWithoutWaitingForIt: no endpoint takes a body, so a
// request that announces one is answered 413 and its connection closed at
// once; a request without one is served and kept alive.
func TestABodyIsRefusedWithoutWaitingForIt(t *testing.T) {
	t.Parallel()
	l := server(t, 8, false, nil)
	for _, tc := range []struct {
		name, request string
		status        int
		closed        bool
	}{
		{"no body", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200, false},
		{"Content-Length: 0", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 200, false},
		{"a length, body never sent", "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", 413, true},
		{"chunked, body never sent", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 413, true},
		{"a length, body sent", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", 413, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			io.WriteString(c, tc.request)
			r := bufio.NewReader(c)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatalf("no answer within 2 s: %v", err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			_, err = r.ReadByte()
			if closed := err == io.EOF || (err != nil && strings.Contains(err.Error(), "reset")); closed != tc.closed {
				t.Errorf("connection closed after the answer: %v (%v), want %v", closed, err, tc.closed)
			}
		})
	}
}

// TestListenHandsOverAConnectionOnceItsClientSpeaks: a client that sends
// nothing is not accepted (Linux), so a request sent with its connection is
// always there to be read when the connection reaches the cap's judgement.
func TestListenHandsOverAConnectionOnceItsClientSpeaks(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("TCP_DEFER_ACCEPT is Linux's")
	}
	l, err := Listen("127.0.0.1:0", 8)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	silent, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	got := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			got <- c
		}
	}()
	select {
	case <-got:
		t.Fatalf("a connection that sent nothing was accepted at once")
	case <-time.After(300 * time.Millisecond):
	}
	speaking, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer speaking.Close()
	io.WriteString(speaking, "GET / HTTP/1.1\r\n")
	select {
	case c := <-got:
		if c.LocalAddr().String() != speaking.RemoteAddr().String() || c.RemoteAddr().String() != speaking.LocalAddr().String() {
			t.Errorf("accepted %s, want the client that spoke (%s)", c.RemoteAddr(), speaking.LocalAddr())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the client that sent its request was not accepted")
	}
}
