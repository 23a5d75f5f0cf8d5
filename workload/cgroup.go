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

// parseCgroupPath finds the IDs in one cgroup path. A pod or Slurm job is
// named only from where the kubelet or slurmd puts it, which only root can
// create: the kubelet's hierarchy of slices from the root of the path
// (systemd driver), or /kubepods (cgroupfs driver); Slurm's scope below a
// slice at the root (v2), or /slurm (v1). The same names anywhere else (a
// user's delegated subtree, a container with a writable cgroupfs, a nested
// runtime) name nothing. A container ID outside Kubernetes is the innermost
// one in the path (a Docker in Docker container runs in the inner one),
// never one below a user's own systemd instance (user@<uid>.service),
// where the user names the cgroups.
func parseCgroupPath(path string) CgroupInfo {
	info := CgroupInfo{Path: path}
	comps, ok := pathComponents(path)
	if !ok {
		return info
	}
	if pod, container, ok := kubeletLayout(comps); ok {
		info.PodUID, info.ContainerID = pod, container
		return info
	}
	if job, ok := slurmJob(comps); ok {
		info.SlurmJobID = job
		return info
	}
	for _, comp := range comps {
		if isUserManager(comp) {
			break
		}
		for part := range strings.SplitSeq(comp, ":") {
			if id, ok := containerIDFromComponent(part); ok {
				info.ContainerID = id
			}
		}
	}
	return info
}

// pathComponents splits a cgroup path into its names. Leading ".."
// (a path relative to the reader's cgroup namespace, which lies below the
// kubelet's pod cgroups) are kept, so that a path never passes for one
// from the root; ".." anywhere else is not a path the kernel writes.
func pathComponents(path string) ([]string, bool) {
	var comps []string
	leading := true
	for comp := range strings.SplitSeq(path, "/") {
		switch {
		case comp == "" || comp == ".":
			continue
		case comp == "..":
			if !leading {
				return nil, false
			}
		default:
			leading = false
		}
		comps = append(comps, comp)
	}
	return comps, true
}

// kubeletLayout reads the pod UID and the container ID from a path in the
// kubelet's layout:
//
//	/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/<runtime>-<id>.scope
//	/<root>.slice/<root>-kubepods.slice/…-pod<uid>.slice/…   (--cgroup-root, as kind's)
//	/kubepods/<qos>/pod<uid>/<id>                             (cgroupfs driver)
//	/kubepods-<qos>-pod<uid>.slice:<runtime>:<id>             (containerd, v1, systemd cgroupsPath)
//
// With the systemd driver every cgroup from the root to the pod's is a
// slice whose name extends its parent's, as systemd requires, and one of
// them names kubepods. In a cgroup namespace (the path starts with "..":
// the reader sits in a pod's container) the first name after them must be
// a slice that names kubepods: every cgroup that the ".." reach is one the
// kubelet made. The container is the cgroup right below the pod's, where
// the runtime puts it; what lies deeper (a runtime in the container) does
// not change it.
func kubeletLayout(comps []string) (podUID, containerID string, ok bool) {
	relative := false
	for len(comps) > 0 && comps[0] == ".." {
		comps, relative = comps[1:], true
	}
	if len(comps) == 0 {
		return "", "", false
	}
	if !relative && comps[0] == "kubepods" { // cgroupfs driver
		i := 1
		if i < len(comps) && (comps[i] == "burstable" || comps[i] == "besteffort") {
			i++
		}
		if i >= len(comps) {
			return "", "", false
		}
		rest, ok := strings.CutPrefix(comps[i], "pod")
		if !ok || !isPodUID(rest) {
			return "", "", false
		}
		return rest, containerBelow(comps[i+1:]), true
	}
	// systemd driver: a chain of slices.
	parent := ""
	kubepods := false
	for i, comp := range comps {
		first, more, hasMore := strings.Cut(comp, ":")
		name, isSlice := strings.CutSuffix(first, ".slice")
		if !isSlice || (parent != "" && !strings.HasPrefix(name, parent+"-")) {
			return "", "", false
		}
		for e := range strings.SplitSeq(name, "-") {
			kubepods = kubepods || e == "kubepods"
		}
		if relative && i == 0 && !kubepods {
			return "", "", false
		}
		if uid, ok := podUIDFromComponent(first); ok && kubepods {
			if hasMore { // "<pod slice>:<runtime>:<id>"
				return uid, containerBelow([]string{more}), true
			}
			return uid, containerBelow(comps[i+1:]), true
		}
		if hasMore {
			return "", "", false
		}
		parent = name
	}
	return "", "", false
}

// containerBelow is the container ID of the first of comps, the cgroup
// right below a pod's, or "".
func containerBelow(comps []string) string {
	if len(comps) == 0 {
		return ""
	}
	id := ""
	for part := range strings.SplitSeq(comps[0], ":") {
		if c, ok := containerIDFromComponent(part); ok {
			id = c
		}
	}
	return id
}

// slurmJob reads the job ID from a path where slurmd puts its jobs:
// cgroup v2 "/system.slice/slurmstepd.scope/job_<id>" (the scope also
// "<node>_slurmstepd.scope" with several slurmd on one host, and below
// any slice at the root), cgroup v1 "/slurm/uid_<uid>/job_<id>" (also
// "/slurm_<node>/").
func slurmJob(comps []string) (string, bool) {
	if len(comps) < 3 {
		return "", false
	}
	var job string
	switch {
	case comps[0] == "slurm" || strings.HasPrefix(comps[0], "slurm_"): // v1
		uid, ok := strings.CutPrefix(comps[1], "uid_")
		if !ok || !isDigits(uid) {
			return "", false
		}
		job = comps[2]
	case strings.HasSuffix(comps[0], ".slice") && !strings.Contains(comps[0], "-") &&
		(comps[1] == "slurmstepd.scope" || strings.HasSuffix(comps[1], "_slurmstepd.scope")): // v2
		job = comps[2]
	default:
		return "", false
	}
	id, ok := strings.CutPrefix(job, "job_")
	if !ok || !isDigits(id) || len(id) > 20 {
		return "", false
	}
	return id, true
}

// isUserManager reports whether comp is a user's systemd instance
// (user@<uid>.service), below which the user creates cgroups at will.
func isUserManager(comp string) bool {
	return strings.HasPrefix(comp, "user@") && strings.HasSuffix(comp, ".service")
}

// podUIDFromComponent reads a pod UID from the name of the kubelet's pod
// slice (systemd driver), "<parent>-pod<uid_with_underscores>.slice".
func podUIDFromComponent(comp string) (string, bool) {
	name, ok := strings.CutSuffix(comp, ".slice")
	if !ok {
		return "", false
	}
	i := strings.LastIndex(name, "-pod")
	if i < 0 {
		return "", false
	}
	// systemd reserves "-" as the slice hierarchy separator, so the kubelet
	// writes the UID's dashes as underscores.
	uid := strings.ReplaceAll(name[i+len("-pod"):], "_", "-")
	return uid, isPodUID(uid)
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
	if !isContainerID(id) {
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

// isContainerID reports whether s has the form ParseCgroup gives a
// container ID: 32 to 64 lowercase hex digits.
func isContainerID(s string) bool {
	return len(s) >= 32 && len(s) <= 64 && isLowerHex(s)
}

// isPodUID reports whether s has the form ParseCgroup gives a pod UID: a
// lowercase dashed UUID or 32 lowercase hex digits.
func isPodUID(s string) bool {
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
