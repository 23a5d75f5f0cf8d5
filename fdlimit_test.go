package main

import (
	"testing"

	"github.com/prometheus/exporter-toolkit/web"

	"github.com/gpumem/gpumem_exporter/workload"
)

// TestSecurityFileLimitFitsTheConnectionCaps: the connection caps are
// fitted under RLIMIT_NOFILE with the reserve (docs/security.md, "descriptors
// run out").
func TestSecurityFileLimitFitsTheConnectionCaps(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit                 uint64
		conns, perUID, web    int
		health                bool
		wantConns, wantPerUID int
		wantPidfds            int
		wantErr               bool
	}{
		{limit: 1 << 20, conns: 1024, perUID: 64, web: 64, wantConns: 1024, wantPerUID: 64, wantPidfds: workload.MaxPidfds},
		// What the caps leave goes to the resolver's pidfds.
		{limit: 2048 + 64 + 128 + 100, conns: 1024, perUID: 64, web: 64, wantConns: 1024, wantPerUID: 64, wantPidfds: 100},
		// 1024 descriptors: 64 HTTP, 128 reserved, the rest for the socket at two each.
		{limit: 1024, conns: 1024, perUID: 64, web: 64, wantConns: (1024 - 64 - 128) / 2, wantPerUID: 64},
		{limit: 1024, conns: 1024, perUID: 1000, web: 64, health: true, wantConns: (1024 - 72 - 128) / 2, wantPerUID: (1024 - 72 - 128) / 2},
		{limit: 200, conns: 1024, perUID: 64, web: 64, wantErr: true},
	} {
		addrs := []string{":9481"}
		o := &options{maxConnections: tc.conns, maxConnectionsPerUID: tc.perUID, webMaxConnections: tc.web}
		o.webConfig = &web.FlagConfig{WebListenAddresses: &addrs}
		if tc.health {
			o.healthAddress = ":9482"
		}
		err := fitConnections(tc.limit, o)
		if (err != nil) != tc.wantErr {
			t.Errorf("limit %d: err = %v, want error %v", tc.limit, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && (o.maxConnections != tc.wantConns || o.maxConnectionsPerUID != tc.wantPerUID || o.pidfds != tc.wantPidfds) {
			t.Errorf("limit %d: caps %d and %d per uid, %d pidfds; want %d and %d, %d", tc.limit, o.maxConnections, o.maxConnectionsPerUID, o.pidfds, tc.wantConns, tc.wantPerUID, tc.wantPidfds)
		}
	}
}
