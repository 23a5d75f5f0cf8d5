package manifestcheck

import (
	"fmt"
	"path/filepath"
	"strings"

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
func PodSecurityViolations(level psaapi.Level, meta *metav1.ObjectMeta, spec *corev1.PodSpec) (string, error) {
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return "", fmt.Errorf("the Pod Security evaluator: %w", err)
	}
	res := policy.AggregateCheckResults(eval.EvaluatePod(psaapi.LevelVersion{Level: level, Version: psaapi.LatestVersion()}, meta, spec))
	if res.Allowed {
		return "", nil
	}
	return res.ForbiddenDetail(), nil
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
func CheckWorkload(meta *metav1.ObjectMeta, spec *corev1.PodSpec, want WorkloadWant) error {
	var p problems
	if spec.HostPID {
		p.addf("workloads keep their own PID namespace: only the exporter needs hostPID")
	}
	if len(spec.Containers) != 1 {
		p.addf("the example has %d containers, want 1", len(spec.Containers))
		return p.err()
	}
	c := &spec.Containers[0]
	if _, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok {
		p.addf("the example workload should ask for a GPU")
	}
	if e := Env(c, "GPUMEM_SOCKET"); e == nil || e.Value != Socket {
		p.addf("GPUMEM_SOCKET must be %s, got %+v", Socket, e)
	}
	mnt, vol, ok := mountAt(&p, spec, c, SocketDir)
	if !ok {
		return p.err()
	}
	if !mnt.ReadOnly || mnt.SubPath != "" {
		p.addf("mount the socket directory whole and read-only (connect needs no write access to the directory), got %+v", mnt)
	}

	if want.DriverName != "" {
		if vol.CSI == nil || vol.CSI.Driver != want.DriverName || !isTrue(vol.CSI.ReadOnly) {
			p.addf("the socket volume must be csi {driver: %s, readOnly: true}, got %+v", want.DriverName, vol.VolumeSource)
		}
		v, err := PodSecurityViolations(psaapi.LevelRestricted, meta, spec)
		if err != nil {
			p.add(err)
			return p.err()
		}
		if v != "" {
			p.addf("Pod Security \"restricted\" forbids the example workload: %s", v)
		}
	} else {
		checkHostPath(&p, "the workload's socket directory", vol, SocketDir, corev1.HostPathDirectoryOrCreate)
		// Documented as needing a privileged namespace: keep that true.
		v, err := PodSecurityViolations(psaapi.LevelBaseline, meta, spec)
		if err != nil {
			p.add(err)
			return p.err()
		}
		if v == "" {
			p.addf("Pod Security \"baseline\" admits the hostPath example: docs/deploy.md says it needs privileged")
		}
	}

	if want.PythonPath != "" {
		if e := Env(c, "PYTHONPATH"); e == nil || e.Value != want.PythonPath {
			p.addf("PYTHONPATH must be %s, got %+v", want.PythonPath, e)
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
				p.addf("PYTHONPATH entry %s is not a mounted directory", dir)
			}
		}
	}
	return p.err()
}

// Kustomize renders the kustomization in dir as `kubectl apply -k` and
// `kustomize build` do (files outside dir refused), and returns its YAML.
func Kustomize(dir string) ([]byte, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return out, nil
}
