// Package manifestcheck decodes Kubernetes manifests strictly into their Go
// types and checks them against gpumem_exporter's deployment contract
// (docs/deploy.md). The tests of deploy/kubernetes (the kustomization) and
// of deploy/helm (the chart) both use it, so that the two install the same
// thing. A check returns what it finds wrong as one error (nil when the
// objects keep the contract), each problem on a line of its own; the
// caller reports it.
package manifestcheck

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Object is one decoded YAML document.
type Object struct {
	// Source names the file (or template) and the document's position.
	Source string
	Kind   string
	// Obj is a pointer to the document's Go type, e.g. *appsv1.DaemonSet.
	Obj any
}

// Meta returns the object's metadata.
func (o Object) Meta() metav1.Object {
	m, _ := o.Obj.(metav1.Object)
	return m
}

// newObject returns what a document of apiVersion and kind decodes into, or
// nil for a kind the deployment does not use.
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1 Service":
		return &corev1.Service{}
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "v1 Pod":
		return &corev1.Pod{}
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}
	case "batch/v1 Job":
		return &batchv1.Job{}
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "storage.k8s.io/v1 CSIDriver":
		return &storagev1.CSIDriver{}
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &ServiceMonitor{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &PrometheusRule{}
	case "monitoring.coreos.com/v1alpha1 AlertmanagerConfig":
		return &AlertmanagerConfig{}
	}
	return nil
}

// Decode splits data into YAML documents and decodes each strictly into its
// Go type: an unknown or duplicate field, which the API server would drop or
// refuse, is an error, and so is a kind the deployment does not use. Empty
// documents (comments only) are skipped. source names data in errors.
func Decode(source string, data []byte) ([]Object, error) {
	var objs []Object
	var errs []error
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: reading document %d: %w", source, n, err))
			break
		}
		if isEmptyDoc(doc) {
			continue
		}
		where := fmt.Sprintf("%s, document %d", source, n)
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		obj := newObject(tm.APIVersion, tm.Kind)
		if obj == nil {
			errs = append(errs, fmt.Errorf("%s: unexpected apiVersion %q kind %q", where, tm.APIVersion, tm.Kind))
			continue
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", where, tm.Kind, err))
			continue
		}
		objs = append(objs, Object{Source: where, Kind: tm.Kind, Obj: obj})
	}
	return objs, errors.Join(errs...)
}

func isEmptyDoc(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") && line != "---" {
			return false
		}
	}
	return true
}

// DecodeFile decodes every document of a file.
func DecodeFile(path string) ([]Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Decode(filepath.Base(path), data)
}

// All returns the objects of Go type T (a struct type, e.g. appsv1.DaemonSet).
func All[T any](objs []Object) []*T {
	var out []*T
	for _, o := range objs {
		if v, ok := o.Obj.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// One returns the only object of Go type T, or an error if there is not
// exactly one.
func One[T any](objs []Object) (*T, error) {
	found := All[T](objs)
	if len(found) != 1 {
		return nil, fmt.Errorf("want exactly one %T, found %d", new(T), len(found))
	}
	return found[0], nil
}

// None returns an error if objs hold an object of Go type T.
func None[T any](objs []Object) error {
	if found := All[T](objs); len(found) != 0 {
		return fmt.Errorf("want no %T, found %d", new(T), len(found))
	}
	return nil
}

// problems collects what a check finds wrong.
type problems []error

func (p *problems) addf(format string, args ...any) {
	*p = append(*p, fmt.Errorf(format, args...))
}

func (p *problems) add(err error) {
	if err != nil {
		*p = append(*p, err)
	}
}

// err returns the problems as one error, nil if there are none.
func (p problems) err() error { return errors.Join(p...) }
