// Package attack runs the attacks of docs/security.md against
// gpumem_exporter end to end: the real exporter binary (simulated backend)
// as its own process, attackers and victims as this package's test binary
// re-executed, some as other users, everything over loopback and the
// allocator stats socket. It has no code besides its tests.
//
// The exporter is built once per source tree, with -race when the tests
// run with -race, and kept in os.UserCacheDir()/gpumem_exporter-attack
// (internal/exportertest.Binary); GPUMEM_ATTACK_EXPORTER=/path runs the
// tests against that build instead. Most tests need root (to run processes
// as other users, and to force a pid to be reused); they skip without it.
//
//	go test -race -count=1 ./attack/
package attack
