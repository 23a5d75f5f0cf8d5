//go:build linux

package csi

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// The attacks of docs/security.md on the CSI plugin, with real mounts: a
// caller of the CSI socket (root-only, the kubelet's) names a target
// outside the kubelet's pods directory, or one reached through a symbolic
// link, or asks to unpublish a mount that is not the plugin's.

// victimDir makes a directory outside the pods directory holding a file,
// and returns it and a check that the file is still visible there (no
// mount hides it).
func victimDir(t *testing.T, base string) (string, func(what string)) {
	t.Helper()
	victim := filepath.Join(base, "victim")
	mustMkdir(t, victim)
	if err := os.WriteFile(filepath.Join(victim, "data"), []byte("victim's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cleanupMounts(t, victim)
	return victim, func(what string) {
		t.Helper()
		if n := len(mountsAt(t, victim)); n != 0 {
			t.Errorf("%s: %d mounts over the victim's directory %s", what, n, victim)
		}
		if b, err := os.ReadFile(filepath.Join(victim, "data")); err != nil || string(b) != "victim's\n" {
			t.Errorf("%s: the victim's file reads %q (%v)", what, b, err)
		}
	}
}

func TestPublishOnlyBelowThePodsDirectoryWithoutLinks(t *testing.T) {
	requireMount(t)
	d, _, pods := newTestDriver(t, NewMounter())
	base := filepath.Dir(pods)
	victim, intact := victimDir(t, base)
	pod := filepath.Join(pods, "6b0c5a6e", "volumes", "kubernetes.io~csi", "gpumem")
	if err := os.MkdirAll(pod, 0o750); err != nil {
		t.Fatal(err)
	}
	linkedTarget := filepath.Join(pod, "mount")
	if err := os.Symlink(victim, linkedTarget); err != nil {
		t.Fatal(err)
	}
	linkedPod := filepath.Join(pods, "linked-pod")
	if err := os.Symlink(base, linkedPod); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, target string }{
		{"<pods>/../victim", pods + "/../victim"},
		{"a target that is a link out of the pods directory", linkedTarget},
		{"a target below a link out of the pods directory", filepath.Join(linkedPod, "victim")},
		{"the pods directory itself", pods},
		{"a sibling whose name starts like it", pods + "-other/mount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.NodePublishVolume(context.Background(), kubeletPublish(tc.target))
			wantCode(t, err, codes.InvalidArgument, "")
			intact("publish at " + tc.target)
		})
	}
	if exists(t, pods+"-other") {
		t.Error("publish created a directory outside the pods directory")
	}
}

func TestUnpublishLeavesForeignMountsAlone(t *testing.T) {
	requireMount(t)
	d, _, pods := newTestDriver(t, NewMounter())
	foreign := filepath.Join(pods, "6b0c5a6e", "volumes", "kubernetes.io~empty-dir", "scratch")
	if err := os.MkdirAll(foreign, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", foreign, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	cleanupMounts(t, foreign)
	if err := os.WriteFile(filepath.Join(foreign, "data"), []byte("pod's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(pods, "linked")
	if err := os.Symlink(foreign, linked); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{foreign, linked} {
		_, err := d.NodeUnpublishVolume(context.Background(), unpublishReq(target))
		if err == nil {
			t.Errorf("unpublish %s (a foreign tmpfs) succeeded", target)
		}
		if n := len(mountsAt(t, foreign)); n != 1 {
			t.Errorf("unpublish %s: %d mounts left at the foreign tmpfs's place, want its 1", target, n)
		}
		if b, err := os.ReadFile(filepath.Join(foreign, "data")); err != nil || string(b) != "pod's\n" {
			t.Errorf("unpublish %s: the tmpfs's file reads %q (%v)", target, b, err)
		}
	}
	// Nor does it publish over it.
	if _, err := d.NodePublishVolume(context.Background(), kubeletPublish(foreign)); err == nil {
		t.Error("publish over a foreign mount succeeded")
	}
}
