// Package exportertest runs gpumem_exporter as a process for the
// end-to-end tests of e2e/ and attack/: find or build the binary
// (ExporterBinary, Binary, which keeps builds in the user's cache
// directory), start it on a port the kernel picks, scrape it, dial its
// socket as a client, wait on conditions, read metrics out of a scrape,
// re-execute a test binary in a role, and fail the test when the exporter
// dies or the race detector reports a race in it.
package exportertest
