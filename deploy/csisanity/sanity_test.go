package csisanity

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-kit/log"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/gpumem/gpumem_exporter/csi"
)

// sanityReport is the report of the one sanity run of this package (Ginkgo
// runs one suite per process).
var sanityReport ginkgo.Report

var _ = ginkgo.ReportAfterSuite("gpumem CSI sanity", func(r ginkgo.Report) { sanityReport = r })

// TestSanity runs the CSI community's sanity suite (csi-test) against the
// driver served on a Unix socket, with real bind mounts where this process
// may mount and an in-memory mount table elsewhere. The driver is built and
// served as cmd/gpumem-csi builds and serves it, through package csi's
// exported API.
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
//     csi/driver_test.go.
func TestSanity(t *testing.T) {
	mounter := csi.NewMounter()
	mode := "real bind mounts"
	if err := probeMount(); err != nil {
		mounter, mode = newMemMounter(), "an in-memory mount table ("+err.Error()+")"
	}
	t.Logf("sanity with %s", mode)

	dir := t.TempDir()
	publishDir := filepath.Join(dir, "publish")
	if err := os.MkdirAll(publishDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(publishDir, "marker"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := csi.NewDriver(csi.Config{Name: csi.DefaultDriverName, Version: "0.0.0-test", NodeID: "sanity-node", PublishDir: publishDir, PodsDir: dir, Mounter: mounter})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + filepath.Join(dir, "csi.sock")
	l, err := csi.Listen(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	srv := csi.NewGRPCServer(d, testLogger(t))
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
		r.VolumeContext[csi.EphemeralKey] = "true"
		r.VolumeContext["csi.storage.k8s.io/pod.name"] = "sanity"
		r.VolumeContext["csi.storage.k8s.io/pod.namespace"] = "default"
		r.Readonly = true
		return invoker(ctx, method, r, reply, cc, opts...)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// probeMount says whether this process can make a read-only bind mount
// (it needs CAP_SYS_ADMIN and no seccomp profile against mount(2)).
func probeMount() error {
	dir, err := os.MkdirTemp("", "gpumem-csi-mount-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, p := range []string{src, dst} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
	}
	m := csi.NewMounter()
	if err := m.BindReadOnly(src, dst); err != nil {
		return err
	}
	return m.Unmount(dst)
}

// memMounter is a csi.Mounter that keeps the mount table in memory, for a
// process that may not mount: a stack of read-only binds per target.
type memMounter struct {
	mu     sync.Mutex
	stacks map[string][]string // target -> sources, topmost last
}

func newMemMounter() *memMounter { return &memMounter{stacks: map[string][]string{}} }

func (m *memMounter) BindReadOnly(source, target string) error {
	for _, p := range []string{source, target} {
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			return fmt.Errorf("bind-mounting %s at %s: %s is not a directory (%v)", source, target, p, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := filepath.Clean(target)
	m.stacks[t] = append(m.stacks[t], filepath.Clean(source))
	return nil
}

func (m *memMounter) Unmount(target string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := filepath.Clean(target)
	s := m.stacks[t]
	if len(s) == 0 {
		return fmt.Errorf("unmounting %s: %w", target, errors.New("not mounted"))
	}
	if len(s) == 1 {
		delete(m.stacks, t)
	} else {
		m.stacks[t] = s[:len(s)-1]
	}
	return nil
}

func (m *memMounter) Check(target, source string) (csi.MountState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stacks[filepath.Clean(target)]
	if len(s) == 0 {
		return csi.MountState{}, nil
	}
	return csi.MountState{Mounted: true, OfSource: s[len(s)-1] == filepath.Clean(source), ReadOnly: true}, nil
}

// testLogger collects the driver's log lines and prints them when the test
// fails (never t.Log from server goroutines, which may outlive the test).
func testLogger(t *testing.T) log.Logger {
	var buf syncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("driver log:\n%s", buf.String())
		}
	})
	return log.NewLogfmtLogger(&buf)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
