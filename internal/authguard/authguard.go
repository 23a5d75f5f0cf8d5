// Package authguard bounds the bcrypt comparisons that exporter-toolkit's
// basic auth makes, so that a client spraying passwords cannot queue work
// in front of Prometheus's scrapes.
//
// exporter-toolkit checks a user and password against the bcrypt hash of
// the web configuration, one comparison at a time behind a mutex, and
// caches 100 results with random eviction. Every request with a new
// password takes a comparison (tens to hundreds of milliseconds of CPU at
// bcrypt's default cost), and a request waiting for the mutex waits on
// even when its client has gone. A client that sends new passwords faster than they are
// compared builds a queue of handler goroutines without bound: scrapes wait
// behind it, memory grows with it, and it is still being worked off long
// after the client stops. Its entries also evict Prometheus's from the
// toolkit's cache.
//
// The Guard sits in front of the toolkit's check and lets a request reach
// it only when that costs no waiting:
//
//   - credentials the toolkit accepted before (Prometheus's, which it sends
//     with every scrape) are recognised by a keyed SHA-256 of the user and
//     password, in a small set that only accepted credentials enter, so no
//     number of wrong passwords evicts them; such a request goes straight
//     on, and the toolkit, which stays the judge, checks it as before;
//   - any other request that carries credentials needs the one comparison
//     slot, taken without waiting, and a token of its source's bucket (its
//     IPv4 address or IPv6 /64; one new password a second, a burst of
//     five). Without either it is answered 429 at once, and nothing is
//     queued.
//
// So a spray from one host costs the exporter about one comparison a
// second, Prometheus's scrapes never wait behind it, and when the spray
// stops nothing of it is left. A client that opens with new credentials
// (Prometheus after the exporter restarted) is checked as soon as the slot
// is free and its source has a token; sharing a host with the sprayer, it
// waits for the spray to stop. Requests without credentials go on to the
// toolkit, which refuses them without a comparison.
package authguard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"hash/maphash"
	"net"
	"net/http"
	"sync"
	"time"
)

const (
	// DefaultRate is how many new credentials a second one source may
	// have checked, and DefaultBurst how many at once.
	DefaultRate  = 1.0
	DefaultBurst = 5
	// knownSize is how many accepted credentials are remembered: a few
	// users, each with an old and a new password during a rotation.
	knownSize = 16
	// sourceBuckets is how many token buckets the sources share (by a
	// hash): memory stays fixed whatever the number of sources.
	sourceBuckets = 256
)

// Options tune a Guard; the zero value takes the defaults.
type Options struct {
	Rate  float64 // new credentials a second per source
	Burst int     // new credentials at once per source
	// now is the clock (tests).
	now func() time.Time
}

// Guard bounds the basic-auth checks of one http.Server. Use New, then
// Protect on the server before it serves.
type Guard struct {
	rate  float64
	burst float64
	now   func() time.Time
	slot  chan struct{} // one comparison at a time; never waited on
	key   []byte        // of the HMAC that names credentials
	seed  maphash.Seed  // of the source buckets

	mu      sync.Mutex
	known   [knownSize]knownCreds
	buckets [sourceBuckets]bucket
	fronted http.Handler // the handler last put in front of (see install)
}

type knownCreds struct {
	sum  [sha256.Size]byte
	used time.Time // zero: empty
}

type bucket struct {
	tokens float64
	at     time.Time
}

// New returns a Guard.
func New(o Options) *Guard {
	if o.Rate <= 0 {
		o.Rate = DefaultRate
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.now == nil {
		o.now = time.Now
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails on Linux
	return &Guard{
		rate:  o.Rate,
		burst: float64(o.Burst),
		now:   o.now,
		slot:  make(chan struct{}, 1),
		key:   key,
		seed:  maphash.MakeSeed(),
	}
}

// Protect puts g in front of whatever wraps srv.Handler from now on
// (exporter-toolkit's basic auth, which web.Serve installs around the
// handler just before it serves): the handler set now is marked as the
// inside, which tells g that the toolkit accepted a request, and srv's
// first connection puts g outside. Call it after srv.Handler and
// srv.ConnContext are set, before srv serves.
func (g *Guard) Protect(srv *http.Server) {
	srv.Handler = inside{srv.Handler}
	prev := srv.ConnContext
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		g.install(srv)
		if prev != nil {
			return prev(ctx, c)
		}
		return ctx
	}
}

// install puts g in front of srv.Handler unless it is there already.
// ConnContext runs in srv's accept loop after the toolkit has set
// srv.Handler and before the connection is served: every request of that
// listener goes through g. (exporter-toolkit sets srv.Handler once for
// each listener as it starts serving it.)
func (g *Guard) install(srv *http.Server) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if h := srv.Handler; h != g.fronted {
		g.fronted = &front{g: g, next: h}
		srv.Handler = g.fronted
	}
}

// attempt travels with a request through the toolkit to inside.
type attempt struct {
	accepted bool
	release  func() // frees the comparison slot; nil when none is held
}

func (a *attempt) done() {
	if a.release != nil {
		a.release()
		a.release = nil
	}
}

type attemptKey struct{}

// inside is the handler the toolkit calls once it has accepted a request.
type inside struct{ next http.Handler }

func (h inside) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if a, ok := r.Context().Value(attemptKey{}).(*attempt); ok {
		a.accepted = true
		a.done() // the comparison is over: the handler runs without the slot
	}
	h.next.ServeHTTP(w, r)
}

// front is g in front of the toolkit's handler.
type front struct {
	g    *Guard
	next http.Handler
}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g := f.g
	user, pass, ok := r.BasicAuth()
	if !ok {
		f.next.ServeHTTP(w, r)
		return
	}
	sum := g.sum(user, pass)
	a := &attempt{}
	if !g.isKnown(sum) {
		if !g.take(r.RemoteAddr) {
			tooMany(w)
			return
		}
		select {
		case g.slot <- struct{}{}:
			a.release = func() { <-g.slot }
		default:
			tooMany(w)
			return
		}
	}
	f.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), attemptKey{}, a)))
	a.done()
	g.learn(sum, a.accepted)
}

func tooMany(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, "Too many new credentials to check; try again.", http.StatusTooManyRequests)
}

// sum names a user and password without keeping either.
func (g *Guard) sum(user, pass string) [sha256.Size]byte {
	m := hmac.New(sha256.New, g.key)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(user)))
	m.Write(n[:])
	m.Write([]byte(user))
	m.Write([]byte(pass))
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

func (g *Guard) isKnown(sum [sha256.Size]byte) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.known {
		if !g.known[i].used.IsZero() && g.known[i].sum == sum {
			g.known[i].used = g.now()
			return true
		}
	}
	return false
}

// learn remembers credentials the toolkit accepted (in the place of the
// least recently used) and forgets remembered ones it refused (a password
// changed in the web configuration).
func (g *Guard) learn(sum [sha256.Size]byte, accepted bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	oldest := 0
	for i := range g.known {
		k := &g.known[i]
		if !k.used.IsZero() && k.sum == sum {
			if !accepted {
				*k = knownCreds{}
			}
			return
		}
		if k.used.Before(g.known[oldest].used) {
			oldest = i
		}
	}
	if accepted {
		g.known[oldest] = knownCreds{sum: sum, used: g.now()}
	}
}

// take takes a token of the bucket of the source at remoteAddr.
func (g *Guard) take(remoteAddr string) bool {
	b := &g.buckets[g.bucketOf(remoteAddr)]
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if b.at.IsZero() {
		b.tokens = g.burst
	} else {
		b.tokens = min(g.burst, b.tokens+now.Sub(b.at).Seconds()*g.rate)
	}
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// bucketOf hashes the source of remoteAddr: the IPv4 address, or the /64
// of an IPv6 address (one host can use a whole /64).
func (g *Guard) bucketOf(remoteAddr string) int {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	src := []byte(host)
	if ip := net.ParseIP(host); ip != nil {
		if v4 := ip.To4(); v4 != nil {
			src = v4
		} else {
			src = ip.To16()[:8]
		}
	}
	return int(maphash.Bytes(g.seed, src) % sourceBuckets)
}
