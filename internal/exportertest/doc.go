// Package exportertest runs gpumem_exporter as a process for the end-to-end
// tests of the repository root and of attack/: start it on a port the
// kernel picks, scrape it, wait on conditions, read metrics out of a
// scrape, and fail the test when the exporter dies or the race detector
// reports a race in it. Binary builds the exporter once per source tree
// and keeps it in the user's cache directory.
package exportertest
