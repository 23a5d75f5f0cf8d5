package manifestcheck

import (
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// PodSecurityViolations evaluates a pod against a Pod Security Standards
// level (privileged, baseline, restricted) with the checks of the API
// server's own PodSecurity admission, at its latest version. It returns
// the reasons the level forbids the pod, empty if it is admitted.
func PodSecurityViolations(t testing.TB, level psaapi.Level, meta *metav1.ObjectMeta, spec *corev1.PodSpec) string {
	t.Helper()
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res := policy.AggregateCheckResults(eval.EvaluatePod(psaapi.LevelVersion{Level: level, Version: psaapi.LatestVersion()}, meta, spec))
	if res.Allowed {
		return ""
	}
	return res.ForbiddenDetail()
}

// WorkloadWant describes how an example workload reaches the socket.
type WorkloadWant struct {
	// DriverName: through the CSI inline volume of this driver; "" through
	// a hostPath of SocketDir.
	DriverName string
	// PythonPath is the PYTHONPATH the workload must set ("" not checked).
	PythonPath string
}

// CheckWorkload checks an example workload pod: the socket reached through
// the CSI volume (admitted by Pod Security "restricted") or through a
// hostPath (which needs "privileged"), mounted read-only at SocketDir, with
// GPUMEM_SOCKET set and every PYTHONPATH entry inside a mount.
func CheckWorkload(t testing.TB, meta *metav1.ObjectMeta, spec *corev1.PodSpec, want WorkloadWant) {
	t.Helper()
	if spec.HostPID {
		t.Error("workloads keep their own PID namespace: only the exporter needs hostPID")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("the example has %d containers, want 1", len(spec.Containers))
	}
	c := &spec.Containers[0]
	if _, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok {
		t.Error("the example workload should ask for a GPU")
	}
	if e := Env(c, "GPUMEM_SOCKET"); e == nil || e.Value != Socket {
		t.Errorf("GPUMEM_SOCKET must be %s, got %+v", Socket, e)
	}
	mnt, vol := MountAt(t, spec, c, SocketDir)
	if !mnt.ReadOnly || mnt.SubPath != "" {
		t.Errorf("mount the socket directory whole and read-only (connect needs no write access to the directory), got %+v", mnt)
	}

	if want.DriverName != "" {
		if vol.CSI == nil || vol.CSI.Driver != want.DriverName || !isTrue(vol.CSI.ReadOnly) {
			t.Errorf("the socket volume must be csi {driver: %s, readOnly: true}, got %+v", want.DriverName, vol.VolumeSource)
		}
		if v := PodSecurityViolations(t, psaapi.LevelRestricted, meta, spec); v != "" {
			t.Errorf("Pod Security \"restricted\" forbids the example workload: %s", v)
		}
	} else {
		checkHostPath(t, "the workload's socket directory", vol, SocketDir, corev1.HostPathDirectoryOrCreate)
		// Documented as needing a privileged namespace: keep that true.
		if v := PodSecurityViolations(t, psaapi.LevelBaseline, meta, spec); v == "" {
			t.Error("Pod Security \"baseline\" admits the hostPath example: docs/deploy.md says it needs privileged")
		}
	}

	if want.PythonPath != "" {
		if e := Env(c, "PYTHONPATH"); e == nil || e.Value != want.PythonPath {
			t.Errorf("PYTHONPATH must be %s, got %+v", want.PythonPath, e)
		}
	}
	// Every PYTHONPATH entry is, or is in, or holds a mounted directory.
	if e := Env(c, "PYTHONPATH"); e != nil {
		for _, dir := range strings.Split(e.Value, ":") {
			found := false
			for _, vm := range c.VolumeMounts {
				if dir == vm.MountPath || strings.HasPrefix(dir, vm.MountPath+"/") || strings.HasPrefix(vm.MountPath, dir+"/") {
					found = true
				}
			}
			if !found {
				t.Errorf("PYTHONPATH entry %s is not a mounted directory", dir)
			}
		}
	}
}

// Kustomize renders the kustomization in dir as `kubectl apply -k` and
// `kustomize build` do (files outside dir refused), and returns its YAML.
func Kustomize(t testing.TB, dir string) []byte {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return out
}
