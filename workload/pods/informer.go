// Package pods watches the pods of this node on the Kubernetes API server,
// so that the workload resolver can name the pod and container of a
// process from the IDs in its cgroup.
package pods

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpumem/gpumem_exporter/internal/ratelog"
	"github.com/gpumem/gpumem_exporter/workload"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// coreV1Codecs decode core/v1 (pods, and the list and watch types the
// API server sends) and nothing else: the typed clientset's scheme
// (k8s.io/client-go/kubernetes/scheme) registers every API group, which
// makes the binary more than twice as large and its RSS much higher
// (docs/benchmarks.md). Built on first use, so that a daemon outside
// Kubernetes never builds it.
var coreV1Codecs = sync.OnceValue(func() serializer.CodecFactory {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		panic(fmt.Sprintf("registering core/v1: %v", err)) // a static list of types: cannot fail
	}
	metav1.AddToGroupVersion(scheme, corev1.SchemeGroupVersion)
	return serializer.NewCodecFactory(scheme)
})

// mirrorAnnotation holds, on the mirror pod of a static pod, the UID that
// the kubelet gave the static pod and uses in its cgroup names.
const mirrorAnnotation = "kubernetes.io/config.mirror"

// Informer is a PodLookup fed by a watch on the pods of one node.
type Informer struct {
	nodeName string
	logger   log.Logger
	synced   atomic.Pointer[func() bool] // set by Run: the event handler has seen the first list

	mu         sync.RWMutex
	pods       map[string]podRecord      // pod UID -> pod
	aliases    map[string]string         // static pod UID -> mirror pod UID
	containers map[string]containerOwner // container ID -> container

	podsGauge prometheus.Gauge
	errors    prometheus.Counter

	warnings *ratelog.Limiter // of RequestFailed
}

type podRecord struct {
	namespace, name string
	mirrorOf        string
	containerIDs    []string
}

type containerOwner struct {
	podUID, name string
}

var _ workload.PodLookup = (*Informer)(nil)

// New prepares a watch on the pods scheduled to nodeName. It does not
// contact the API server: Run starts the watch. It is a
// prometheus.Collector of gpumem_kubernetes_pods and
// gpumem_kubernetes_errors_total.
func New(nodeName string, logger log.Logger) *Informer {
	if logger == nil {
		logger = log.NewNopLogger()
	}
	p := &Informer{
		nodeName:   nodeName,
		logger:     logger,
		pods:       map[string]podRecord{},
		aliases:    map[string]string{},
		containers: map[string]containerOwner{},
		podsGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: prometheus.BuildFQName("gpumem", "kubernetes", "pods"),
			Help: "Pods on this node known to the exporter's pod watch.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: prometheus.BuildFQName("gpumem", "kubernetes", "errors_total"),
			Help: "Errors listing or watching pods on the Kubernetes API server.",
		}),
		warnings: ratelog.New(1, time.Minute),
	}
	return p
}

// Describe implements prometheus.Collector.
func (p *Informer) Describe(ch chan<- *prometheus.Desc) {
	p.podsGauge.Describe(ch)
	p.errors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (p *Informer) Collect(ch chan<- prometheus.Metric) {
	p.podsGauge.Collect(ch)
	p.errors.Collect(ch)
}

// PodListWatch lists and watches the pods of nodeName through client (a
// core/v1 REST client, see NewClient): a field selector on spec.nodeName,
// as the kubelet itself watches. This needs list/watch on pods
// cluster-wide.
func PodListWatch(client cache.Getter, nodeName string) cache.ListerWatcher {
	selector := fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	return cache.NewFilteredListWatchFromClient(client, "pods", metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.FieldSelector = selector
	})
}

// watch builds the informer on lw; Run calls it. The func it returns
// reports whether the first list has been delivered to p's event handler:
// the informer's own HasSynced turns true when its store holds the list,
// which can be before the handler has recorded the pods.
func (p *Informer) watch(lw cache.ListerWatcher) (cache.SharedIndexInformer, func() bool) {
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{})
	if err := inf.SetTransform(trimPod); err != nil {
		level.Warn(p.logger).Log("msg", "cannot trim cached pods", "err", err)
	}
	if err := inf.SetWatchErrorHandler(p.watchError); err != nil {
		level.Warn(p.logger).Log("msg", "cannot count watch errors", "err", err)
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.upsert(obj) },
		UpdateFunc: func(_, obj any) { p.upsert(obj) },
		DeleteFunc: p.delete,
	})
	if err != nil {
		level.Error(p.logger).Log("msg", "cannot follow pod events; pod names will be missing", "err", err)
		return inf, inf.HasSynced
	}
	return inf, reg.HasSynced
}

// Run starts the watch of lw (PodListWatch of this node) in the
// background and returns at once; it stops when ctx ends. Lookups answer
// from what has arrived so far. Call it once.
func (p *Informer) Run(ctx context.Context, lw cache.ListerWatcher) {
	inf, synced := p.watch(lw)
	p.synced.Store(&synced)
	go inf.RunWithContext(ctx)
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), synced) {
			level.Info(p.logger).Log("msg", "pod watch synced", "node", p.nodeName, "pods", p.podCount())
		}
	}()
}

// HasSynced reports whether the first list of the node's pods has arrived
// and every pod in it can be looked up.
func (p *Informer) HasSynced() bool {
	synced := p.synced.Load()
	return synced != nil && (*synced)()
}

// Pod implements PodLookup; a nil *Informer knows no pods. The UID of a static pod (as the kubelet names
// its cgroup) finds its mirror pod.
func (p *Informer) Pod(podUID string) (namespace, name string, ok bool) {
	if p == nil {
		return "", "", false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	rec, ok := p.pods[podUID]
	if !ok {
		mirror, found := p.aliases[podUID]
		if !found {
			return "", "", false
		}
		rec, ok = p.pods[mirror]
	}
	return rec.namespace, rec.name, ok
}

// Container implements PodLookup: the pod is the one whose status lists
// the container, by the UID the kubelet gives its cgroup (for a mirror
// pod, the static pod's).
func (p *Informer) Container(containerID string) (podUID, name string, ok bool) {
	if p == nil {
		return "", "", false
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	c, ok := p.containers[containerID]
	if !ok {
		return "", "", false
	}
	podUID = c.podUID
	if rec, found := p.pods[c.podUID]; found && rec.mirrorOf != "" {
		podUID = rec.mirrorOf
	}
	return podUID, c.name, true
}

func (p *Informer) podCount() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.pods)
}

func (p *Informer) upsert(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		level.Debug(p.logger).Log("msg", "ignoring unexpected object", "type", fmt.Sprintf("%T", obj))
		return
	}
	// The server filters on the node; the check keeps a stray pod out.
	if p.nodeName != "" && pod.Spec.NodeName != "" && pod.Spec.NodeName != p.nodeName {
		return
	}
	uid := string(pod.UID)
	rec := podRecord{
		namespace: pod.Namespace,
		name:      pod.Name,
		mirrorOf:  pod.Annotations[mirrorAnnotation],
	}
	names := map[string]string{}
	for _, statuses := range [][]corev1.ContainerStatus{
		pod.Status.InitContainerStatuses,
		pod.Status.ContainerStatuses,
		pod.Status.EphemeralContainerStatuses,
	} {
		for _, cs := range statuses {
			if id := trimContainerScheme(cs.ContainerID); id != "" {
				names[id] = cs.Name
				rec.containerIDs = append(rec.containerIDs, id)
			}
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeLocked(uid)
	p.pods[uid] = rec
	if rec.mirrorOf != "" && rec.mirrorOf != uid {
		p.aliases[rec.mirrorOf] = uid
	}
	for id, name := range names {
		p.containers[id] = containerOwner{podUID: uid, name: name}
	}
	p.podsGauge.Set(float64(len(p.pods)))
}

func (p *Informer) delete(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		level.Debug(p.logger).Log("msg", "ignoring deletion of unexpected object", "type", fmt.Sprintf("%T", obj))
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.removeLocked(string(pod.UID))
	p.podsGauge.Set(float64(len(p.pods)))
}

// removeLocked forgets the pod with this UID and its containers.
func (p *Informer) removeLocked(uid string) {
	rec, ok := p.pods[uid]
	if !ok {
		return
	}
	for _, id := range rec.containerIDs {
		if p.containers[id].podUID == uid {
			delete(p.containers, id)
		}
	}
	if rec.mirrorOf != "" && p.aliases[rec.mirrorOf] == uid {
		delete(p.aliases, rec.mirrorOf)
	}
	delete(p.pods, uid)
}

// watchError counts a failed list or watch. The informer retries by
// itself with backoff; a watch closed cleanly or expired is routine. A
// failed request to the API server was counted already, by RequestFailed.
func (p *Informer) watchError(_ *cache.Reflector, err error) {
	switch {
	case errors.Is(err, io.EOF):
		level.Debug(p.logger).Log("msg", "pod watch closed", "err", err)
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		level.Debug(p.logger).Log("msg", "pod watch expired; relisting", "err", err)
	case isRequestError(err):
		level.Debug(p.logger).Log("msg", "listing or watching pods failed; retrying", "err", err)
	default:
		p.errors.Inc()
		level.Warn(p.logger).Log("msg", "listing or watching pods failed; retrying", "node", p.nodeName, "err", err)
	}
}

// RequestFailed counts a failed request to the API server (see NewClient).
// One failure a minute is logged at warn, the rest at debug, since the informer retries every few seconds while it lasts.
func (p *Informer) RequestFailed(err error) {
	p.errors.Inc()
	p.warnings.Warn(p.logger).Log("msg", "a request to the Kubernetes API server failed; pod names stay as they are until it answers", "node", p.nodeName, "err", err)
}

// isRequestError reports whether err is one that errorReportingTransport
// has seen: no answer, or one of the statuses it counts.
func isRequestError(err error) bool {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		return true
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return countedStatus(int(status.Status().Code))
	}
	return false
}

func countedStatus(code int) bool {
	return code == http.StatusUnauthorized || code == http.StatusForbidden || code == http.StatusTooManyRequests || code >= 500
}

// errorReportingTransport reports failed requests to the API server.
type errorReportingTransport struct {
	next    http.RoundTripper
	onError func(error)
}

func (t *errorReportingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	switch {
	case err != nil:
		if req.Context().Err() == nil { // not our own shutdown
			t.onError(err)
		}
	case countedStatus(resp.StatusCode):
		t.onError(fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status))
	}
	return resp, err
}

// WrappedRoundTripper lets client-go's debugging wrappers see through.
func (t *errorReportingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// trimContainerScheme turns "containerd://<id>" into "<id>" (also cri-o://
// and docker://); an ID without a scheme is returned as is.
func trimContainerScheme(id string) string {
	if i := strings.Index(id, "://"); i >= 0 {
		return id[i+len("://"):]
	}
	return id
}

// trimPod keeps in the informer's cache only what attribution needs, so a
// node's pods with their large specs and managed fields cost little.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	trimmed := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:            pod.Name,
			Namespace:       pod.Namespace,
			UID:             pod.UID,
			ResourceVersion: pod.ResourceVersion,
		},
		Spec: corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status: corev1.PodStatus{
			Phase:                      pod.Status.Phase,
			InitContainerStatuses:      trimStatuses(pod.Status.InitContainerStatuses),
			ContainerStatuses:          trimStatuses(pod.Status.ContainerStatuses),
			EphemeralContainerStatuses: trimStatuses(pod.Status.EphemeralContainerStatuses),
		},
	}
	if mirror, ok := pod.Annotations[mirrorAnnotation]; ok {
		trimmed.Annotations = map[string]string{mirrorAnnotation: mirror}
	}
	return trimmed, nil
}

func trimStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	if len(in) == 0 {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(in))
	for i, cs := range in {
		out[i] = corev1.ContainerStatus{Name: cs.Name, ContainerID: cs.ContainerID}
	}
	return out
}

// NewClient returns a Kubernetes client. With a kubeconfig path it uses
// that file, and a file that cannot be used is an error. Without one, it
// uses the in-cluster configuration when running in a pod
// (KUBERNETES_SERVICE_HOST is set), and otherwise returns ok=false and no
// error: not in Kubernetes, so no pod attribution.
//
// onRequestError, when not nil, is called for every request to the API
// server that fails: no connection, or an answer of 401, 403, 429 or 5xx.
// The informer cannot report those itself: client-go's watch-list mode
// retries them with backoff without telling its error handler.
func NewClient(kubeconfig string, onRequestError func(error)) (client *rest.RESTClient, ok bool, err error) {
	var cfg *rest.Config
	switch {
	case kubeconfig != "":
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, false, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, false, fmt.Errorf("loading in-cluster Kubernetes configuration: %w", err)
		}
	default:
		return nil, false, nil
	}
	if onRequestError != nil {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return &errorReportingTransport{next: rt, onError: onRequestError}
		})
	}
	cfg.UserAgent = "gpumem_exporter"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.APIPath = "/api"
	cfg.NegotiatedSerializer = coreV1Codecs().WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, false, fmt.Errorf("creating Kubernetes client: %w", err)
	}
	return rc, true, nil
}
