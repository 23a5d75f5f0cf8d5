package exposition

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ProcessCollector exports the process_* metrics of client_golang's
// process collector (the same names, help, types and values) for the
// process itself, read with a tenth of its CPU: client_golang reads and
// parses /proc/stat for the boot time on every scrape (the start time does
// not change) and parses /proc/self/limits and /proc/self/net/netstat with
// general parsers; those three were 0.4 ms of a 0.64 ms gather on the
// build machine. It also keeps its /proc files open and reads them again
// from offset 0 (the kernel writes them anew at each read from the start):
// opening, reading to EOF and closing a /proc file costs 5 to 10 times one
// pread of it (docs/benchmarks.md). Values it cannot read are left out, as
// client_golang does without ReportErrors.
type ProcessCollector struct {
	procPath string
	pageSize float64

	startOnce sync.Once
	start     float64 // seconds since the epoch; 0 if unknown

	mu    sync.Mutex // one Collect at a time reads the files and buf
	files map[string]*os.File
	buf   []byte
}

var (
	processCPU      = prometheus.NewDesc("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", nil, nil)
	processOpenFDs  = prometheus.NewDesc("process_open_fds", "Number of open file descriptors.", nil, nil)
	processMaxFDs   = prometheus.NewDesc("process_max_fds", "Maximum number of open file descriptors.", nil, nil)
	processVsize    = prometheus.NewDesc("process_virtual_memory_bytes", "Virtual memory size in bytes.", nil, nil)
	processMaxVsize = prometheus.NewDesc("process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes.", nil, nil)
	processRSS      = prometheus.NewDesc("process_resident_memory_bytes", "Resident memory size in bytes.", nil, nil)
	processStart    = prometheus.NewDesc("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", nil, nil)
	processIn       = prometheus.NewDesc("process_network_receive_bytes_total", "Number of bytes received by the process over the network.", nil, nil)
	processOut      = prometheus.NewDesc("process_network_transmit_bytes_total", "Number of bytes sent by the process over the network.", nil, nil)
)

// userHZ is the kernel's USER_HZ, the unit of /proc's CPU times (100 on
// every Linux architecture that client_golang supports; procfs assumes it
// too).
const userHZ = 100

// NewProcessCollector returns the collector of this process, reading
// /proc.
func NewProcessCollector() *ProcessCollector {
	return &ProcessCollector{procPath: "/proc", pageSize: float64(os.Getpagesize())}
}

// Describe implements prometheus.Collector.
func (c *ProcessCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{processCPU, processOpenFDs, processMaxFDs, processVsize, processMaxVsize, processRSS, processStart, processIn, processOut} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *ProcessCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if stat, err := c.read("stat"); err == nil {
		if f, ok := statFields(stat); ok {
			ch <- prometheus.MustNewConstMetric(processCPU, prometheus.CounterValue, (f.utime+f.stime)/userHZ)
			ch <- prometheus.MustNewConstMetric(processVsize, prometheus.GaugeValue, f.vsize)
			ch <- prometheus.MustNewConstMetric(processRSS, prometheus.GaugeValue, f.rss*c.pageSize)
			c.startOnce.Do(func() { c.start = c.startTime(f.starttime) })
			if c.start > 0 {
				ch <- prometheus.MustNewConstMetric(processStart, prometheus.GaugeValue, c.start)
			}
		}
	}
	if n, err := c.openFDs(); err == nil {
		ch <- prometheus.MustNewConstMetric(processOpenFDs, prometheus.GaugeValue, float64(n))
	}
	if limits, err := c.read("limits"); err == nil {
		files, fok := softLimit(limits, "Max open files")
		space, sok := softLimit(limits, "Max address space")
		if fok && sok {
			ch <- prometheus.MustNewConstMetric(processMaxFDs, prometheus.GaugeValue, files)
			ch <- prometheus.MustNewConstMetric(processMaxVsize, prometheus.GaugeValue, space)
		}
	}
	if netstat, err := c.read("net/netstat"); err == nil {
		in, out := ipExtOctets(netstat)
		ch <- prometheus.MustNewConstMetric(processIn, prometheus.CounterValue, in)
		ch <- prometheus.MustNewConstMetric(processOut, prometheus.CounterValue, out)
	}
}

// file returns the kept-open /proc/self/<name>, opening it the first time
// and after a failed read.
func (c *ProcessCollector) file(name string) (*os.File, error) {
	if f := c.files[name]; f != nil {
		return f, nil
	}
	f, err := os.Open(c.procPath + "/self/" + name)
	if err != nil {
		return nil, err
	}
	if c.files == nil {
		c.files = map[string]*os.File{}
	}
	c.files[name] = f
	return f, nil
}

// forget closes a file whose read failed, so that the next Collect opens
// it again.
func (c *ProcessCollector) forget(name string) {
	if f := c.files[name]; f != nil {
		f.Close()
		delete(c.files, name)
	}
}

// read returns the whole of /proc/self/<name>, read from offset 0 into
// c.buf (valid until the next read).
func (c *ProcessCollector) read(name string) ([]byte, error) {
	f, err := c.file(name)
	if err != nil {
		return nil, err
	}
	if c.buf == nil {
		c.buf = make([]byte, 4096)
	}
	for {
		n, err := f.ReadAt(c.buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			c.forget(name)
			return nil, err
		}
		if n < len(c.buf) {
			return c.buf[:n], nil
		}
		// It may be longer than the buffer: read it again, whole.
		c.buf = make([]byte, 2*len(c.buf))
	}
}

// openFDs counts the entries of /proc/self/fd, the kept-open directory
// (and the collector's other files) among them.
func (c *ProcessCollector) openFDs() (int, error) {
	d, err := c.file("fd")
	if err != nil {
		return 0, err
	}
	if _, err := d.Seek(0, io.SeekStart); err != nil {
		c.forget("fd")
		return 0, err
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		c.forget("fd")
		return 0, err
	}
	return len(names), nil
}

// startTime is the boot time (/proc/stat's btime) plus the process's
// start in clock ticks since boot.
func (c *ProcessCollector) startTime(ticks float64) float64 {
	stat, err := os.ReadFile(c.procPath + "/stat")
	if err != nil {
		return 0
	}
	for line := range bytes.SplitSeq(stat, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			btime, err := strconv.ParseUint(string(bytes.TrimSpace(rest)), 10, 64)
			if err != nil {
				return 0
			}
			return float64(btime) + ticks/userHZ
		}
	}
	return 0
}

type statValues struct {
	utime, stime, starttime, vsize, rss float64
}

// statFields reads fields 14, 15, 22, 23 and 24 of a stat line, counted
// after the command name, which may hold spaces and parentheses.
func statFields(stat []byte) (statValues, bool) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return statValues{}, false
	}
	fields := bytes.Fields(stat[end+1:]) // fields[0] is field 3
	if len(fields) < 22 {
		return statValues{}, false
	}
	var v statValues
	for _, f := range []struct {
		n   int
		dst *float64
	}{{14, &v.utime}, {15, &v.stime}, {22, &v.starttime}, {23, &v.vsize}, {24, &v.rss}} {
		x, err := strconv.ParseUint(string(fields[f.n-3]), 10, 64)
		if err != nil {
			return statValues{}, false
		}
		*f.dst = float64(x)
	}
	return v, true
}

// softLimit reads the soft limit of the /proc/<pid>/limits line that
// starts with name; "unlimited" is the largest uint64, as procfs reads it.
func softLimit(limits []byte, name string) (float64, bool) {
	for line := range bytes.SplitSeq(limits, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte(name))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		if string(f[0]) == "unlimited" {
			return float64(math.MaxUint64), true
		}
		x, err := strconv.ParseUint(string(f[0]), 10, 64)
		return float64(x), err == nil
	}
	return 0, false
}

// ipExtOctets reads InOctets and OutOctets from the IpExt lines of
// /proc/<pid>/net/netstat (a line of names, then a line of values); one
// that is missing is 0, as client_golang exports it.
func ipExtOctets(netstat []byte) (in, out float64) {
	var names [][]byte
	for line := range bytes.SplitSeq(netstat, []byte("\n")) {
		rest, found := bytes.CutPrefix(line, []byte("IpExt:"))
		if !found {
			continue
		}
		if names == nil {
			names = bytes.Fields(rest)
			continue
		}
		values := bytes.Fields(rest)
		for i, n := range names {
			if i >= len(values) {
				break
			}
			x, err := strconv.ParseFloat(string(values[i]), 64)
			if err != nil {
				continue
			}
			switch string(n) {
			case "InOctets":
				in = x
			case "OutOctets":
				out = x
			}
		}
		return in, out
	}
	return 0, 0
}
