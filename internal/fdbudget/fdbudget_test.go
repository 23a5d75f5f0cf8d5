package fdbudget

import "testing"

// TestSecurityFileLimitFitsTheConnectionCaps: the connection caps are
// fitted under RLIMIT_NOFILE with the reserve (docs/security.md, "descriptors
// run out").
func TestSecurityFileLimitFitsTheConnectionCaps(t *testing.T) {
	t.Parallel()
	const maxPidfds = 1024
	for _, tc := range []struct {
		limit                 uint64
		conns, perUID, web    int
		health                bool
		wantConns, wantPerUID int
		wantPidfds            int
		wantErr               bool
	}{
		{limit: 1 << 20, conns: 1024, perUID: 64, web: 64, wantConns: 1024, wantPerUID: 64, wantPidfds: maxPidfds},
		// What the caps leave goes to the resolver's pidfds.
		{limit: 2048 + 64 + 128 + 100, conns: 1024, perUID: 64, web: 64, wantConns: 1024, wantPerUID: 64, wantPidfds: 100},
		// 1024 descriptors: 64 HTTP, 128 reserved, the rest for the socket at two each.
		{limit: 1024, conns: 1024, perUID: 64, web: 64, wantConns: (1024 - 64 - 128) / 2, wantPerUID: 64},
		{limit: 1024, conns: 1024, perUID: 1000, web: 64, health: true, wantConns: (1024 - 72 - 128) / 2, wantPerUID: (1024 - 72 - 128) / 2},
		{limit: 200, conns: 1024, perUID: 64, web: 64, wantErr: true},
	} {
		c := Caps{SocketConnections: tc.conns, SocketConnectionsPerUID: tc.perUID, WebConnections: tc.web, WebListeners: 1, MaxPidfds: maxPidfds}
		if tc.health {
			c.HealthConnections = HealthMaxConnections
		}
		got, err := fit(tc.limit, c)
		if (err != nil) != tc.wantErr {
			t.Errorf("limit %d: err = %v, want error %v", tc.limit, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && (got.SocketConnections != tc.wantConns || got.SocketConnectionsPerUID != tc.wantPerUID || got.Pidfds != tc.wantPidfds) {
			t.Errorf("limit %d: caps %d and %d per uid, %d pidfds; want %d and %d, %d", tc.limit, got.SocketConnections, got.SocketConnectionsPerUID, got.Pidfds, tc.wantConns, tc.wantPerUID, tc.wantPidfds)
		}
	}
}
