package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// requireEnv makes a missing kube-apiserver or etcd a failure instead of a
// skip; .ci/run sets it after scripts/kube-apiserver.sh has built the binary.
const requireEnv = "GPUMEM_REQUIRE_APISERVER"

const (
	startTimeout = 3 * time.Minute // both processes, on a busy CI machine
	callTimeout  = time.Minute     // one API call or poll
	fieldManager = "gpumem-apiserver-test"
)

// binaries finds etcd and kube-apiserver, skipping the test (or failing it,
// with requireEnv=1) when one is missing.
func binaries(t *testing.T) (etcd, apiserver string) {
	t.Helper()
	var missing []string
	etcd, err := lookBinary("ETCD", "etcd", nil)
	if err != nil {
		missing = append(missing, fmt.Sprintf("etcd (%v; on Debian: apt-get install etcd-server)", err))
	}
	// Where scripts/kube-apiserver.sh builds it: $GPUMEM_CACHE, by default
	// under the user's cache directory, one folder per version.
	cache := os.Getenv("GPUMEM_CACHE")
	if dir, err := os.UserCacheDir(); cache == "" && err == nil {
		cache = filepath.Join(dir, "gpumem_exporter")
	}
	var cached []string
	if cache != "" {
		cached, _ = filepath.Glob(filepath.Join(cache, "kube-apiserver", "*", "kube-apiserver"))
	}
	apiserver, err = lookBinary("KUBE_APISERVER", "kube-apiserver", cached)
	if err != nil {
		missing = append(missing, fmt.Sprintf("kube-apiserver (%v; build it with scripts/kube-apiserver.sh)", err))
	}
	if len(missing) == 0 {
		return etcd, apiserver
	}
	msg := "no real API server for this test: missing " + strings.Join(missing, " and ")
	if os.Getenv(requireEnv) == "1" {
		t.Fatalf("%s (%s=1 makes this a failure)", msg, requireEnv)
	}
	t.Skipf("%s; set %s=1 to fail instead of skipping", msg, requireEnv)
	return "", ""
}

// lookBinary returns $env if set, else the last of cached (sorted), else name
// on PATH.
func lookBinary(env, name string, cached []string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("$%s=%s is not an executable file", env, p)
		}
		return filepath.Abs(p)
	}
	sort.Strings(cached)
	for i := len(cached) - 1; i >= 0; i-- {
		if st, err := os.Stat(cached[i]); err == nil && st.Mode()&0o111 != 0 {
			return filepath.Abs(cached[i])
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("not in $%s, not built, not on PATH", env)
	}
	return p, nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// process is a child process whose output goes to a log file.
type process struct {
	name string
	log  string
	done chan struct{}
	err  error // valid once done is closed
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail returns the last lines of the process's log, for failure messages.
func (p *process) tail() string {
	data, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return fmt.Sprintf("last lines of %s's log (%s):\n%s", p.name, p.log, strings.Join(lines, "\n"))
}

// startProcess starts bin; it is stopped (SIGTERM, then SIGKILL) when the
// test ends, and killed by the kernel if the test binary dies first.
func startProcess(t *testing.T, name, dir, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitReady polls check until it returns nil, failing t if p exits or
// startTimeout passes first.
func waitReady(t *testing.T, p *process, what string, check func() error) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(startTimeout)
	var err error
	for {
		if err = check(); err == nil {
			t.Logf("%s ready after %.1f s", what, time.Since(start).Seconds())
			return
		}
		if p.exited() {
			t.Fatalf("%s exited before it was ready (%v); %s", p.name, p.err, p.tail())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after %v: %v; %s", what, startTimeout, err, p.tail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// warnings collects the API server's Warning headers.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

// take returns the warnings since the last call and forgets them.
func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// cluster is a running etcd and kube-apiserver, with an admin's clients.
type cluster struct {
	config   *rest.Config // the admin's (group system:masters)
	dynamic  dynamic.Interface
	mapper   *restmapper.DeferredDiscoveryRESTMapper
	warnings *warnings
	// kubeVersion is the server's version, for rendering the chart.
	kubeVersion chartutil.KubeVersion
}

// startCluster starts etcd and kube-apiserver on loopback ports, with RBAC
// authorization, PodSecurity admission and a static admin token, and waits
// until the API server is ready (its RBAC roles bootstrapped).
func startCluster(t *testing.T) *cluster {
	t.Helper()
	etcdBin, apiserverBin := binaries(t)
	dir := t.TempDir()

	clientPort, peerPort := freePort(t), freePort(t)
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	etcd := startProcess(t, "etcd", dir, etcdBin,
		"--name=test",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+clientURL,
		"--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=test="+peerURL,
		"--log-level=warn",
	)
	waitReady(t, etcd, "etcd", func() error {
		body, err := get(http.DefaultClient, clientURL+"/health", "")
		if err == nil && !strings.Contains(body, `"health":"true"`) {
			err = fmt.Errorf("health: %s", body)
		}
		return err
	})

	token := randomHex(t)
	tokens := filepath.Join(dir, "tokens.csv")
	// token,user,uid,"group1,group2"
	writeFile(t, tokens, fmt.Sprintf("%s,gpumem-test-admin,gpumem-test-admin,system:masters\n", token))
	saKey := filepath.Join(dir, "sa.key")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, saKey, string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))

	port := freePort(t)
	certDir := filepath.Join(dir, "certs")
	apiserver := startProcess(t, "kube-apiserver", dir, apiserverBin,
		"--etcd-servers="+clientURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The endpoint reconcilers refuse a loopback address; nothing
		// here uses the kubernetes Service's endpoints.
		"--endpoint-reconciler-type=none",
		fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir="+certDir, // a self-signed serving certificate, generated there
		"--token-auth-file="+tokens,
		"--anonymous-auth=false",
		"--authorization-mode=RBAC",
		// As every cluster that runs CSI node plugins (kubeadm's default):
		// csi-node is a privileged container.
		"--allow-privileged=true",
		"--enable-admission-plugins=PodSecurity",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saKey,
		"--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	)
	host := fmt.Sprintf("https://127.0.0.1:%d", port)
	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // only until the certificate exists
	}}
	waitReady(t, apiserver, "kube-apiserver", func() error {
		_, err := get(insecure, host+"/readyz", token)
		return err
	})

	w := &warnings{}
	cfg := &rest.Config{
		Host:        host,
		BearerToken: token,
		// The certificate that kube-apiserver generated, with its CA.
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(certDir, "apiserver.crt")},
		QPS:             100,
		Burst:           200,
		Timeout:         callTimeout,
		WarningHandler:  w,
	}
	c := &cluster{config: cfg, warnings: w}
	if c.dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := dc.ServerVersion()
	if err != nil {
		t.Fatalf("server version (is the generated certificate accepted?): %v", err)
	}
	c.kubeVersion = chartutil.KubeVersion{Version: v.GitVersion, Major: v.Major, Minor: strings.TrimRight(v.Minor, "+")}
	t.Logf("kube-apiserver %s (%s), etcd %s", v.GitVersion, apiserverBin, etcdBin)
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	return c
}

// The resources that the tests create or read with typed objects, through
// the dynamic client: the typed clientset (k8s.io/client-go/kubernetes)
// would compile every API group's client into the test.
var (
	serviceAccounts         = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	pods                    = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	secrets                 = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	subjectAccessReviews    = schema.GroupVersionResource{Group: "authorization.k8s.io", Version: "v1", Resource: "subjectaccessreviews"}
	selfSubjectRulesReviews = schema.GroupVersionResource{Group: "authorization.k8s.io", Version: "v1", Resource: "selfsubjectrulesreviews"}
)

// create creates obj, a typed object whose TypeMeta is set, through r and
// returns what the server answered, decoded into the same type.
func create[T any](ctx context.Context, r dynamic.ResourceInterface, obj *T, opts metav1.CreateOptions) (*T, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("converting %T: %w", obj, err)
	}
	u, err := r.Create(ctx, &unstructured.Unstructured{Object: m}, opts)
	if err != nil {
		return nil, err
	}
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return nil, fmt.Errorf("converting the server's %s: %w", u.GetKind(), err)
	}
	return out, nil
}

// get GETs url (with a bearer token if not empty) and returns the body; a
// status other than 200 is an error.
func get(c *http.Client, url, token string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return string(body), nil
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// document is one YAML document of a manifest, as written and decoded.
type document struct {
	source string // file or template, and the document's number
	raw    []byte
	obj    *unstructured.Unstructured
}

func (d document) String() string {
	return fmt.Sprintf("%s %s/%s (%s)", d.obj.GetKind(), d.obj.GetNamespace(), d.obj.GetName(), d.source)
}

// splitDocuments splits a multi-document YAML stream, skipping documents
// that hold only comments.
func splitDocuments(t *testing.T, source string, data []byte) []document {
	t.Helper()
	var docs []document
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for n := 1; ; n++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", source, n, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: document %d: %v", source, n, err)
		}
		if len(m) == 0 {
			continue
		}
		docs = append(docs, document{
			source: fmt.Sprintf("%s, document %d", source, n),
			raw:    raw,
			obj:    &unstructured.Unstructured{Object: m},
		})
	}
}

// resource returns the client for d's kind, in namespace ns if it is
// namespaced (d's own namespace when ns is empty).
func (c *cluster) resource(d document, ns string) (dynamic.ResourceInterface, error) {
	gvk := d.obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: no such resource on the server: %w", d, err)
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		return c.dynamic.Resource(m.Resource), nil
	}
	if ns == "" {
		ns = d.obj.GetNamespace()
	}
	if ns == "" {
		return nil, fmt.Errorf("%s: a namespaced object without a namespace", d)
	}
	return c.dynamic.Resource(m.Resource).Namespace(ns), nil
}

// apply applies d's YAML as written, server-side (as kubectl apply
// --server-side does) with strict field validation: an unknown or
// duplicate field is an error, not a warning. ns is the namespace for a
// namespaced object that names none. It returns the server's warnings.
func (c *cluster) apply(ctx context.Context, d document, ns string) ([]string, error) {
	r, err := c.resource(d, ns)
	if err != nil {
		return nil, err
	}
	c.warnings.take()
	_, err = r.Patch(ctx, d.obj.GetName(), types.ApplyPatchType, d.raw, metav1.PatchOptions{
		FieldManager:    fieldManager,
		FieldValidation: metav1.FieldValidationStrict,
	})
	w := c.warnings.take()
	if err != nil {
		return w, fmt.Errorf("applying %s: %w", d, err)
	}
	return w, nil
}

// applyAll applies docs in order (namespaces first), failing t on any error
// or warning.
func (c *cluster) applyAll(t *testing.T, docs []document) {
	t.Helper()
	ordered := append([]document(nil), docs...)
	sort.SliceStable(ordered, func(i, j int) bool {
		return ordered[i].obj.GetKind() == "Namespace" && ordered[j].obj.GetKind() != "Namespace"
	})
	for _, d := range ordered {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		w, err := c.apply(ctx, d, "")
		cancel()
		if err != nil {
			t.Error(err)
			continue
		}
		for _, msg := range w {
			t.Errorf("applying %s: warning: %s", d, msg)
		}
	}
}

// deleteAll deletes docs' objects, failing t on any error.
// Namespaces are left alone: without kube-controller-manager they would
// stay Terminating.
func (c *cluster) deleteAll(t *testing.T, docs []document) {
	t.Helper()
	for _, d := range docs {
		if d.obj.GetKind() == "Namespace" {
			continue
		}
		r, err := c.resource(d, "")
		if err != nil {
			t.Error(err)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err = r.Delete(ctx, d.obj.GetName(), metav1.DeleteOptions{})
		cancel()
		if err != nil {
			t.Errorf("deleting %s: %v", d, err)
		}
	}
}

// poll calls f until it returns true or an error, or callTimeout passes.
func poll(t *testing.T, what string, f func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	for {
		ok, err := f(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not done after %v", what, callTimeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
