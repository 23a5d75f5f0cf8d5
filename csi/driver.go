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
	// PodsDir is the kubelet's pods directory (/var/lib/kubelet/pods): the
	// only place where the driver publishes or unpublishes.
	PodsDir string
	Mounter Mounter
	Logger  log.Logger
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
	if !filepath.IsAbs(cfg.PodsDir) {
		return nil, fmt.Errorf("pods directory %q is not an absolute path", cfg.PodsDir)
	}
	if cfg.Mounter == nil {
		return nil, errors.New("no mounter")
	}
	if cfg.Logger == nil {
		cfg.Logger = log.NewNopLogger()
	}
	cfg.PublishDir = filepath.Clean(cfg.PublishDir)
	cfg.PodsDir = filepath.Clean(cfg.PodsDir)
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
// target path, which must lie below the kubelet's pods directory, reached
// through real directories only (no symbolic link below the pods
// directory). Publishing the same target again succeeds and mounts nothing
// more.
func (d *Driver) NodePublishVolume(_ context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	if err := validatePublish(req); err != nil {
		return nil, err
	}
	target, err := d.confine(req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	logger := log.With(d.cfg.Logger, "volume_id", req.GetVolumeId(), "target", target, "pod", podOf(req.GetVolumeContext()))

	d.mu.Lock()
	defer d.mu.Unlock()

	if _, err := os.Stat(d.cfg.PublishDir); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "publish directory: %v", err)
	}
	created, err := makeTargetDir(d.cfg.PodsDir, target)
	if err != nil {
		if errors.Is(err, errLinkInTarget) {
			return nil, status.Errorf(codes.InvalidArgument, "target %s: %v", target, err)
		}
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

// NodeUnpublishVolume unmounts the target path (every bind of the publish
// directory stacked there) and removes the directory. It unmounts nothing
// else: a target that holds another mount is left as it is, and the call
// fails. Unpublishing a target that is gone succeeds.
func (d *Driver) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is missing")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target path is missing")
	}
	target, err := d.confine(req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	logger := log.With(d.cfg.Logger, "volume_id", req.GetVolumeId(), "target", target)

	d.mu.Lock()
	defer d.mu.Unlock()

	switch err := checkNoLinks(d.cfg.PodsDir, target); {
	case errors.Is(err, os.ErrNotExist):
		level.Info(logger).Log("msg", "unpublished (target gone)")
		return &csipb.NodeUnpublishVolumeResponse{}, nil
	case errors.Is(err, errLinkInTarget):
		return nil, status.Errorf(codes.InvalidArgument, "target %s: %v", target, err)
	case err != nil:
		return nil, status.Errorf(codes.Internal, "checking target %s: %v", target, err)
	}
	for i := 0; ; i++ {
		st, err := d.cfg.Mounter.Check(target, d.cfg.PublishDir)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "checking target %s: %v", target, err)
		}
		if !st.Mounted {
			break
		}
		if !st.OfSource {
			return nil, status.Errorf(codes.FailedPrecondition, "target %s holds a mount that is not a bind of the publish directory: left alone", target)
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

// errLinkInTarget: a component of a target path below the pods directory
// is a symbolic link (or not a directory), which could lead out of it.
var errLinkInTarget = errors.New("the path below the pods directory holds a symbolic link or a non-directory")

// confine checks that path, cleaned, lies below the pods directory: the
// kubelet's targets are <pods>/<pod uid>/volumes/..., and a target such as
// <pods>/../victim is refused.
func (d *Driver) confine(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", status.Errorf(codes.InvalidArgument, "target path %q is not absolute", path)
	}
	target := filepath.Clean(path)
	if target == d.cfg.PodsDir || !pathWithin(target, d.cfg.PodsDir) {
		return "", status.Errorf(codes.InvalidArgument, "target path %q is not below the kubelet's pods directory %s", path, d.cfg.PodsDir)
	}
	return target, nil
}

// walkBelow visits each component of target below pods (target must be
// below it), in order, with its Lstat, without following any link:
// visit gets the path and its Lstat error; it may create a missing
// directory and return its own error to stop.
func walkBelow(pods, target string, visit func(p string, fi os.FileInfo, err error) error) error {
	rel, err := filepath.Rel(pods, target)
	if err != nil {
		return err
	}
	p := pods
	for _, name := range strings.Split(rel, string(filepath.Separator)) {
		p = filepath.Join(p, name)
		fi, err := os.Lstat(p)
		if err := visit(p, fi, err); err != nil {
			return err
		}
	}
	return nil
}

// checkNoLinks fails with errLinkInTarget when a component of target below
// pods is a symbolic link or not a directory, and with an error matching
// os.ErrNotExist when one is missing.
func checkNoLinks(pods, target string) error {
	return walkBelow(pods, target, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w: %s is %s", errLinkInTarget, p, fi.Mode().Type())
		}
		return nil
	})
}

// makeTargetDir creates the target directory (and its parents below pods)
// without following a link, and says whether it created the target.
func makeTargetDir(pods, target string) (bool, error) {
	created := false
	err := walkBelow(pods, target, func(p string, fi os.FileInfo, err error) error {
		if errors.Is(err, os.ErrNotExist) {
			if err := os.Mkdir(p, 0o750); err != nil {
				return err
			}
			if fi, err = os.Lstat(p); err != nil {
				return err
			}
			created = p == target
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%w: %s is %s", errLinkInTarget, p, fi.Mode().Type())
		}
		return nil
	})
	return created, err
}

// podOf names the pod in a kubelet's volume context, for logs.
func podOf(vc map[string]string) string {
	ns, name := vc[kubeletKeyPrefix+"pod.namespace"], vc[kubeletKeyPrefix+"pod.name"]
	if ns == "" && name == "" {
		return ""
	}
	return ns + "/" + name
}
