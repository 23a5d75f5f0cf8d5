// Package csi is a CSI node plugin for inline ephemeral volumes: each
// volume is a read-only bind of one host directory (the publish directory,
// which holds the allocator socket and the Python client) into a pod.
// Pod Security "restricted" admits such a csi: volume where it forbids a
// hostPath. Registration with the kubelet is the node-driver-registrar
// sidecar's job; this package only serves the CSI endpoint.
package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-kit/log"
	"github.com/go-kit/log/level"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// DefaultDriverName is the CSI driver name (also the CSIDriver object's
	// name and the csi: volume's driver).
	DefaultDriverName = "csi.gpumem.io"
	// EphemeralKey is the volume context key that the kubelet sets to
	// "true" for an inline ephemeral volume. The kubelet sends it only
	// when the CSIDriver object has podInfoOnMount: true.
	EphemeralKey = "csi.storage.k8s.io/ephemeral"
	// kubeletKeyPrefix marks the volume context keys the kubelet adds
	// (pod name, namespace, uid, service account, ephemeral).
	kubeletKeyPrefix = "csi.storage.k8s.io/"
	// maxStackedMounts bounds the unmount loop of NodeUnpublishVolume.
	maxStackedMounts = 16
)

// driverNameRE is the CSI spec's rule for a plugin name (at most 63
// characters, checked separately).
var driverNameRE = regexp.MustCompile(`^[a-zA-Z][A-Za-z0-9._-]{0,61}[a-zA-Z]$`)

// Config is what a Driver serves.
type Config struct {
	Name       string // CSI driver name, e.g. DefaultDriverName
	Version    string // reported by GetPluginInfo
	NodeID     string // reported by NodeGetInfo
	PublishDir string // the host directory bind-mounted into each pod
	Mounter    Mounter
	Logger     log.Logger
}

// Driver implements the CSI Identity and Node services. It keeps no state
// between calls beyond a lock: the mount table is the truth, so a new
// instance (after a restart) publishes and unpublishes as the old one did.
type Driver struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer

	cfg Config
	mu  sync.Mutex // serialises publish and unpublish: each is a check then a change
}

// NewDriver checks the configuration and returns a Driver.
func NewDriver(cfg Config) (*Driver, error) {
	if len(cfg.Name) > 63 || !driverNameRE.MatchString(cfg.Name) {
		return nil, fmt.Errorf("driver name %q is not a valid CSI plugin name (a domain-like name of at most 63 characters, starting and ending with a letter)", cfg.Name)
	}
	if cfg.NodeID == "" {
		return nil, errors.New("node id is empty")
	}
	if cfg.Version == "" {
		return nil, errors.New("version is empty")
	}
	if !filepath.IsAbs(cfg.PublishDir) {
		return nil, fmt.Errorf("publish directory %q is not an absolute path", cfg.PublishDir)
	}
	if cfg.Mounter == nil {
		return nil, errors.New("no mounter")
	}
	if cfg.Logger == nil {
		cfg.Logger = log.NewNopLogger()
	}
	cfg.PublishDir = filepath.Clean(cfg.PublishDir)
	return &Driver{cfg: cfg}, nil
}

// GetPluginInfo returns the driver's name and version.
func (d *Driver) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: d.cfg.Name, VendorVersion: d.cfg.Version}, nil
}

// GetPluginCapabilities returns none: there is no controller service (an
// inline ephemeral volume is never provisioned or attached).
func (d *Driver) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{}, nil
}

// Probe reports ready while the publish directory exists.
func (d *Driver) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	if _, err := os.Stat(d.cfg.PublishDir); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "publish directory: %v", err)
	}
	return &csipb.ProbeResponse{}, nil
}

// NodeGetCapabilities returns none: publish and unpublish are all an
// inline ephemeral volume needs (no staging, no stats, no expansion).
func (d *Driver) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

// NodeGetInfo returns the node id.
func (d *Driver) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: d.cfg.NodeID}, nil
}

// NodePublishVolume bind-mounts the publish directory, read-only, at the
// target path. Publishing the same target again succeeds and mounts
// nothing more.
func (d *Driver) NodePublishVolume(_ context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	if err := validatePublish(req); err != nil {
		return nil, err
	}
	target := filepath.Clean(req.GetTargetPath())
	logger := log.With(d.cfg.Logger, "volume_id", req.GetVolumeId(), "target", target, "pod", podOf(req.GetVolumeContext()))

	d.mu.Lock()
	defer d.mu.Unlock()

	if _, err := os.Stat(d.cfg.PublishDir); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "publish directory: %v", err)
	}
	created, err := makeTargetDir(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "creating target directory: %v", err)
	}
	st, err := d.cfg.Mounter.Check(target, d.cfg.PublishDir)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "checking target %s: %v", target, err)
	}
	switch {
	case st.Mounted && st.OfSource && st.ReadOnly:
		level.Debug(logger).Log("msg", "already published")
		return &csipb.NodePublishVolumeResponse{}, nil
	case st.Mounted && !st.OfSource:
		return nil, status.Errorf(codes.AlreadyExists, "target %s already holds another mount", target)
	case st.Mounted:
		// A bind of the publish directory that is not read-only: a plugin
		// stopped between the bind and the remount. Redo it.
		level.Warn(logger).Log("msg", "target holds a writable bind of the publish directory; mounting it again read-only")
		if err := d.cfg.Mounter.Unmount(target); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
	}
	if err := d.cfg.Mounter.BindReadOnly(d.cfg.PublishDir, target); err != nil {
		if created {
			_ = os.Remove(target)
		}
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	level.Info(logger).Log("msg", "published")
	return &csipb.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target path (every mount stacked there)
// and removes the directory. Unpublishing a target that is gone succeeds.
func (d *Driver) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is missing")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is missing")
	}
	if !filepath.IsAbs(req.GetTargetPath()) {
		return nil, status.Errorf(codes.InvalidArgument, "target path %q is not absolute", req.GetTargetPath())
	}
	target := filepath.Clean(req.GetTargetPath())
	logger := log.With(d.cfg.Logger, "volume_id", req.GetVolumeId(), "target", target)

	d.mu.Lock()
	defer d.mu.Unlock()

	for i := 0; ; i++ {
		st, err := d.cfg.Mounter.Check(target, d.cfg.PublishDir)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "checking target %s: %v", target, err)
		}
		if !st.Mounted {
			break
		}
		if i == maxStackedMounts {
			return nil, status.Errorf(codes.Internal, "target %s is still mounted after %d unmounts", target, maxStackedMounts)
		}
		if err := d.cfg.Mounter.Unmount(target); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
	}
	// os.Remove, not RemoveAll: should a mount survive, RemoveAll would walk
	// into it; Remove only takes an empty directory.
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing target directory: %v", err)
	}
	level.Info(logger).Log("msg", "unpublished")
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// validatePublish checks a publish request against what this driver serves:
// inline ephemeral, read-only, filesystem volumes.
func validatePublish(req *csipb.NodePublishVolumeRequest) error {
	switch {
	case req.GetVolumeId() == "":
		return status.Error(codes.InvalidArgument, "volume id is missing")
	case req.GetTargetPath() == "":
		return status.Error(codes.InvalidArgument, "target path is missing")
	case !filepath.IsAbs(req.GetTargetPath()):
		return status.Errorf(codes.InvalidArgument, "target path %q is not absolute", req.GetTargetPath())
	case req.GetVolumeCapability() == nil:
		return status.Error(codes.InvalidArgument, "volume capability is missing")
	case req.GetVolumeCapability().GetMount() == nil:
		return status.Error(codes.InvalidArgument, "only filesystem volumes are served (volume capability access type must be mount, not block)")
	}
	vc := req.GetVolumeContext()
	if vc[EphemeralKey] != "true" {
		return status.Errorf(codes.InvalidArgument,
			"only inline ephemeral volumes are served (volume context %s=%q, want \"true\"): use a csi: volume in the pod spec, not a PersistentVolume, and give the CSIDriver object volumeLifecycleModes [Ephemeral] and podInfoOnMount: true",
			EphemeralKey, vc[EphemeralKey])
	}
	if !req.GetReadonly() {
		return status.Error(codes.InvalidArgument,
			"the volume must be read-only (readOnly: true in the pod's csi: volume): it shares one host directory with every pod on the node, so no pod may write to it")
	}
	for k := range vc {
		if !strings.HasPrefix(k, kubeletKeyPrefix) {
			return status.Errorf(codes.InvalidArgument, "volume attribute %q is not supported: this driver takes no volumeAttributes", k)
		}
	}
	return nil
}

// makeTargetDir creates the target directory (and its parents) and says
// whether it did.
func makeTargetDir(target string) (bool, error) {
	fi, err := os.Stat(target)
	if err == nil {
		if !fi.IsDir() {
			return false, fmt.Errorf("%s exists and is not a directory", target)
		}
		return false, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return false, err
	}
	return true, nil
}

// podOf names the pod in a kubelet's volume context, for logs.
func podOf(vc map[string]string) string {
	ns, name := vc[kubeletKeyPrefix+"pod.namespace"], vc[kubeletKeyPrefix+"pod.name"]
	if ns == "" && name == "" {
		return ""
	}
	return ns + "/" + name
}
