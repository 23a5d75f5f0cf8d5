// Package memtrim gives back the memory the exporter needed only to
// start.
//
// Starting maps most of the binary and of NVML's libraries into the
// process: package initialisers (the Kubernetes client's type
// registrations among them), flag parsing and NVML's initialisation run
// code and read constants that a running exporter never touches again.
// On kernels that keep files in large folios (ext4 and XFS on Linux 6.x)
// touching one page of a file maps the whole folio, so the resident set
// then holds most of the binary (docs/benchmarks.md measures it). Release,
// called once start-up is over, drops those pages from the process and
// from the page cache, tells the kernel to read them back one page at a
// time when they are needed again, and returns the heap start-up left
// free; what runs afterwards faults back in only what it uses.
//
// Nothing is lost: only clean pages of files that the process maps
// read-only are dropped, and the kernel reads them again from the file.
// Pages a read-only mapping holds privately (relocations the dynamic
// loader wrote before it made them read-only) are written to swap or
// kept, never dropped.
package memtrim

// Result says what Release did.
type Result struct {
	// Regions is how many read-only file mappings it advised.
	Regions int
	// BinaryUncached: the kernel was asked to drop the binary's cached
	// pages (POSIX_FADV_DONTNEED); false where the binary cannot be read.
	BinaryUncached bool
	// Before and After are the process's resident set in bytes (VmRSS)
	// just before and just after.
	Before, After uint64
	// NoPageout: the kernel refused MADV_PAGEOUT (it needs Linux 5.4), so
	// only the binary's pages left the page cache, not the libraries'.
	NoPageout bool
}
