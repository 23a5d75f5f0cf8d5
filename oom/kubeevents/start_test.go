package kubeevents

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-kit/log"
)

// Events on pods start only when asked for and a Kubernetes
// configuration is there.
func TestStartNeedsToBeOnAndAKubernetesConfiguration(t *testing.T) {
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
		name       string
		on         bool
		kubeconfig string
		want       bool
	}{
		{"on with a kubeconfig", true, kubeconfig, true},
		{"off", false, kubeconfig, false},
		{"outside Kubernetes", true, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rec, err := Start(ctx, tc.on, tc.kubeconfig, "gpu-node-1", log.NewNopLogger())
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
