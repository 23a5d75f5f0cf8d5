package connshed

import (
	"context"
	"net"
)

// deferAcceptSeconds is how long the kernel holds a connection whose client
// has sent nothing before handing it over anyway (TCP_DEFER_ACCEPT, Linux).
// An HTTP client sends its request, or a TLS client its hello, as soon as
// it connects.
const deferAcceptSeconds = 1

// Listen listens on the TCP address addr for an HTTP server, capped at max
// open connections (NewListener).
//
// Accepted connections get no TCP keep-alive probes: the server's
// deadlines already close a connection whose client is gone, and turning
// the probes on costs system calls on every connection of a flood. On
// Linux the kernel hands over a connection only once its client has sent
// something, or after deferAcceptSeconds: a client that connects and sends
// nothing costs the server nothing for that second, and a client whose
// request is in its first packet is never silent when accepted, so the
// cap never closes it before it could be read. (When a flood fills the
// kernel's queue of pending connections, SYN cookies bypass this and the
// cap's order alone applies.)
func Listen(addr string, max int) (*Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1, Control: deferAccept}
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return NewListener(l, max), nil
}
