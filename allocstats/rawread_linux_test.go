package allocstats

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// unixPair returns both ends of a Unix stream connection.
func unixPair(t *testing.T) (server, client *net.UnixConn) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan *net.UnixConn, 1)
	go func() {
		c, _ := l.AcceptUnix()
		done <- c
	}()
	client, err = net.DialUnix("unix", nil, l.Addr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	server = <-done
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// The raw reader behaves as net.Conn.Read: it waits for data, returns what
// is there, honours the read deadline (and reads on after it is moved),
// returns io.EOF once the peer closed, and an error once the connection is
// closed under it.
func TestRawReaderReadsAsTheConnectionDoes(t *testing.T) {
	server, client := unixPair(t)
	r := newConnReader(server)
	if _, ok := r.(rawReader); !ok {
		t.Fatalf("newConnReader gave %T, want the raw reader", r)
	}
	buf := make([]byte, 64)
	go client.Write([]byte("hello\n"))
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "hello\n" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	server.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	server.SetReadDeadline(time.Time{})
	client.Write([]byte("again\n"))
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "again\n" {
		t.Fatalf("Read after the deadline moved = %q, %v", buf[:n], err)
	}
	if n, err := r.Read(buf[:0]); n != 0 || err != nil {
		t.Errorf("Read of an empty buffer = %d, %v", n, err)
	}
	client.Close()
	if _, err := r.Read(buf); err != io.EOF {
		t.Fatalf("Read after the peer closed: %v, want io.EOF", err)
	}

	server2, _ := unixPair(t)
	r2 := newConnReader(server2)
	got := make(chan error, 1)
	go func() {
		_, err := r2.Read(buf)
		got <- err
	}()
	time.Sleep(10 * time.Millisecond) // let the read wait
	server2.Close()
	if err := <-got; err == nil || err == io.EOF {
		t.Errorf("Read of a connection closed under it: %v, want a closed-connection error", err)
	}
}
