package csi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// sanityReport is the report of the one sanity run of this package (Ginkgo
// runs one suite per process).
var sanityReport ginkgo.Report

var _ = ginkgo.ReportAfterSuite("gpumem CSI sanity", func(r ginkgo.Report) { sanityReport = r })

// TestSanity runs the CSI community's sanity suite (csi-test) against the
// driver served on a Unix socket, with real bind mounts where this process
// may mount and the fake mounter elsewhere.
//
// The suite is written for drivers that provision volumes; this one only
// serves inline ephemeral volumes, so two things stand in for what a
// Kubernetes node would do (see docs/csi.md):
//   - the "[Controller Server]" specs are skipped: there is no controller
//     service, and GetPluginCapabilities says so;
//   - a client-side interceptor plays the kubelet: it answers the
//     CreateVolume/DeleteVolume calls that the node specs make to get a
//     volume id, and marks each NodePublishVolume as the kubelet marks an
//     inline `readOnly: true` volume (ephemeral context, readonly). The
//     driver itself is unchanged; its refusal of other requests is tested in
//     driver_test.go.
func TestSanity(t *testing.T) {
	mounter := NewMounter()
	mode := "real bind mounts"
	if err := probeMount(); err != nil {
		mounter, mode = newFakeMounter(), "fake mounter ("+err.Error()+")"
	}
	t.Logf("sanity with %s", mode)

	dir := t.TempDir()
	publishDir := filepath.Join(dir, "publish")
	mustMkdir(t, publishDir)
	if err := os.WriteFile(filepath.Join(publishDir, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := NewDriver(Config{Name: DefaultDriverName, Version: "0.0.0-test", NodeID: "sanity-node", PublishDir: publishDir, PodsDir: dir, Mounter: mounter})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + filepath.Join(dir, "csi.sock")
	l, err := Listen(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewGRPCServer(d, testLogger(t))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serving: %v", err)
		}
	}()

	cfg := sanity.NewTestConfig()
	cfg.Address = endpoint
	cfg.TargetPath = filepath.Join(dir, "target") // sanity creates it, publishes at <it>/target
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithUnaryInterceptor(kubeletStandIn))
	sc := sanity.GinkgoTest(&cfg)
	defer sc.Finalize()

	gomega.RegisterFailHandler(ginkgo.Fail)
	suiteConfig, reporterConfig := ginkgo.GinkgoConfiguration()
	reporterConfig.NoColor = true
	reporterConfig.Succinct = true
	suiteConfig.SkipStrings = append(suiteConfig.SkipStrings, `\[Controller Server\]`)
	if !ginkgo.RunSpecs(t, "gpumem CSI sanity", suiteConfig, reporterConfig) {
		return // RunSpecs has failed t
	}

	// Guard against a suite that passes by skipping everything: these specs
	// must have run and passed.
	mustPass := []string{
		"Identity Service GetPluginInfo should return appropriate information",
		"Identity Service GetPluginCapabilities should return appropriate capabilities",
		"Identity Service Probe should return appropriate information",
		"Node Service NodeGetCapabilities should return appropriate capabilities",
		"Node Service NodeGetInfo should return appropriate values",
		"Node Service NodePublishVolume should fail when no volume id is provided",
		"Node Service NodePublishVolume should fail when no target path is provided",
		"Node Service NodePublishVolume should fail when no volume capability is provided",
		"Node Service NodeUnpublishVolume should fail when no volume id is provided",
		"Node Service NodeUnpublishVolume should fail when no target path is provided",
		"Node Service NodeUnpublishVolume should remove target path",
	}
	passed := map[string]bool{}
	for _, s := range sanityReport.SpecReports {
		if s.State.Is(types.SpecStatePassed) {
			passed[s.FullText()] = true
		}
	}
	for _, name := range mustPass {
		if !passed[name] {
			t.Errorf("sanity spec %q did not run and pass", name)
		}
	}
	t.Logf("sanity: %d specs passed", len(passed))
}

// kubeletStandIn is the client-side interceptor described at TestSanity.
func kubeletStandIn(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch method {
	case csipb.Controller_CreateVolume_FullMethodName:
		name := req.(*csipb.CreateVolumeRequest).GetName()
		reply.(*csipb.CreateVolumeResponse).Volume = &csipb.Volume{VolumeId: "csi-" + strings.ReplaceAll(name, "/", "-")}
		return nil
	case csipb.Controller_DeleteVolume_FullMethodName:
		return nil
	case csipb.Node_NodePublishVolume_FullMethodName:
		r := proto.Clone(req.(*csipb.NodePublishVolumeRequest)).(*csipb.NodePublishVolumeRequest)
		if r.VolumeContext == nil {
			r.VolumeContext = map[string]string{}
		}
		r.VolumeContext[EphemeralKey] = "true"
		r.VolumeContext["csi.storage.k8s.io/pod.name"] = "sanity"
		r.VolumeContext["csi.storage.k8s.io/pod.namespace"] = "default"
		r.Readonly = true
		return invoker(ctx, method, r, reply, cc, opts...)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}
