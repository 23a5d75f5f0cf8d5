package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/alecthomas/kingpin/v2"
	"github.com/go-kit/log"
)

// Events on pods are on by default, off with --no-kubernetes.oom-events,
// and never started without a Kubernetes configuration.
func TestOOMEventsNeedTheFlagAndKubernetes(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")

	for _, tc := range []struct {
		name      string
		args      []string
		inCluster bool
		want      bool
	}{
		{"on by default", []string{"--kubernetes.kubeconfig=" + kubeconfig}, true, true},
		{"turned off", []string{"--kubernetes.kubeconfig=" + kubeconfig, "--no-kubernetes.oom-events"}, true, false},
		{"no pod watch", []string{"--kubernetes.kubeconfig=" + kubeconfig}, false, false},
		{"outside Kubernetes", nil, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(kingpin.New("test", ""), append(tc.args, "--kubernetes.node-name=gpu-node-1"))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rec, err := startOOMEvents(ctx, o.oomEvents && tc.inCluster, o.kubeconfig, o.nodeName, log.NewNopLogger())
			if err != nil {
				t.Fatal(err)
			}
			defer rec.Stop()
			if got := rec != nil; got != tc.want {
				t.Errorf("recorder started: %v, want %v", got, tc.want)
			}
		})
	}
}
