package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-kit/log"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/gpumem/gpumem_exporter/csi"
)

func TestParseFlagsDefaults(t *testing.T) {
	t.Setenv("NODE_NAME", "gpu-node-7")
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := options{
		endpoint:      "unix:///csi/csi.sock",
		driverName:    "csi.gpumem.io",
		nodeID:        "gpu-node-7",
		publishDir:    "/run/gpumem",
		podsDir:       "/var/lib/kubelet/pods",
		clientDir:     "/opt/gpumem/clients",
		owner:         "65532:65532",
		healthAddress: ":9810",
		logLevel:      "info",
		logFormat:     "logfmt",
	}
	if *o != want {
		t.Fatalf("defaults = %+v\nwant       %+v", *o, want)
	}
	o, err = parseFlags([]string{"--csi.node-id=other", "--csi.publish-dir-owner=", "--log.format=json"})
	if err != nil {
		t.Fatal(err)
	}
	if o.nodeID != "other" || o.owner != "" || o.logFormat != "json" {
		t.Fatalf("flags not applied: %+v", *o)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	tests := []struct {
		name string
		env  string
		args []string
		want string
	}{
		{"no node id", "", nil, "node-id"},
		{"empty node id", "", []string{"--csi.node-id="}, "node-id"},
		{"owner without gid", "n", []string{"--csi.publish-dir-owner=65532"}, "--csi.publish-dir-owner"},
		{"tcp endpoint", "n", []string{"--csi.endpoint=tcp://127.0.0.1:1"}, "only unix sockets"},
		{"relative socket", "n", []string{"--csi.endpoint=unix://csi.sock"}, "absolute"},
		{"unknown log level", "n", []string{"--log.level=trace"}, "must be one of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tt.env)
			if tt.env == "" {
				os.Unsetenv("NODE_NAME")
			}
			_, err := parseFlags(tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("parseFlags(%q): got %v, want an error saying %q", tt.args, err, tt.want)
			}
		})
	}
}

// testPlugin is a plugin started on temporary paths.
type testPlugin struct {
	*plugin
	opts   *options
	cancel context.CancelFunc
	done   chan error
}

// testOptions returns options on temporary paths, with a client tree whose
// __init__.py says version.
func testOptions(t *testing.T, version string) *options {
	t.Helper()
	dir := t.TempDir()
	// Socket paths must fit in 108 bytes: a short directory for the endpoint.
	sockDir, err := os.MkdirTemp("", "gcsi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	clientDir := filepath.Join(dir, "clients")
	writeClient(t, clientDir, version)
	return &options{
		endpoint:      "unix://" + filepath.Join(sockDir, "csi.sock"),
		driverName:    csi.DefaultDriverName,
		nodeID:        "node-1",
		publishDir:    filepath.Join(dir, "run", "gpumem"),
		podsDir:       filepath.Join(dir, "pods"),
		clientDir:     clientDir,
		owner:         "",
		healthAddress: "127.0.0.1:0",
		logLevel:      "debug",
		logFormat:     "logfmt",
	}
}

func writeClient(t *testing.T, clientDir, version string) {
	t.Helper()
	for _, f := range []string{"gpumem/__init__.py", "autostart/sitecustomize.py"} {
		p := filepath.Join(clientDir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("# "+version+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func startPlugin(t *testing.T, o *options, mounter csi.Mounter) *testPlugin {
	t.Helper()
	p, err := start(o, mounter, log.NewNopLogger())
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tp := &testPlugin{plugin: p, opts: o, cancel: cancel, done: make(chan error, 1)}
	go func() { tp.done <- p.serve(ctx) }()
	t.Cleanup(func() { tp.stop(t) })
	return tp
}

// stop stops the plugin (once) and checks that it exits cleanly.
func (tp *testPlugin) stop(t *testing.T) {
	t.Helper()
	if tp.cancel == nil {
		return
	}
	tp.cancel()
	tp.cancel = nil
	select {
	case err := <-tp.done:
		if err != nil {
			t.Errorf("serve returned %v after a stop", err)
		}
	case <-time.After(2 * shutdownGrace):
		t.Fatalf("serve did not return within %s of a stop", 2*shutdownGrace)
	}
}

func dial(t *testing.T, endpoint string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestPluginServesCSIAndHealthThenStops(t *testing.T) {
	o := testOptions(t, "1")
	tp := startPlugin(t, o, csi.NewMounter())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	conn := dial(t, o.endpoint)
	info, err := csipb.NewIdentityClient(conn).GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil {
		t.Fatalf("GetPluginInfo: %v", err)
	}
	if info.GetName() != csi.DefaultDriverName || info.GetVendorVersion() == "" {
		t.Fatalf("GetPluginInfo = %v, want %s and a version", info, csi.DefaultDriverName)
	}
	ni, err := csipb.NewNodeClient(conn).NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "node-1" {
		t.Fatalf("NodeGetInfo = %v, %v; want node-1", ni, err)
	}

	resp, err := http.Get("http://" + tp.healthAddr.String() + "/-/healthy")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Healthy") {
		t.Fatalf("/-/healthy: %d %q", resp.StatusCode, body)
	}

	fi, err := os.Stat(o.publishDir)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("publish dir: %v, %v; want a 0755 directory", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(o.publishDir, csi.ClientsDir, "gpumem", "__init__.py")); err != nil || string(b) != "# 1\n" {
		t.Fatalf("installed client: %q, %v", b, err)
	}

	tp.stop(t)
	socket, _ := csi.SocketPath(o.endpoint)
	if _, err := os.Lstat(socket); !os.IsNotExist(err) {
		t.Fatalf("socket %s still there after stop (%v)", socket, err)
	}
}

func TestStartReplacesAStaleSocketOnly(t *testing.T) {
	o := testOptions(t, "1")
	socket, _ := csi.SocketPath(o.endpoint)
	// A socket left by a killed plugin.
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	tp := startPlugin(t, o, csi.NewMounter())
	tp.stop(t)

	if err := os.WriteFile(socket, []byte("not a socket"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := start(o, csi.NewMounter(), log.NewNopLogger()); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("start over a regular file: got %v, want an error saying it is not a socket", err)
	}
}

func TestStartFailsWithoutClientDir(t *testing.T) {
	o := testOptions(t, "1")
	o.clientDir = filepath.Join(t.TempDir(), "missing")
	if _, err := start(o, csi.NewMounter(), log.NewNopLogger()); err == nil || !strings.Contains(err.Error(), "copying the client") {
		t.Fatalf("start with a missing client dir: got %v, want an error", err)
	}
	o.clientDir = ""
	p, err := start(o, csi.NewMounter(), log.NewNopLogger())
	if err != nil {
		t.Fatalf("start with --csi.client-dir empty: %v", err)
	}
	p.csiLis.Close()
	p.healthLis.Close()
	if _, err := os.Stat(filepath.Join(o.publishDir, csi.ClientsDir)); !os.IsNotExist(err) {
		t.Fatalf("an empty --csi.client-dir installed a client (%v)", err)
	}
}

// canMount says whether this process may bind-mount.
func canMount(t *testing.T) error {
	t.Helper()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, p := range []string{src, dst} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return unix.Unmount(dst, 0)
}

func publishRequest(target string) *csipb.NodePublishVolumeRequest {
	return &csipb.NodePublishVolumeRequest{
		VolumeId:         "csi-abc",
		TargetPath:       target,
		VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}}},
		Readonly:         true,
		VolumeContext:    map[string]string{csi.EphemeralKey: "true"},
	}
}

// The plugin restarts (a new image, a crash) while a pod runs: the pod's
// mount stays and shows the new client; new pods publish; the old pod's
// volume unpublishes.
func TestRestartWithPodsRunning(t *testing.T) {
	if err := canMount(t); err != nil {
		t.Skipf("real bind mounts are not possible here (%v): skipped; csi's fake-mounter tests cover restarts", err)
	}
	o := testOptions(t, "1")
	pods := o.podsDir
	if err := os.Mkdir(pods, 0o755); err != nil {
		t.Fatal(err)
	}
	oldPod, newPod := filepath.Join(pods, "old", "mount"), filepath.Join(pods, "new", "mount")
	t.Cleanup(func() {
		for _, p := range []string{oldPod, newPod} {
			for unix.Unmount(p, unix.MNT_DETACH) == nil {
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	first := startPlugin(t, o, csi.NewMounter())
	if _, err := csipb.NewNodeClient(dial(t, o.endpoint)).NodePublishVolume(ctx, publishRequest(oldPod)); err != nil {
		t.Fatalf("publish before restart: %v", err)
	}
	first.stop(t)

	writeClient(t, o.clientDir, "2")
	startPlugin(t, o, csi.NewMounter())
	node := csipb.NewNodeClient(dial(t, o.endpoint))
	if b, err := os.ReadFile(filepath.Join(oldPod, csi.ClientsDir, "gpumem", "__init__.py")); err != nil || string(b) != "# 2\n" {
		t.Fatalf("the running pod sees client %q (%v), want the new one", b, err)
	}
	if _, err := node.NodePublishVolume(ctx, publishRequest(newPod)); err != nil {
		t.Fatalf("publish after restart: %v", err)
	}
	for _, p := range []string{oldPod, newPod} {
		if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-abc", TargetPath: p}); err != nil {
			t.Fatalf("unpublish %s after restart: %v", p, err)
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Fatalf("%s still there after unpublish (%v)", p, err)
		}
	}
}
