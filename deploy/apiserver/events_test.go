package apiserver

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/gpumem/gpumem_exporter/oom/kubeevents"
)

var events = schema.GroupVersionResource{Version: "v1", Resource: "events"}

// testOOMEvent records an out-of-memory Event twice on a pod, as the
// exporter's ServiceAccount user (so the deployed RBAC is what allows it),
// and checks what `kubectl describe pod` would find: one Event in the pod's
// namespace about that pod, type Warning, reason GPUOutOfMemory, count 2.
func testOOMEvent(t *testing.T, c *cluster, user string) {
	const ns = "oom-events"
	c.applyAll(t, []document{namespaceDoc(ns, "restricted")})
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// The default ServiceAccount, which kube-controller-manager would
	// create and the ServiceAccount admission plugin wants.
	if _, err := create(ctx, c.dynamic.Resource(serviceAccounts).Namespace(ns), &corev1.ServiceAccount{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
		ObjectMeta: metav1.ObjectMeta{Name: "default"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	no, yes := false, true
	pod, err := create(ctx, c.dynamic.Resource(pods).Namespace(ns), &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "train-0"},
		Spec: corev1.PodSpec{
			NodeName: "gpu-node-1",
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "trainer", Image: "registry.example.com/train:1",
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	rec, err := kubeevents.New(ctx, kubeevents.Config{Client: coreV1Client(t, c, user), NodeName: "gpu-node-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Stop()
	ref := kubeevents.PodRef{Namespace: ns, Name: pod.Name, UID: string(pod.UID)}
	const message = "Container trainer (pid 4242) ran out of memory on GPU 0: limit. The request of 3.6GiB would take the process past its own limit of 7GiB while the GPU has 135.8GiB free: raise the limit or lower the batch."
	rec.OOM(ref, message)
	// The second only once the first is written: the correlator
	// patches the Event the server returned.
	var got corev1.Event
	byPod := fmt.Sprintf("involvedObject.kind=Pod,involvedObject.name=%s,involvedObject.namespace=%s,involvedObject.uid=%s", pod.Name, ns, pod.UID)
	waitEvent := func(count int32) {
		t.Helper()
		poll(t, fmt.Sprintf("the Event on pod %s/%s with count %d", ns, pod.Name, count), func(ctx context.Context) (bool, error) {
			// As kubectl describe pod selects a pod's Events.
			list, err := c.dynamic.Resource(events).Namespace(ns).List(ctx, metav1.ListOptions{FieldSelector: byPod})
			if err != nil {
				return false, err
			}
			if len(list.Items) > 1 {
				return false, fmt.Errorf("%d Events on the pod, want one (repeats counted on it)", len(list.Items))
			}
			if len(list.Items) == 0 {
				return false, nil
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[0].Object, &got); err != nil {
				return false, err
			}
			return got.Count >= count, nil
		})
	}
	waitEvent(1)
	rec.OOM(ref, message)
	waitEvent(2)

	want := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: pod.Name, UID: pod.UID}
	if got.InvolvedObject != want {
		t.Errorf("involvedObject %+v, want %+v", got.InvolvedObject, want)
	}
	if got.Namespace != ns {
		t.Errorf("the Event is in namespace %q, want the pod's %q", got.Namespace, ns)
	}
	if got.Type != corev1.EventTypeWarning || got.Reason != "GPUOutOfMemory" || got.Message != message || got.Count != 2 {
		t.Errorf("type %q, reason %q, count %d, message %q; want Warning, GPUOutOfMemory, 2, %q", got.Type, got.Reason, got.Count, got.Message, message)
	}
	if got.Source.Component != "gpumem-exporter" || got.Source.Host != "gpu-node-1" {
		t.Errorf("source %+v, want gpumem-exporter on gpu-node-1", got.Source)
	}
}

// coreV1Client is a core/v1 REST client acting as user, made as the
// exporter makes its own (protobuf, core/v1 types only).
func coreV1Client(t *testing.T, c *cluster, user string) rest.Interface {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	metav1.AddToGroupVersion(scheme, corev1.SchemeGroupVersion)
	cfg := rest.CopyConfig(c.config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	cfg.APIPath = "/api"
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	client, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}
