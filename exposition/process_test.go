package exposition

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

func gatherOne(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

func value(mf *dto.MetricFamily) float64 {
	m := mf.GetMetric()[0]
	if m.Counter != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

// The same families, help, types and values as client_golang's process
// collector, read at about the same moment.
func TestProcessCollectorMatchesClientGolang(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	// Ours is read before and after theirs: memory figures move between
	// reads (a thread the runtime starts maps its stack and an arena, tens
	// of MiB of address space), so theirs must lie within what ours saw
	// around it, give or take the slack below.
	c := NewProcessCollector()
	ours := gatherOne(t, c)
	theirs := gatherOne(t, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	after := gatherOne(t, c)
	if len(theirs) == 0 {
		t.Fatal("client_golang's process collector exported nothing")
	}
	for name, want := range theirs {
		got, ok := ours[name]
		if !ok {
			t.Errorf("%s missing", name)
			continue
		}
		if got.GetHelp() != want.GetHelp() || got.GetType() != want.GetType() || len(got.GetMetric()) != 1 || len(got.GetMetric()[0].GetLabel()) != 0 {
			t.Errorf("%s: help %q type %v, want %q %v, one series without labels", name, got.GetHelp(), got.GetType(), want.GetHelp(), want.GetType())
		}
		g, w := value(got), value(want)
		switch name {
		case "process_cpu_seconds_total", "process_network_receive_bytes_total", "process_network_transmit_bytes_total":
			if g > w+0.5 || g < w-0.5 && name == "process_cpu_seconds_total" {
				t.Errorf("%s = %v, client_golang %v", name, g, w)
			}
		case "process_resident_memory_bytes", "process_virtual_memory_bytes", "process_open_fds":
			// open fds move too: finalizers close files between reads.
			slack := 64.0 * (1 << 20)
			if name == "process_open_fds" {
				slack = 4
			}
			g2 := g
			if a, ok := after[name]; ok {
				g2 = value(a)
			}
			if lo, hi := math.Min(g, g2), math.Max(g, g2); w < lo-slack || w > hi+slack {
				t.Errorf("%s = %v then %v, client_golang %v between", name, g, g2, w)
			}
		default: // start time and limits
			if g != w {
				t.Errorf("%s = %v, client_golang %v", name, g, w)
			}
		}
	}
	for name := range ours {
		if theirs[name] == nil {
			t.Errorf("%s exported, client_golang does not", name)
		}
	}
}

func TestProcessCollectorParsers(t *testing.T) {
	stat := []byte("4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 8 0 98765 123456789 2048 18446744073709551615\n")
	f, ok := statFields(stat)
	if !ok || f.utime != 150 || f.stime != 50 || f.starttime != 98765 || f.vsize != 123456789 || f.rss != 2048 {
		t.Errorf("statFields = %+v, %v", f, ok)
	}
	if _, ok := statFields([]byte("4242 (x) S 1")); ok {
		t.Error("statFields accepted a short line")
	}
	limits := []byte("Limit                     Soft Limit           Hard Limit           Units\n" +
		"Max open files            1048576              1048576              files\n" +
		"Max address space         unlimited            unlimited            bytes\n")
	if v, ok := softLimit(limits, "Max open files"); !ok || v != 1048576 {
		t.Errorf("open files = %v, %v", v, ok)
	}
	if v, ok := softLimit(limits, "Max address space"); !ok || v != float64(math.MaxUint64) {
		t.Errorf("address space = %v, %v", v, ok)
	}
	netstat := []byte("TcpExt: SyncookiesSent\nTcpExt: 0\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 12345 678\n")
	if in, out := ipExtOctets(netstat); in != 12345 || out != 678 {
		t.Errorf("ipExtOctets = %v, %v", in, out)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte("cpu  1 2 3\nbtime 1700000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &ProcessCollector{procPath: dir}
	if got := c.startTime(250); got != 1700000002.5 {
		t.Errorf("startTime = %v, want btime + 2.5 s", got)
	}
}

func BenchmarkProcessCollector(b *testing.B) {
	for _, tc := range []struct {
		name string
		c    prometheus.Collector
	}{
		{"client_golang", collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})},
		{"exposition", NewProcessCollector()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			reg.MustRegister(tc.c)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := reg.Gather(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The collector keeps its /proc files open and reads them from offset 0
// each time: a second Collect sees new contents, a file longer than the
// first buffer is read whole, and a file that went away is opened again
// once it is back.
func TestProcessCollectorRereadsKeptFiles(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "self")
	for _, d := range []string{filepath.Join(self, "fd"), filepath.Join(self, "net")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(self, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stat := func(utime int) string {
		return "42 (x) S 1 2 3 4 5 6 7 8 9 10 " + strconv.Itoa(utime) + " 0 0 0 20 0 8 0 100 4096 10 0\n"
	}
	// IpExt after 6 KiB of other lines: longer than the first buffer.
	netstat := func(in int) string {
		return "TcpExt: " + strings.Repeat("X", 6<<10) + "\nTcpExt: 0\nIpExt: InOctets OutOctets\nIpExt: " + strconv.Itoa(in) + " 7\n"
	}
	write("stat", stat(100))
	write("limits", "Max open files 1024 1024 files\nMax address space unlimited unlimited bytes\n")
	write("net/netstat", netstat(5))
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte("btime 1700000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &ProcessCollector{procPath: dir, pageSize: 4096}
	get := func() map[string]*dto.MetricFamily {
		t.Helper()
		return gatherOne(t, c)
	}
	first := get()
	if v := value(first["process_cpu_seconds_total"]); v != 1 {
		t.Errorf("cpu = %v, want 1", v)
	}
	if v := value(first["process_network_receive_bytes_total"]); v != 5 {
		t.Errorf("network in = %v, want 5 (IpExt past the first 4 KiB)", v)
	}
	write("stat", stat(250)) // the same file, new contents
	write("net/netstat", netstat(9))
	second := get()
	if v := value(second["process_cpu_seconds_total"]); v != 2.5 {
		t.Errorf("cpu after a change = %v, want 2.5", v)
	}
	if v := value(second["process_network_receive_bytes_total"]); v != 9 {
		t.Errorf("network in after a change = %v, want 9", v)
	}
	if err := os.Remove(filepath.Join(self, "stat")); err != nil {
		t.Fatal(err)
	}
	write("stat", stat(300)) // a new file: the kept one still reads the old
	c.mu.Lock()
	c.forget("stat") // as a failed read does
	c.mu.Unlock()
	if v := value(get()["process_cpu_seconds_total"]); v != 3 {
		t.Errorf("cpu after reopening = %v, want 3", v)
	}
}
