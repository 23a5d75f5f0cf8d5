package csi

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/go-kit/log"
)

var (
	mountProbeOnce sync.Once
	mountProbeErr  error
)

// probeMount says whether this process can make a read-only bind mount
// (it needs CAP_SYS_ADMIN and no seccomp profile against mount(2)).
func probeMount() error {
	mountProbeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpumem-csi-mount-probe-")
		if err != nil {
			mountProbeErr = err
			return
		}
		defer os.RemoveAll(dir)
		src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
		for _, p := range []string{src, dst} {
			if err := os.Mkdir(p, 0o755); err != nil {
				mountProbeErr = err
				return
			}
		}
		m := NewMounter()
		if err := m.BindReadOnly(src, dst); err != nil {
			mountProbeErr = err
			return
		}
		mountProbeErr = m.Unmount(dst)
	})
	return mountProbeErr
}

// requireMount skips a test of real mounts where this process may not
// mount. The fake-mounter tests cover the driver's logic there; these
// check the kernel's side.
func requireMount(t *testing.T) {
	t.Helper()
	if err := probeMount(); err != nil {
		t.Skipf("real bind mounts are not possible here (%v): skipped; the fake-mounter tests cover the driver's logic", err)
	}
}

// testLogger collects log lines and prints them when the test fails
// (never t.Log from server goroutines, which may outlive the test).
func testLogger(t *testing.T) log.Logger {
	var buf syncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("driver log:\n%s", buf.String())
		}
	})
	return log.NewLogfmtLogger(&buf)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
