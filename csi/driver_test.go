package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// newTestDriver returns a driver over mounter with a fresh publish
// directory (holding one file) and a directory for targets.
func newTestDriver(t *testing.T, mounter Mounter) (d *Driver, publishDir, targets string) {
	t.Helper()
	dir := t.TempDir()
	publishDir = filepath.Join(dir, "publish")
	targets = filepath.Join(dir, "pods")
	for _, p := range []string{publishDir, targets} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(publishDir, "marker"), []byte("published\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return restartDriver(t, mounter, publishDir), publishDir, targets
}

// restartDriver returns a new Driver instance over the same mount table and
// publish directory: what the node sees after the plugin restarted. Its
// pods directory is publishDir's sibling "pods" (newTestDriver's targets).
func restartDriver(t *testing.T, mounter Mounter, publishDir string) *Driver {
	t.Helper()
	pods := filepath.Join(filepath.Dir(publishDir), "pods")
	d, err := NewDriver(Config{Name: DefaultDriverName, Version: "1.2.3", NodeID: "node-a", PublishDir: publishDir, PodsDir: pods, Mounter: mounter})
	if err != nil {
		t.Fatalf("NewDriver: %v", err)
	}
	return d
}

// kubeletPublish is the request the kubelet sends for an inline volume
// `csi: {driver: csi.gpumem.io, readOnly: true}` (CSIDriver with
// podInfoOnMount: true).
func kubeletPublish(target string) *csipb.NodePublishVolumeRequest {
	return &csipb.NodePublishVolumeRequest{
		VolumeId:   "csi-0123456789abcdef",
		TargetPath: target,
		VolumeCapability: &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		Readonly: true,
		VolumeContext: map[string]string{
			EphemeralKey:                             "true",
			"csi.storage.k8s.io/pod.name":            "train-0",
			"csi.storage.k8s.io/pod.namespace":       "ml",
			"csi.storage.k8s.io/pod.uid":             "6b0c5a6e-8f1e-4a0e-9d55-3c1f5e0f2a11",
			"csi.storage.k8s.io/serviceAccount.name": "default",
		},
	}
}

func unpublishReq(target string) *csipb.NodeUnpublishVolumeRequest {
	return &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-0123456789abcdef", TargetPath: target}
}

func wantCode(t *testing.T, err error, code codes.Code, msgPart string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got error %v (code %s), want code %s", err, status.Code(err), code)
	}
	if msgPart != "" && !strings.Contains(status.Convert(err).Message(), msgPart) {
		t.Fatalf("error %q does not say %q", status.Convert(err).Message(), msgPart)
	}
}

func exists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func TestNewDriverRejectsBadConfig(t *testing.T) {
	good := Config{Name: DefaultDriverName, Version: "1", NodeID: "n", PublishDir: "/run/gpumem", PodsDir: "/var/lib/kubelet/pods", Mounter: newFakeMounter()}
	tests := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"empty name", func(c *Config) { c.Name = "" }, "not a valid CSI plugin name"},
		{"name with a slash", func(c *Config) { c.Name = "csi/gpumem" }, "not a valid CSI plugin name"},
		{"name over 63 characters", func(c *Config) { c.Name = "a" + strings.Repeat(".b", 32) }, "not a valid CSI plugin name"},
		{"no node id", func(c *Config) { c.NodeID = "" }, "node id"},
		{"no version", func(c *Config) { c.Version = "" }, "version"},
		{"relative publish dir", func(c *Config) { c.PublishDir = "run/gpumem" }, "absolute"},
		{"no mounter", func(c *Config) { c.Mounter = nil }, "mounter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.change(&c)
			_, err := NewDriver(c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewDriver: got error %v, want one saying %q", err, tt.want)
			}
		})
	}
	if _, err := NewDriver(good); err != nil {
		t.Fatalf("NewDriver with a good config: %v", err)
	}
}

func TestIdentityAndNodeInfo(t *testing.T) {
	d, publishDir, _ := newTestDriver(t, newFakeMounter())
	ctx := context.Background()

	info, err := d.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil || info.GetName() != DefaultDriverName || info.GetVendorVersion() != "1.2.3" {
		t.Fatalf("GetPluginInfo = %v, %v; want %s 1.2.3", info, err, DefaultDriverName)
	}
	caps, err := d.GetPluginCapabilities(ctx, &csipb.GetPluginCapabilitiesRequest{})
	if err != nil || len(caps.GetCapabilities()) != 0 {
		t.Fatalf("GetPluginCapabilities = %v, %v; want none (no controller service)", caps, err)
	}
	ncaps, err := d.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	if err != nil || len(ncaps.GetCapabilities()) != 0 {
		t.Fatalf("NodeGetCapabilities = %v, %v; want none", ncaps, err)
	}
	ni, err := d.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "node-a" {
		t.Fatalf("NodeGetInfo = %v, %v; want node-a", ni, err)
	}
	if _, err := d.Probe(ctx, &csipb.ProbeRequest{}); err != nil {
		t.Fatalf("Probe with the publish directory present: %v", err)
	}
	if err := os.RemoveAll(publishDir); err != nil {
		t.Fatal(err)
	}
	_, err = d.Probe(ctx, &csipb.ProbeRequest{})
	wantCode(t, err, codes.FailedPrecondition, "publish directory")
}

func TestUnimplementedNodeCalls(t *testing.T) {
	d, _, _ := newTestDriver(t, newFakeMounter())
	ctx := context.Background()
	calls := map[string]func() error{
		"NodeStageVolume":      func() error { _, err := d.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{}); return err },
		"NodeUnstageVolume":    func() error { _, err := d.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{}); return err },
		"NodeGetVolumeStats":   func() error { _, err := d.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{}); return err },
		"NodeExpandVolume":     func() error { _, err := d.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{}); return err },
		"NodeGetVolumeHealth":  func() error { _, err := d.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{}); return err },
		"NodeGetStorageHealth": func() error { _, err := d.NodeGetStorageHealth(ctx, &csipb.NodeGetStorageHealthRequest{}); return err },
	}
	for name, call := range calls {
		if err := call(); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s: got %v, want Unimplemented", name, err)
		}
	}
}

func TestPublishRejectsWhatItDoesNotServe(t *testing.T) {
	tests := []struct {
		name   string
		change func(*csipb.NodePublishVolumeRequest)
		want   string
	}{
		{"no volume id", func(r *csipb.NodePublishVolumeRequest) { r.VolumeId = "" }, "volume id is missing"},
		{"no target path", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = "" }, "target path is missing"},
		{"relative target path", func(r *csipb.NodePublishVolumeRequest) { r.TargetPath = "pods/x/mount" }, "not absolute"},
		{"no capability", func(r *csipb.NodePublishVolumeRequest) { r.VolumeCapability = nil }, "volume capability is missing"},
		{"block access", func(r *csipb.NodePublishVolumeRequest) {
			r.VolumeCapability.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
		}, "not block"},
		{"persistent volume (no volume context)", func(r *csipb.NodePublishVolumeRequest) { r.VolumeContext = nil }, "only inline ephemeral volumes"},
		{"persistent volume (ephemeral false)", func(r *csipb.NodePublishVolumeRequest) { r.VolumeContext[EphemeralKey] = "false" }, "only inline ephemeral volumes"},
		{"read-write", func(r *csipb.NodePublishVolumeRequest) { r.Readonly = false }, "readOnly: true"},
		{"unknown volume attribute", func(r *csipb.NodePublishVolumeRequest) { r.VolumeContext["socket"] = "/tmp/x" }, `"socket" is not supported`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newFakeMounter()
			d, _, targets := newTestDriver(t, m)
			target := filepath.Join(targets, "mount")
			req := kubeletPublish(target)
			tt.change(req)
			_, err := d.NodePublishVolume(context.Background(), req)
			wantCode(t, err, codes.InvalidArgument, tt.want)
			if m.total() != 0 {
				t.Errorf("a rejected publish left %d mounts", m.total())
			}
			if exists(t, target) {
				t.Errorf("a rejected publish created %s", target)
			}
		})
	}
}

func TestPublishBindsReadOnlyOnceAndUnpublishRemovesAll(t *testing.T) {
	m := newFakeMounter()
	d, publishDir, targets := newTestDriver(t, m)
	ctx := context.Background()
	// The kubelet creates the volume's directory, the plugin the target.
	target := filepath.Join(targets, "uid", "volumes", "kubernetes.io~csi", "gpumem", "mount")

	for i := 0; i < 3; i++ {
		if _, err := d.NodePublishVolume(ctx, kubeletPublish(target)); err != nil {
			t.Fatalf("publish #%d: %v", i+1, err)
		}
	}
	st, _ := m.Check(target, publishDir)
	if !st.Mounted || !st.OfSource || !st.ReadOnly {
		t.Fatalf("after publish the target is %+v, want a read-only bind of the publish directory", st)
	}
	if n := m.depth(target); n != 1 {
		t.Fatalf("three publishes of one target stacked %d mounts, want 1", n)
	}

	for i := 0; i < 2; i++ {
		if _, err := d.NodeUnpublishVolume(ctx, unpublishReq(target)); err != nil {
			t.Fatalf("unpublish #%d: %v", i+1, err)
		}
	}
	if m.total() != 0 {
		t.Fatalf("unpublish left %d mounts", m.total())
	}
	if exists(t, target) {
		t.Fatalf("unpublish left the target directory %s", target)
	}
	if !exists(t, filepath.Dir(target)) {
		t.Fatalf("unpublish removed the kubelet's directory %s too", filepath.Dir(target))
	}
}

func TestPublishAfterRestart(t *testing.T) {
	m := newFakeMounter()
	d, publishDir, targets := newTestDriver(t, m)
	ctx := context.Background()
	before := filepath.Join(targets, "before", "mount")
	after := filepath.Join(targets, "after", "mount")
	if _, err := d.NodePublishVolume(ctx, kubeletPublish(before)); err != nil {
		t.Fatal(err)
	}

	restarted := restartDriver(t, m, publishDir)
	// The kubelet may publish a target again after a restart (it retries
	// until it has an answer): no second mount.
	if _, err := restarted.NodePublishVolume(ctx, kubeletPublish(before)); err != nil {
		t.Fatalf("publish of an existing target after restart: %v", err)
	}
	if n := m.depth(before); n != 1 {
		t.Fatalf("publish after restart stacked %d mounts at the old target, want 1", n)
	}
	if _, err := restarted.NodePublishVolume(ctx, kubeletPublish(after)); err != nil {
		t.Fatalf("publish for a new pod after restart: %v", err)
	}
	for _, target := range []string{before, after} {
		if _, err := restarted.NodeUnpublishVolume(ctx, unpublishReq(target)); err != nil {
			t.Fatalf("unpublish %s after restart: %v", target, err)
		}
		if exists(t, target) {
			t.Fatalf("unpublish after restart left %s", target)
		}
	}
	if m.total() != 0 {
		t.Fatalf("%d mounts left", m.total())
	}
}

func TestPublishRepairsAWritableBind(t *testing.T) {
	m := newFakeMounter()
	d, publishDir, targets := newTestDriver(t, m)
	target := filepath.Join(targets, "mount")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	// A plugin killed between the bind and the read-only remount.
	m.preload(target, fakeMount{source: publishDir, readOnly: false})
	if _, err := d.NodePublishVolume(context.Background(), kubeletPublish(target)); err != nil {
		t.Fatal(err)
	}
	st, _ := m.Check(target, publishDir)
	if !st.ReadOnly || m.depth(target) != 1 {
		t.Fatalf("after publish over a writable bind: %+v with %d mounts, want one read-only mount", st, m.depth(target))
	}
}

func TestPublishRefusesATargetHoldingAnotherMount(t *testing.T) {
	m := newFakeMounter()
	d, _, targets := newTestDriver(t, m)
	target := filepath.Join(targets, "mount")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	m.preload(target, fakeMount{source: "/somewhere/else", readOnly: true})
	_, err := d.NodePublishVolume(context.Background(), kubeletPublish(target))
	wantCode(t, err, codes.AlreadyExists, "another mount")
	if m.depth(target) != 1 {
		t.Fatalf("the refused publish changed the mounts at the target: %d", m.depth(target))
	}
}

func TestPublishFailureCleansUp(t *testing.T) {
	for _, preexisting := range []bool{false, true} {
		t.Run(fmt.Sprintf("target existed=%v", preexisting), func(t *testing.T) {
			m := newFakeMounter()
			m.bindErr = errors.New("mount: operation not permitted")
			d, _, targets := newTestDriver(t, m)
			target := filepath.Join(targets, "mount")
			if preexisting {
				if err := os.Mkdir(target, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			_, err := d.NodePublishVolume(context.Background(), kubeletPublish(target))
			wantCode(t, err, codes.Internal, "operation not permitted")
			if exists(t, target) != preexisting {
				t.Fatalf("after a failed bind the target exists=%v, want %v (remove only what publish created)", !preexisting, preexisting)
			}
		})
	}
}

func TestPublishFailsWhenThePublishDirIsGone(t *testing.T) {
	m := newFakeMounter()
	d, publishDir, targets := newTestDriver(t, m)
	if err := os.RemoveAll(publishDir); err != nil {
		t.Fatal(err)
	}
	_, err := d.NodePublishVolume(context.Background(), kubeletPublish(filepath.Join(targets, "mount")))
	wantCode(t, err, codes.FailedPrecondition, "publish directory")
}

func TestUnpublish(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(t *testing.T, m *fakeMounter, publishDir, target string)
		wantCode  codes.Code
		wantGone  bool
		wantMsg   string
		wantDepth int
	}{
		{
			name:     "never published",
			setup:    func(*testing.T, *fakeMounter, string, string) {},
			wantCode: codes.OK, wantGone: true,
		},
		{
			name: "directory without a mount",
			setup: func(t *testing.T, _ *fakeMounter, _, target string) {
				mustMkdir(t, target)
			},
			wantCode: codes.OK, wantGone: true,
		},
		{
			name: "stacked mounts",
			setup: func(t *testing.T, m *fakeMounter, publishDir, target string) {
				mustMkdir(t, target)
				for i := 0; i < 3; i++ {
					m.preload(target, fakeMount{source: publishDir, readOnly: true})
				}
			},
			wantCode: codes.OK, wantGone: true,
		},
		{
			name: "a directory with files and no mount is not deleted",
			setup: func(t *testing.T, _ *fakeMounter, _, target string) {
				mustMkdir(t, target)
				if err := os.WriteFile(filepath.Join(target, "data"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			wantCode: codes.Internal, wantMsg: "removing target directory",
		},
		{
			name: "more stacked mounts than the bound",
			setup: func(t *testing.T, m *fakeMounter, publishDir, target string) {
				mustMkdir(t, target)
				for i := 0; i < maxStackedMounts+1; i++ {
					m.preload(target, fakeMount{source: publishDir, readOnly: true})
				}
			},
			wantCode: codes.Internal, wantMsg: "still mounted", wantDepth: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newFakeMounter()
			d, publishDir, targets := newTestDriver(t, m)
			target := filepath.Join(targets, "mount")
			tt.setup(t, m, publishDir, target)
			_, err := d.NodeUnpublishVolume(context.Background(), unpublishReq(target))
			if tt.wantCode == codes.OK {
				if err != nil {
					t.Fatalf("unpublish: %v", err)
				}
			} else {
				wantCode(t, err, tt.wantCode, tt.wantMsg)
			}
			if gone := !exists(t, target); gone != tt.wantGone {
				t.Errorf("target gone=%v, want %v", gone, tt.wantGone)
			}
			if got := m.depth(target); got != tt.wantDepth {
				t.Errorf("%d mounts left at the target, want %d", got, tt.wantDepth)
			}
		})
	}
}

func TestUnpublishRejectsBadRequests(t *testing.T) {
	d, _, _ := newTestDriver(t, newFakeMounter())
	for _, tt := range []struct {
		req  *csipb.NodeUnpublishVolumeRequest
		want string
	}{
		{&csipb.NodeUnpublishVolumeRequest{TargetPath: "/x"}, "volume id is missing"},
		{&csipb.NodeUnpublishVolumeRequest{VolumeId: "v"}, "target path is missing"},
		{&csipb.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: "x/mount"}, "not absolute"},
	} {
		_, err := d.NodeUnpublishVolume(context.Background(), tt.req)
		wantCode(t, err, codes.InvalidArgument, tt.want)
	}
}

// Many pods starting and stopping at once (run with -race).
func TestConcurrentPublishAndUnpublish(t *testing.T) {
	m := newFakeMounter()
	d, _, targets := newTestDriver(t, m)
	ctx := context.Background()
	const pods = 32
	var wg sync.WaitGroup
	errs := make(chan error, 2*pods)
	for i := 0; i < pods; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			target := filepath.Join(targets, fmt.Sprint(i), "mount")
			if _, err := d.NodePublishVolume(ctx, kubeletPublish(target)); err != nil {
				errs <- fmt.Errorf("publish %d: %w", i, err)
				return
			}
			if _, err := d.NodeUnpublishVolume(ctx, unpublishReq(target)); err != nil {
				errs <- fmt.Errorf("unpublish %d: %w", i, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m.total() != 0 || m.binds != pods {
		t.Fatalf("after %d pods: %d mounts left, %d binds made; want 0 and %d", pods, m.total(), m.binds, pods)
	}
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}
