package allocstats

import (
	"bufio"
	"context"
	"fmt"
	"github.com/gpumem/gpumem_exporter/allocstats/wire"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
)

// benchUUIDs are the devices of the benchmark node: 8 GPUs.
var benchUUIDs = func() []string {
	u := make([]string, 8)
	for i := range u {
		u[i] = fmt.Sprintf("GPU-%08x-4e5f-6789-abcd-ef0123456789", i)
	}
	return u
}()

// pythonStatsLine is a stats line as the Python client writes it for a
// process on one GPU: compact JSON, every field, in its key order.
func pythonStatsLine(uuid string, n uint64) string {
	return fmt.Sprintf(`{"v":1,"type":"stats","devices":[{"uuid":%q,"reserved_bytes":%d,"active_bytes":%d,"allocated_bytes":%d,"inactive_split_bytes":%d,"peak_reserved_bytes":%d,"peak_active_bytes":%d,"limit_bytes":150754820096,"alloc_retries":%d,"ooms":%d}]}`,
		uuid, 3124756480+n*2097152, 960495616+n*512, 960495616+n*512, 1199570944, 3841982464, 2160066560, n/100, n/1000)
}

func benchCounter(b *testing.B, s *Server, typ, result string) float64 {
	b.Helper()
	var m dto.Metric
	if err := s.messages.WithLabelValues(typ, result).Write(&m); err != nil {
		b.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// BenchmarkIngestEndToEnd: 200 clients, each on its own connection as its
// own process, write stats lines of the Python client's shape into a real
// socket server as fast as it takes them. One op is one message; msgs/s is
// messages accepted per second of wall time, from the first byte written
// to the last line counted; cpu-ns/msg is the process's CPU time (server
// and clients) per message. Every line must be counted ok.
//
// peer=fake: the peers' liveness is not checked; peer=pidfd: it is
// checked against a pidfd (of the benchmark's own process), as the daemon
// does on Linux 6.5 and later. lines-per-write=64: each client writes 64
// lines at once; =1: a line a write, as the Python client sends them.
func BenchmarkIngestEndToEnd(b *testing.B) {
	for _, peerKind := range []string{"fake", "pidfd"} {
		for _, perWrite := range []int{64, 1} {
			if peerKind == "fake" && perWrite == 1 {
				continue
			}
			b.Run(fmt.Sprintf("peer=%s/lines-per-write=%d", peerKind, perWrite), func(b *testing.B) {
				var alive func() bool
				if peerKind == "pidfd" {
					fd, err := unix.PidfdOpen(os.Getpid(), 0)
					if err != nil {
						b.Skipf("pidfd_open: %v", err)
					}
					p := &pidfd{fd: fd}
					defer p.close()
					alive = p.alive
				}
				benchIngest(b, alive, perWrite)
			})
		}
	}
}

func benchIngest(b *testing.B, alive func() bool, perWrite int) {
	const clients = 200
	dir, err := os.MkdirTemp("", "gsb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	known := make(map[string]bool)
	for _, u := range benchUUIDs {
		known[u] = true
	}
	store := NewStore(time.Minute)
	store.SetProcessLimits(2*clients, 2*clients)
	srv, err := NewServer(Config{
		SocketPath:           filepath.Join(dir, "s.sock"),
		SocketExplicit:       true,
		MaxConnections:       2 * clients,
		MaxConnectionsPerUID: 2 * clients,
		KnownDevice: func(uuid string) (string, uint64, bool) {
			return uuid, testTotalBytes, known[uuid]
		},
	}, store, nil)
	if err != nil {
		b.Fatal(err)
	}
	var nextPID atomic.Uint32
	srv.identify = func(kernelConn, time.Duration) (*peer, error) {
		return &peer{id: Identity{PID: 20000 + nextPID.Add(1), UID: 1000, StartTime: 1}, alive: alive}, nil
	}
	if err := srv.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()

	// Connect every client and wait for its welcome, outside the timing.
	conns := make([]net.Conn, clients)
	for i := range conns {
		c, err := net.Dial("unix", srv.SocketPath())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(`{"v":1,"type":"hello","framework":"pytorch","framework_version":"2.11.0","client":"gpumem-python/0.1.0"}` + "\n")); err != nil {
			b.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			b.Fatalf("client %d waiting for the welcome: %v", i, err)
		}
		conns[i] = c
	}
	// Each client's lines, rendered once: 64 distinct states, cycled.
	const distinct = 64
	lines := make([][]byte, clients)
	for i := range lines {
		var buf []byte
		for n := range uint64(distinct) {
			buf = append(buf, pythonStatsLine(benchUUIDs[i%len(benchUUIDs)], n+uint64(i))...)
			buf = append(buf, '\n')
		}
		lines[i] = buf
	}
	lineStarts := func(i int) []int {
		var starts []int
		for j, c := range lines[i] {
			if c == '\n' {
				starts = append(starts, j+1)
			}
		}
		return starts
	}
	before := benchCounter(b, srv, wire.TypeStats, wire.ResultOK)
	b.ReportAllocs()
	b.ResetTimer()
	cpuStart := processCPU(b)
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		share := b.N / clients
		if i < b.N%clients {
			share++
		}
		if share == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ends := lineStarts(i)
			for j := 0; share > 0; j = (j + perWrite) % distinct {
				k := min(share, perWrite, distinct-j)
				from := 0
				if j > 0 {
					from = ends[j-1]
				}
				if _, err := c.Write(lines[i][from:ends[j+k-1]]); err != nil {
					b.Error(err)
					return
				}
				share -= k
			}
		}()
	}
	wg.Wait()
	want := before + float64(b.N)
	deadline := time.Now().Add(time.Minute)
	for benchCounter(b, srv, wire.TypeStats, wire.ResultOK) < want {
		if time.Now().After(deadline) {
			b.Fatalf("after a minute, %v of %d lines were accepted", benchCounter(b, srv, wire.TypeStats, wire.ResultOK)-before, b.N)
		}
		time.Sleep(100 * time.Microsecond)
	}
	elapsed := time.Since(start)
	cpu := processCPU(b) - cpuStart
	b.StopTimer()
	if got := benchCounter(b, srv, wire.TypeStats, wire.ResultOK); got != want {
		b.Fatalf("accepted %v lines, sent %d", got-before, b.N)
	}
	for _, r := range []string{wire.ResultRejected} {
		if n := benchCounter(b, srv, wire.TypeStats, r); n != 0 {
			b.Fatalf("%v lines counted %s", n, r)
		}
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
}

// processCPU is the CPU time (user and system) the process has used: the
// server's and the clients' writes, which a loaded machine does not
// stretch as it stretches wall time.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStoreReadUnderWriters: the latency of the poller's
// Processes() while 200 connections apply stats to their own processes,
// each writer one message a millisecond (200k messages/s in all, the ingest
// target; writes/s says what they achieved). One op is one Processes()
// call. The writers are paced so that the figure is what the reader waits
// for the store, not for a CPU that 200 spinning goroutines hold.
func BenchmarkStoreReadUnderWriters(b *testing.B) {
	benchReadUnderWriters(b, func(s *Store) {
		if ps := s.Processes(); len(ps) != 200 {
			b.Fatalf("%d processes", len(ps))
		}
	})
}

// BenchmarkStorePruneUnderWriters: the same for Prune (every process
// alive, none expired).
func BenchmarkStorePruneUnderWriters(b *testing.B) {
	benchReadUnderWriters(b, func(s *Store) {
		s.Prune(t0, func(uint32, uint64) bool { return true })
	})
}

func benchReadUnderWriters(b *testing.B, read func(*Store)) {
	const writers = 200
	s := NewStore(time.Minute)
	s.SetProcessLimits(writers, writers)
	reports := make([][]DeviceReport, 64)
	for n := range reports {
		reports[n] = decodeBenchLine(b, pythonStatsLine(benchUUIDs[n%len(benchUUIDs)], uint64(n)))
	}
	entries := make([]*procEntry, writers)
	for i := range entries {
		var err error
		entries[i], err = s.stats(nil, Identity{PID: uint32(1000 + i), UID: 1000, StartTime: 1}, reports[i%len(reports)], t0, DefaultMaxDevices)
		if err != nil {
			b.Fatal(err)
		}
	}
	var stop atomic.Bool
	var writes atomic.Int64
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := Identity{PID: uint32(1000 + i), UID: 1000, StartTime: 1}
			var n int64
			for k := 0; !stop.Load(); k++ {
				if _, err := s.stats(entries[i], id, reports[k%len(reports)], t0, DefaultMaxDevices); err != nil {
					b.Error(err)
					return
				}
				n++
				time.Sleep(time.Millisecond)
			}
			writes.Add(n)
		}()
	}
	time.Sleep(10 * time.Millisecond)
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		read(s)
	}
	elapsed := time.Since(start)
	stop.Store(true)
	wg.Wait()
	b.ReportMetric(float64(writes.Load())/elapsed.Seconds(), "writes/s")
}

func decodeBenchLine(b *testing.B, line string) []DeviceReport {
	b.Helper()
	m, err := wire.DecodeLine([]byte(line), DefaultMaxDevices)
	if err != nil {
		b.Fatal(err)
	}
	return m.Devices
}
