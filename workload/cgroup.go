package workload

import (
	"strings"
)

// CgroupInfo is what a process's cgroup membership says about it.
// Empty strings mean "not found".
type CgroupInfo struct {
	// Path is the cgroup path that the IDs were taken from: the unified (v2)
	// path, or on cgroup v1 the path of the controller that named a
	// container, pod or job. Without any ID it is the unified path, else the
	// memory controller's path, else the first path found.
	Path string
	// ContainerID is lowercase hex, as the runtime names the container
	// (docker, containerd, CRI-O and podman use 64 digits).
	ContainerID string
	// PodUID is the Kubernetes pod UID in its API form: a dashed UUID, or
	// 32 hex digits for a static pod (the kubelet's config hash).
	PodUID string
	// SlurmJobID is the decimal Slurm job ID.
	SlurmJobID string
}

const (
	// maxCgroupLines bounds the lines examined; cgroup v1 has about 15.
	maxCgroupLines = 64
	// maxCgroupPath bounds the length of a path examined (PATH_MAX).
	maxCgroupPath = 4096
)

// ParseCgroup reads the content of /proc/<pid>/cgroup (v1, v2 or hybrid)
// and finds the container, Kubernetes pod and Slurm job it names. Input that
// is not a cgroup file yields an empty CgroupInfo; it never panics.
func ParseCgroup(content string) CgroupInfo {
	var (
		best     CgroupInfo
		bestRank = -1
		fallback cgroupLine
		haveFall bool
	)
	for i, raw := range strings.SplitN(content, "\n", maxCgroupLines+1) {
		if i == maxCgroupLines {
			break
		}
		line, ok := parseCgroupLine(raw)
		if !ok {
			continue
		}
		if !haveFall || line.rank() < fallback.rank() {
			fallback, haveFall = line, true
		}
		info := parseCgroupPath(line.path)
		if info.ContainerID == "" && info.PodUID == "" && info.SlurmJobID == "" {
			continue
		}
		// More IDs win; among equals, the preferred controller.
		rank := info.score()*16 - line.rank()
		if rank > bestRank {
			best, bestRank = info, rank
		}
	}
	if bestRank >= 0 {
		return best
	}
	if haveFall {
		return CgroupInfo{Path: fallback.path}
	}
	return CgroupInfo{}
}

// score counts the IDs found.
func (c CgroupInfo) score() int {
	n := 0
	for _, s := range []string{c.ContainerID, c.PodUID, c.SlurmJobID} {
		if s != "" {
			n++
		}
	}
	return n
}

// cgroupLine is one "hierarchy-ID:controller-list:cgroup-path" line.
type cgroupLine struct {
	controllers string
	path        string
}

func parseCgroupLine(raw string) (cgroupLine, bool) {
	raw = strings.TrimSuffix(raw, "\r")
	hierarchy, rest, ok := strings.Cut(raw, ":")
	if !ok || hierarchy == "" || !isDigits(hierarchy) {
		return cgroupLine{}, false
	}
	controllers, path, ok := strings.Cut(rest, ":")
	if !ok || !strings.HasPrefix(path, "/") || len(path) > maxCgroupPath {
		return cgroupLine{}, false
	}
	// The path is a label value and a log field: keep it valid UTF-8.
	path = strings.ToValidUTF8(path, "\uFFFD")
	return cgroupLine{controllers: controllers, path: path}, true
}

// rank orders the lines by how well they describe the process: the unified
// hierarchy (the only one with no controller list), then memory (what a GPU exporter is about), pids, cpu, the
// systemd named hierarchy, the rest. Lower is better.
func (l cgroupLine) rank() int {
	if l.controllers == "" {
		return 0
	}
	best := 6
	for _, c := range strings.Split(l.controllers, ",") {
		r := 5
		switch c {
		case "memory":
			r = 1
		case "pids":
			r = 2
		case "cpu", "cpuacct":
			r = 3
		case "name=systemd":
			r = 4
		}
		best = min(best, r)
	}
	return best
}

// parseCgroupPath finds the IDs in one cgroup path. Where a path names
// several containers (a kind node is a Docker container that runs pods),
// the innermost one wins: that is the container the process runs in.
func parseCgroupPath(path string) CgroupInfo {
	info := CgroupInfo{Path: path}
	components := strings.Split(path, "/")
	kubepods, slurm := false, false
	for _, comp := range components {
		if comp == "" || comp == "." || comp == ".." {
			continue
		}
		if strings.Contains(comp, "kubepods") {
			kubepods = true
		}
		if isSlurmComponent(comp) {
			slurm = true
			continue
		}
		if slurm {
			if id, ok := strings.CutPrefix(comp, "job_"); ok && isDigits(id) && len(id) <= 20 {
				info.SlurmJobID = id
				slurm = false
				continue
			}
		}
		// containerd on cgroup v1 with a systemd-style cgroupsPath writes
		// "kubepods-burstable-pod<uid>.slice:cri-containerd:<id>".
		for part := range strings.SplitSeq(comp, ":") {
			if uid, ok := podUIDFromComponent(part, kubepods); ok {
				info.PodUID = uid
				continue
			}
			if id, ok := containerIDFromComponent(part); ok {
				info.ContainerID = id
			}
		}
	}
	return info
}

// isSlurmComponent reports whether comp is where Slurm puts its jobs:
// "slurm" or "slurm_<node>" on cgroup v1, "slurmstepd.scope" or
// "<node>_slurmstepd.scope" on cgroup v2.
func isSlurmComponent(comp string) bool {
	return comp == "slurm" || strings.HasPrefix(comp, "slurm_") ||
		strings.HasSuffix(comp, "slurmstepd.scope")
}

// podUIDFromComponent reads a pod UID from a kubelet cgroup name:
// "pod<uid>" (cgroupfs driver, below a kubepods cgroup) or
// "<parent>-pod<uid_with_underscores>.slice" (systemd driver).
func podUIDFromComponent(comp string, underKubepods bool) (string, bool) {
	var raw string
	if name, ok := strings.CutSuffix(comp, ".slice"); ok {
		i := strings.LastIndex(name, "-pod")
		if i < 0 || !strings.Contains(name[:i], "kubepods") {
			return "", false
		}
		raw = name[i+len("-pod"):]
	} else if rest, ok := strings.CutPrefix(comp, "pod"); ok && underKubepods {
		raw = rest
	} else {
		return "", false
	}
	// systemd reserves "-" as the slice hierarchy separator, so the kubelet
	// writes the UID's dashes as underscores.
	uid := strings.ReplaceAll(raw, "_", "-")
	if isUUID(uid) || (len(uid) == 32 && isLowerHex(uid)) {
		return uid, true
	}
	return "", false
}

// runtimePrefixes are the names that container runtimes put before a
// container ID in a cgroup name ("docker-<id>.scope", "crio-<id>").
var runtimePrefixes = []string{"docker", "cri-containerd", "containerd", "crio", "libpod", "nerdctl", "cri-dockerd"}

// containerIDFromComponent reads a container ID from a cgroup name:
// "<runtime>-<id>.scope" (systemd driver), "<runtime>-<id>" or a bare
// "<id>" (cgroupfs driver). A bare ID must be 64 hex digits; after a known
// runtime prefix, 32 to 64 are accepted. Monitor processes such as
// "crio-conmon-<id>.scope" and "libpod-conmon-<id>.scope" are not
// containers.
func containerIDFromComponent(comp string) (string, bool) {
	name := strings.TrimSuffix(comp, ".scope")
	if len(name) == 64 && isLowerHex(name) {
		return name, true
	}
	i := strings.LastIndexByte(name, '-')
	if i <= 0 {
		return "", false
	}
	prefix, id := name[:i], name[i+1:]
	if !isKnownRuntime(prefix) {
		// An unknown prefix is accepted only with a full-length ID, and
		// never for a runtime's monitor process.
		if len(id) != 64 || strings.HasSuffix(prefix, "conmon") {
			return "", false
		}
	}
	if len(id) < 32 || len(id) > 64 || !isLowerHex(id) {
		return "", false
	}
	return id, true
}

func isKnownRuntime(prefix string) bool {
	for _, p := range runtimePrefixes {
		if prefix == p {
			return true
		}
	}
	return false
}

// IsContainerID reports whether s has the form ParseCgroup gives a
// container ID: 32 to 64 lowercase hex digits.
func IsContainerID(s string) bool {
	return len(s) >= 32 && len(s) <= 64 && isLowerHex(s)
}

// IsPodUID reports whether s has the form ParseCgroup gives a pod UID: a
// lowercase dashed UUID or 32 lowercase hex digits.
func IsPodUID(s string) bool {
	return isUUID(s) || (len(s) == 32 && isLowerHex(s))
}

// isUUID reports whether s is a lowercase 8-4-4-4-12 UUID.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isLowerHexByte(s[i]) {
				return false
			}
		}
	}
	return true
}

func isLowerHex(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isLowerHexByte(s[i]) {
			return false
		}
	}
	return true
}

func isLowerHexByte(b byte) bool {
	return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f')
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
