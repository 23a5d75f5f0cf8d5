package oom

// The ring of the last reports, and /api/v1/oom-reports that serves it.

import (
	"encoding/json"
	"net/http"
	"sync"
)

// ring keeps the last reports, at most its capacity, oldest first. When
// it is full, the oldest report of the new report's uid goes if that uid
// holds a quarter of the ring or more, else the oldest report of the uid
// holding the most: one user flooding the ring replaces its own reports,
// never the other users'.
type ring struct {
	mu      sync.Mutex
	reports []Report // oldest first
}

func newRing(capacity int) *ring { return &ring{reports: make([]Report, 0, capacity)} }

// Deliver implements ReportSink: it keeps rep.
func (g *ring) Deliver(rep Report) {
	rep.replyTo = nil // the connection is answered once, not held
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.reports) == cap(g.reports) {
		g.dropOne(rep.uid)
	}
	g.reports = append(g.reports, rep)
}

// dropOne makes room for a report of uid; g.mu is held.
func (g *ring) dropOne(uid uint32) {
	held := map[uint32]int{}
	for i := range g.reports {
		held[g.reports[i].uid]++
	}
	from := uid
	if held[from] < max(1, cap(g.reports)/4) {
		for u, n := range held {
			if n > held[from] || (n == held[from] && u < from) {
				from = u
			}
		}
	}
	victim := 0
	for i := range g.reports {
		if g.reports[i].uid == from {
			victim = i
			break
		}
	}
	copy(g.reports[victim:], g.reports[victim+1:])
	g.reports = g.reports[:len(g.reports)-1]
}

// list returns the kept reports, newest first.
func (g *ring) list() []Report {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Report, len(g.reports))
	for i := range g.reports {
		out[len(g.reports)-1-i] = g.reports[i]
	}
	return out
}

// ServeHTTP serves {"reports":[…]}, newest first.
func (r *Reports) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, err := json.Marshal(struct {
		Reports []Report `json:"reports"`
	}{r.List()})
	if err != nil {
		http.Error(w, "encoding reports: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if req.Method == http.MethodHead {
		return
	}
	w.Write(append(body, '\n'))
}
