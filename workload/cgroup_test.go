package workload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// Fixture IDs: sha256 of "a".."g", two UUIDs and a static pod's hash.
const (
	idA = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
	idB = "3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d"
	idC = "2e7d2c03a9507ae265ecf5b5356885a53393a2029d241394997265a1a25aefc6"
	idD = "18ac3e7343f016890c510e93f935261169d9e3f565436429830faf0934f4f8e4"
	idE = "3f79bb7b435b05321651daefd374cdc681dc06faa65e374e38337b88ca046dea"
	idF = "252f10c83610ebca1a059c0bae8255eba2f95be4d1d7bcfa89d7248a82d9f111"
	idG = "cd0aa9856147b6c5b4ff2b7dfee5da20aa38253099ef1b4a64aced233c9afe29"

	podU      = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
	podUSlice = "1b2c3d4e_5f60_4a7b_8c9d_0e1f2a3b4c5d"
	podV      = "e00dcbd6-facc-5d2d-9da1-eee11a20fe71"
	podVSlice = "e00dcbd6_facc_5d2d_9da1_eee11a20fe71"
	podStatic = "a81259cef8e959c624df1d456e5d3297"
)

func TestParseCgroupFixtures(t *testing.T) {
	burstableU := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUSlice + ".slice"
	tests := []struct {
		file string
		want CgroupInfo
	}{
		// Kubernetes, cgroup v2.
		{"v2-containerd-systemd-burstable.txt", CgroupInfo{Path: burstableU + "/cri-containerd-" + idA + ".scope", ContainerID: idA, PodUID: podU}},
		{"v2-containerd-systemd-guaranteed.txt", CgroupInfo{Path: "/kubepods.slice/kubepods-pod" + podVSlice + ".slice/cri-containerd-" + idB + ".scope", ContainerID: idB, PodUID: podV}},
		{"v2-containerd-cgroupfs.txt", CgroupInfo{Path: "/kubepods/burstable/pod" + podU + "/" + idA, ContainerID: idA, PodUID: podU}},
		{"v2-crio-systemd.txt", CgroupInfo{Path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + podUSlice + ".slice/crio-" + idC + ".scope", ContainerID: idC, PodUID: podU}},
		{"v2-crio-conmon.txt", CgroupInfo{Path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + podUSlice + ".slice/crio-conmon-" + idC + ".scope", PodUID: podU}},
		{"v2-crio-container-subcgroup.txt", CgroupInfo{Path: burstableU + "/crio-" + idC + ".scope/container", ContainerID: idC, PodUID: podU}},
		{"v2-pod-level.txt", CgroupInfo{Path: burstableU, PodUID: podU}},
		{"v2-static-pod.txt", CgroupInfo{Path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podStatic + ".slice/cri-containerd-" + idA + ".scope", ContainerID: idA, PodUID: podStatic}},
		{"v2-cgroupns-relative.txt", CgroupInfo{Path: "/../../../kubepods-burstable.slice/kubepods-burstable-pod" + podUSlice + ".slice/cri-containerd-" + idA + ".scope", ContainerID: idA, PodUID: podU}},
		// Seen from the host, a kind node's pods are below a Docker
		// container, whose cgroupfs is writable: no pod there.
		{"v2-kind-from-host.txt", CgroupInfo{Path: "/system.slice/docker-" + idE + ".scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + podVSlice + ".slice/cri-containerd-" + idF + ".scope", ContainerID: idF}},
		{"v2-kind-from-node.txt", CgroupInfo{Path: "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod" + podVSlice + ".slice/cri-containerd-" + idF + ".scope", ContainerID: idF, PodUID: podV}},
		// Containers outside Kubernetes.
		{"v2-docker-systemd.txt", CgroupInfo{Path: "/system.slice/docker-" + idD + ".scope", ContainerID: idD}},
		// Below user@<uid>.service the user names the cgroups: no ID.
		{"v2-podman-rootless.txt", CgroupInfo{Path: "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + idG + ".scope/container"}},
		{"v2-podman-conmon.txt", CgroupInfo{Path: "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-conmon-" + idG + ".scope"}},
		// Slurm, cgroup v2.
		{"v2-slurm.txt", CgroupInfo{Path: "/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0", SlurmJobID: "1234"}},
		{"v2-slurm-batch.txt", CgroupInfo{Path: "/system.slice/slurmstepd.scope/job_98765/step_batch/user/task_0", SlurmJobID: "98765"}},
		{"v2-slurm-multiple-slurmd.txt", CgroupInfo{Path: "/system.slice/gpu-node-01_slurmstepd.scope/job_42/step_extern/user/task_special", SlurmJobID: "42"}},
		{"v2-slurmstepd-itself.txt", CgroupInfo{Path: "/system.slice/slurmstepd.scope/system"}},
		// Plain processes.
		{"v2-user-session.txt", CgroupInfo{Path: "/user.slice/user-1000.slice/session-3.scope"}},
		{"v2-init.txt", CgroupInfo{Path: "/init.scope"}},
		{"v2-gpu-vm-process-api.txt", CgroupInfo{Path: "/process_api/3f2a9c"}},
		{"v2-root.txt", CgroupInfo{Path: "/"}},
		{"v2-systemd-service-pod-name.txt", CgroupInfo{Path: "/system.slice/pod" + podU}},
		// cgroup v1 and hybrid: the memory controller's line, or the
		// unified line where it names the container too.
		{"v1-containerd-cgroupfs.txt", CgroupInfo{Path: "/kubepods/burstable/pod" + podU + "/" + idA, ContainerID: idA, PodUID: podU}},
		{"v1-containerd-systemd-hybrid.txt", CgroupInfo{Path: burstableU + "/cri-containerd-" + idA + ".scope", ContainerID: idA, PodUID: podU}},
		{"v1-containerd-cgroupspath-mismatch.txt", CgroupInfo{Path: "/kubepods-burstable-pod" + podUSlice + ".slice:cri-containerd:" + idA, ContainerID: idA, PodUID: podU}},
		{"v1-crio-cgroupfs.txt", CgroupInfo{Path: "/kubepods/besteffort/pod" + podU + "/crio-" + idC, ContainerID: idC, PodUID: podU}},
		{"v1-static-pod-cgroupfs.txt", CgroupInfo{Path: "/kubepods/burstable/pod" + podStatic + "/" + idA, ContainerID: idA, PodUID: podStatic}},
		{"v1-docker-cgroupfs.txt", CgroupInfo{Path: "/docker/" + idD, ContainerID: idD}},
		{"v1-docker-systemd.txt", CgroupInfo{Path: "/system.slice/docker-" + idD + ".scope", ContainerID: idD}},
		{"v1-docker-in-docker.txt", CgroupInfo{Path: "/docker/" + idD + "/docker/" + idE, ContainerID: idE}},
		{"v1-slurm.txt", CgroupInfo{Path: "/slurm/uid_1000/job_1234/step_0/task_0", SlurmJobID: "1234"}},
		{"v1-slurm-multiple-slurmd.txt", CgroupInfo{Path: "/slurm_gpu-node-01/uid_1000/job_77/step_batch/task_0", SlurmJobID: "77"}},
		{"v1-user-session.txt", CgroupInfo{Path: "/user.slice/user-1000.slice/session-3.scope"}},
	}
	covered := map[string]bool{}
	for _, tt := range tests {
		covered[tt.file] = true
		t.Run(strings.TrimSuffix(tt.file, ".txt"), func(t *testing.T) {
			content, err := os.ReadFile(filepath.Join("testdata", "cgroup", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			if got := ParseCgroup(string(content)); got != tt.want {
				t.Errorf("ParseCgroup(%s)\n got %+v\nwant %+v", tt.file, got, tt.want)
			}
		})
	}
	files, err := filepath.Glob(filepath.Join("testdata", "cgroup", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !covered[filepath.Base(f)] {
			t.Errorf("fixture %s has no expectation in this table", f)
		}
	}
}

func TestParseCgroupOddInput(t *testing.T) {
	long := "0::/" + strings.Repeat("a/", 1<<20)
	tests := []struct {
		name    string
		content string
		want    CgroupInfo
	}{
		{"empty", "", CgroupInfo{}},
		{"newline only", "\n\n", CgroupInfo{}},
		{"garbage", "hello world\nnot:a cgroup\n", CgroupInfo{}},
		{"binary", "\x00\x01\xff\xfe:\x00:/\xff", CgroupInfo{}},
		{"hierarchy not a number", "x::/docker/" + idD + "\n", CgroupInfo{}},
		{"path not absolute", "0::docker/" + idD + "\n", CgroupInfo{}},
		{"missing path field", "0:memory\n", CgroupInfo{}},
		{"path longer than PATH_MAX is ignored", long + "docker-" + idD + ".scope\n", CgroupInfo{}},
		{"CRLF line ends", "0::/system.slice/docker-" + idD + ".scope\r\n", CgroupInfo{Path: "/system.slice/docker-" + idD + ".scope", ContainerID: idD}},
		{"no trailing newline", "0::/docker/" + idD, CgroupInfo{Path: "/docker/" + idD, ContainerID: idD}},
		{"invalid UTF-8 in the path is replaced", "0::/user.slice/\xffbad", CgroupInfo{Path: "/user.slice/\uFFFDbad"}},
		{"uppercase hex is not an ID", "0::/docker/" + strings.ToUpper(idD) + "\n", CgroupInfo{Path: "/docker/" + strings.ToUpper(idD)}},
		{"63 hex digits are not a bare ID", "0::/docker/" + idD[:63] + "\n", CgroupInfo{Path: "/docker/" + idD[:63]}},
		{"a runtime prefix accepts 32 hex digits", "0::/system.slice/docker-" + idD[:32] + ".scope\n", CgroupInfo{Path: "/system.slice/docker-" + idD[:32] + ".scope", ContainerID: idD[:32]}},
		{"a runtime prefix refuses short IDs", "0::/system.slice/docker-3f2a9c.scope\n", CgroupInfo{Path: "/system.slice/docker-3f2a9c.scope"}},
		{"an unknown prefix needs 64 hex digits", "0::/system.slice/foo-" + idD[:40] + ".scope\n", CgroupInfo{Path: "/system.slice/foo-" + idD[:40] + ".scope"}},
		{"pod UID outside kubepods is ignored", "0::/machine.slice/pod" + podU + "/" + idA + "\n", CgroupInfo{Path: "/machine.slice/pod" + podU + "/" + idA, ContainerID: idA}},
		{"malformed pod UID is ignored", "0::/kubepods.slice/kubepods-pod1234.slice\n", CgroupInfo{Path: "/kubepods.slice/kubepods-pod1234.slice"}},
		{"job outside Slurm is ignored", "0::/system.slice/batch/job_1234\n", CgroupInfo{Path: "/system.slice/batch/job_1234"}},
		{"non-numeric Slurm job is ignored", "0::/system.slice/slurmstepd.scope/job_abc/step_0\n", CgroupInfo{Path: "/system.slice/slurmstepd.scope/job_abc/step_0"}},
		{"unified line wins over v1 lines without IDs", "4:memory:/user.slice\n0::/init.scope\n", CgroupInfo{Path: "/init.scope"}},
		{"memory line is the fallback on v1", "4:cpu,cpuacct:/a\n3:memory:/b\n1:name=systemd:/c\n", CgroupInfo{Path: "/b"}},
		{"a line with more IDs wins", "11:memory:/kubepods/pod" + podU + "\n1:name=systemd:/kubepods/pod" + podU + "/" + idA + "\n", CgroupInfo{Path: "/kubepods/pod" + podU + "/" + idA, ContainerID: idA, PodUID: podU}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseCgroup(tt.content); got != tt.want {
				t.Errorf("ParseCgroup(%.80q)\n got %+v\nwant %+v", tt.content, got, tt.want)
			}
		})
	}
}

// TestParseCgroupNamesPodsAndJobsOnlyWhereTheKubeletAndSlurmdPutThem: the
// IDs are world-readable in /proc/<pid>/cgroup, and a user with a cgroup
// subtree of their own (systemd's user@.service delegates one, a container
// with a writable cgroupfs, a nested runtime) can create a cgroup of any
// name in it and move a process there.
func TestParseCgroupNamesPodsAndJobsOnlyWhereTheKubeletAndSlurmdPutThem(t *testing.T) {
	victimPod := "kubepods-besteffort-pod" + podVSlice + ".slice/cri-containerd-" + idF + ".scope"
	tests := []struct {
		name string
		path string
		want CgroupInfo
	}{
		{"a pod below a user's delegated subtree", "/user.slice/user-1000.slice/user@1000.service/" + victimPod, CgroupInfo{}},
		{"a pod's whole hierarchy below a user's delegated subtree", "/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods.slice/kubepods-besteffort.slice/" + victimPod, CgroupInfo{}},
		{"a cgroupfs pod below a user's delegated subtree", "/user.slice/user-1000.slice/user@1000.service/kubepods/besteffort/pod" + podV + "/" + idF, CgroupInfo{}},
		{"a Slurm job below a user's delegated subtree", "/user.slice/user-1000.slice/user@1000.service/n1_slurmstepd.scope/job_4242", CgroupInfo{}},
		{"a Slurm v1 job below a user's delegated subtree", "/user.slice/user-1000.slice/user@1000.service/slurm/uid_1000/job_4242", CgroupInfo{}},
		{"a pod below a delegated system service", "/system.slice/runner.service/kubepods.slice/kubepods-besteffort.slice/" + victimPod, CgroupInfo{ContainerID: idF}},
		{"a Slurm job below a delegated system service", "/system.slice/runner.service/slurmstepd.scope/job_4242", CgroupInfo{}},
		{"a pod seen from a cgroup namespace, below a user's subtree", "/../../../../user.slice/user-1000.slice/user@1000.service/" + victimPod, CgroupInfo{}},
		{"another pod's cgroup made inside a pod's container", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUSlice + ".slice/cri-containerd-" + idA + ".scope/" + victimPod, CgroupInfo{PodUID: podU, ContainerID: idA}},
		{"another pod's cgroup made inside a pod's container, cgroupfs", "/kubepods/burstable/pod" + podU + "/" + idA + "/kubepods/besteffort/pod" + podV + "/" + idF, CgroupInfo{PodUID: podU, ContainerID: idA}},
		{"a slice chain broken by a foreign slice", "/kubepods.slice/other.slice/" + victimPod, CgroupInfo{ContainerID: idF}},
		{"a pod slice with no kubepods above it", "/machine.slice/machine-pod" + podVSlice + ".slice/cri-containerd-" + idF + ".scope", CgroupInfo{ContainerID: idF}},
		{"a Slurm job inside a job's task cgroup", "/system.slice/slurmstepd.scope/job_1/step_0/user/task_0/slurmstepd.scope/job_2", CgroupInfo{SlurmJobID: "1"}},
		{"a parent reference inside the path", "/user.slice/../kubepods.slice/" + victimPod, CgroupInfo{}},
		{"a Slurm v1 job without the uid level", "/slurm/job_4242/step_0", CgroupInfo{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.want.Path = tt.path
			if got := ParseCgroup("0::" + tt.path + "\n"); got != tt.want {
				t.Errorf("ParseCgroup(%s)\n got %+v\nwant %+v", tt.path, got, tt.want)
			}
		})
	}
}

func TestParseCgroupManyLinesStopsEarly(t *testing.T) {
	content := strings.Repeat("4:memory:/user.slice\n", maxCgroupLines) + "0::/docker/" + idD + "\n"
	if got := ParseCgroup(content); got.ContainerID != "" {
		t.Errorf("ParseCgroup read past %d lines: got container %q", maxCgroupLines, got.ContainerID)
	}
}

func FuzzParseCgroup(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "cgroup", "*.txt"))
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		content, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(content))
	}
	for _, seed := range []string{
		"", "0::/", "0::", ":::", "0::/kubepods-pod_.slice/cri-containerd-.scope",
		"0::/slurm/job_", "1:name=systemd:/docker/" + idD + ":" + idE,
		"0::/kubepods/pod" + podU + "/crio-conmon-" + idC,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, content string) {
		got := ParseCgroup(content)
		if got.ContainerID != "" && !isContainerID(got.ContainerID) {
			t.Errorf("container ID %q is not 32 to 64 lowercase hex digits", got.ContainerID)
		}
		if got.PodUID != "" && !isPodUID(got.PodUID) {
			t.Errorf("pod UID %q is neither a UUID nor a static pod hash", got.PodUID)
		}
		if got.SlurmJobID != "" && (!isDigits(got.SlurmJobID) || len(got.SlurmJobID) > 20) {
			t.Errorf("Slurm job ID %q is not a decimal number", got.SlurmJobID)
		}
		if !utf8.ValidString(got.Path) {
			t.Errorf("path %q is not valid UTF-8", got.Path)
		}
		if (got.ContainerID != "" || got.PodUID != "" || got.SlurmJobID != "") && !strings.HasPrefix(got.Path, "/") {
			t.Errorf("IDs found but path %q is not a cgroup path", got.Path)
		}
	})
}
