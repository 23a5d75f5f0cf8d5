// bigalloc.so: an LD_PRELOAD shim that logs, with a backtrace, every
// allocation or mapping of at least BIGALLOC_MIN bytes (default 1 MiB)
// and every thread a process creates, to stderr. nvml_anon_probe.py uses
// it to find who makes the large anonymous mapping that nvmlInit adds to
// the exporter's RSS (issue 12). Built here, carried to the device:
//   gcc -shared -fPIC -O2 -o .bin/probe/bigalloc.so scripts/gpu/bigalloc.c -ldl -lpthread
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static __thread int busy;
static size_t min_bytes = 1 << 20;

__attribute__((constructor)) static void init(void) {
	const char *m = getenv("BIGALLOC_MIN");
	if (m) min_bytes = strtoul(m, NULL, 10);
}

static void report(const char *what, size_t n, void *p) {
	if (n < min_bytes || busy) return;
	busy = 1;
	char line[160];
	int len = snprintf(line, sizeof line, "bigalloc: %s %zu bytes at %p\n", what, n, p);
	write(2, line, len);
	void *frames[24];
	int k = backtrace(frames, 24);
	backtrace_symbols_fd(frames, k, 2);
	write(2, "bigalloc: end\n", 14);
	busy = 0;
}

void *malloc(size_t n) { void *p = __libc_malloc(n); report("malloc", n, p); return p; }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); report("calloc", a * b, p); return p; }
void *realloc(void *q, size_t n) { void *p = __libc_realloc(q, n); report("realloc", n, p); return p; }
void *memalign(size_t al, size_t n) { void *p = __libc_memalign(al, n); report("memalign", n, p); return p; }
int posix_memalign(void **out, size_t al, size_t n) {
	*out = __libc_memalign(al, n);
	report("posix_memalign", n, *out);
	return *out ? 0 : 12;
}
void *aligned_alloc(size_t al, size_t n) { void *p = __libc_memalign(al, n); report("aligned_alloc", n, p); return p; }
void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
	void *p = (void *)syscall(SYS_mmap, a, n, prot, flags, fd, off);
	if (fd < 0) report("mmap-anon", n, p);
	return p;
}
void *mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off) { return mmap(a, n, prot, flags, fd, off); }
int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
	static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
	if (!real) real = dlsym(RTLD_NEXT, "pthread_create");
	size_t saved = min_bytes;
	min_bytes = 0;
	report("pthread_create", 0, (void *)fn);
	min_bytes = saved;
	return real(t, attr, fn, arg);
}
