package pods

import (
	"testing"

	"github.com/gpumem/gpumem_exporter/internal/procfixture"
	"github.com/gpumem/gpumem_exporter/workload"
)

const podUSlice = "1b2c3d4e_5f60_4a7b_8c9d_0e1f2a3b4c5d"

// TestAttributionEndToEnd runs what the exporter runs on a GPU node: a
// procfs tree, a pod watch, then Refresh and Lookup as the poller and the
// scrapes call them.
func TestAttributionEndToEnd(t *testing.T) {
	const (
		trainerPid = 4001 // pod ml/trainer-0, containerd, cgroup v2 systemd
		serverPid  = 4002 // pod infer/server-1, CRI-O, cgroup v1 cgroupfs; same GPU as trainerPid
		slurmPid   = 4003
		plainPid   = 4004
		gonePid    = 4005 // listed by NVML, already gone from /proc
	)
	proc := t.TempDir()
	procfixture.Write(t, proc, trainerPid, procfixture.Process{Comm: "pt_main_thread", Start: 1000, UID: "1000",
		Cgroup: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUSlice + ".slice/cri-containerd-" + idA + ".scope\n"})
	procfixture.Write(t, proc, serverPid, procfixture.Process{Comm: "tritonserver", Start: 1100, UID: "0",
		Cgroup: "11:memory:/kubepods/besteffort/pod" + podV + "/crio-" + idC + "\n" +
			"3:cpu,cpuacct:/kubepods/besteffort/pod" + podV + "/crio-" + idC + "\n" +
			"1:name=systemd:/kubepods/besteffort/pod" + podV + "/crio-" + idC + "\n"})
	procfixture.Write(t, proc, slurmPid, procfixture.Process{Comm: "python", Start: 1200, UID: "2001",
		Cgroup: "0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n"})
	procfixture.Write(t, proc, plainPid, procfixture.Process{Comm: "blender", Start: 1300, UID: "1000",
		Cgroup: "0::/user.slice/user-1000.slice/session-3.scope\n"})

	source := newPodSource(
		newPod("ml", "trainer-0", podU, withContainers(status("pytorch", "containerd://"+idA))),
		newPod("infer", "server-1", podV, withContainers(status("triton", "cri-o://"+idC))),
	)
	pods, _ := startInformer(t, source)
	r := workload.NewProcResolver(proc, pods, nil)
	r.Refresh([]uint32{trainerPid, serverPid, slurmPid, plainPid, gonePid})

	tests := []struct {
		name string
		pid  uint32
		want workload.Info
	}{
		{"a pod's process is named by namespace, pod and container", trainerPid, workload.Info{
			PID: trainerPid, StartTime: 1000, Comm: "pt_main_thread", UID: "1000",
			Cgroup:      "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUSlice + ".slice/cri-containerd-" + idA + ".scope",
			ContainerID: idA, PodUID: podU, Namespace: "ml", Pod: "trainer-0", Container: "pytorch",
		}},
		{"another pod on the same GPU is attributed separately", serverPid, workload.Info{
			PID: serverPid, StartTime: 1100, Comm: "tritonserver", UID: "0",
			Cgroup:      "/kubepods/besteffort/pod" + podV + "/crio-" + idC,
			ContainerID: idC, PodUID: podV, Namespace: "infer", Pod: "server-1", Container: "triton",
		}},
		{"a Slurm step gets its job ID", slurmPid, workload.Info{
			PID: slurmPid, StartTime: 1200, Comm: "python", UID: "2001",
			Cgroup: "/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0", SlurmJobID: "1234",
		}},
		{"a plain process gets only comm and uid", plainPid, workload.Info{
			PID: plainPid, StartTime: 1300, Comm: "blender", UID: "1000",
			Cgroup: "/user.slice/user-1000.slice/session-3.scope",
		}},
		{"a vanished process has only its pid", gonePid, workload.Info{PID: gonePid}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := r.Lookup(tt.pid)
			if !ok || got != tt.want {
				t.Errorf("Lookup(%d) =\n %+v, %v\nwant\n %+v, true", tt.pid, got, ok, tt.want)
			}
		})
	}

	t.Run("a reused pid is detected on the next Refresh", func(t *testing.T) {
		procfixture.Write(t, proc, trainerPid, procfixture.Process{Comm: "nvidia-smi", Start: 5000, UID: "0",
			Cgroup: "0::/user.slice/user-0.slice/session-9.scope\n"})
		r.Refresh([]uint32{trainerPid, serverPid})
		got, _ := r.Lookup(trainerPid)
		want := workload.Info{PID: trainerPid, StartTime: 5000, Comm: "nvidia-smi", UID: "0", Cgroup: "/user.slice/user-0.slice/session-9.scope"}
		if got != want {
			t.Errorf("after reuse, Lookup(%d) =\n %+v\nwant\n %+v", trainerPid, got, want)
		}
		if got, _ := r.Lookup(serverPid); got.Pod != "server-1" {
			t.Errorf("the other pod's process lost its pod: %+v", got)
		}
		if _, ok := r.Lookup(slurmPid); ok {
			t.Error("a pid no longer listed is still resolved")
		}
	})
}

// TestAttributionIgnoresAVictimsIDsInADelegatedSubtree: a user with a
// cgroup subtree of their own (systemd's user@.service with Delegate=yes)
// makes cgroups named after a victim's pod and container, or a Slurm job,
// and moves a process there. The victim's pod UID and container ID are
// world-readable in /proc/<pid>/cgroup. The process gets none of the
// victim's names, and no ID that a pod, an Event or an alert would follow.
func TestAttributionIgnoresAVictimsIDsInADelegatedSubtree(t *testing.T) {
	const (
		victimPid   = 4101
		podAttacker = 4102
		jobAttacker = 4103
		nestedPid   = 4104 // a pod's container with a writable cgroupfs
	)
	podVSlice := "e00dcbd6_facc_5d2d_9da1_eee11a20fe71"
	victimCgroup := "kubepods-besteffort-pod" + podVSlice + ".slice/cri-containerd-" + idF + ".scope"
	proc := t.TempDir()
	procfixture.Write(t, proc, victimPid, procfixture.Process{Comm: "python3", Start: 1000, UID: "1001",
		Cgroup: "0::/kubepods.slice/kubepods-besteffort.slice/" + victimCgroup + "\n"})
	procfixture.Write(t, proc, podAttacker, procfixture.Process{Comm: "python3", Start: 1100, UID: "1000",
		Cgroup: "0::/user.slice/user-1000.slice/user@1000.service/" + victimCgroup + "\n"})
	procfixture.Write(t, proc, jobAttacker, procfixture.Process{Comm: "python3", Start: 1200, UID: "1000",
		Cgroup: "0::/user.slice/user-1000.slice/user@1000.service/n1_slurmstepd.scope/job_4242\n"})
	procfixture.Write(t, proc, nestedPid, procfixture.Process{Comm: "python3", Start: 1300, UID: "0",
		Cgroup: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + podUSlice + ".slice/cri-containerd-" + idA + ".scope/" + victimCgroup + "\n"})

	source := newPodSource(
		newPod("ml", "bert-finetune-0", podV, withContainers(status("trainer", "containerd://"+idF))),
		newPod("dev", "sandbox-0", podU, withContainers(status("shell", "containerd://"+idA))),
	)
	pods, _ := startInformer(t, source)
	r := workload.NewProcResolver(proc, pods, nil)
	r.Refresh([]uint32{victimPid, podAttacker, jobAttacker, nestedPid})

	tests := []struct {
		name string
		pid  uint32
		want [6]string // namespace, pod, container, pod UID, container ID, Slurm job
	}{
		{"the victim", victimPid, [6]string{"ml", "bert-finetune-0", "trainer", podV, idF, ""}},
		{"a process in the victim's pod and container names below user@1000.service", podAttacker, [6]string{}},
		{"a process in a Slurm job's name below user@1000.service", jobAttacker, [6]string{}},
		{"a process in the victim's names inside another pod's container", nestedPid, [6]string{"dev", "sandbox-0", "shell", podU, idA, ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := r.Lookup(tt.pid)
			if g := [6]string{got.Namespace, got.Pod, got.Container, got.PodUID, got.ContainerID, got.SlurmJobID}; g != tt.want {
				t.Errorf("Lookup(%d) names %q\nwant %q", tt.pid, g, tt.want)
			}
		})
	}
}
