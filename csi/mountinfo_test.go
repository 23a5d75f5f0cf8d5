package csi

import (
	"strings"
	"testing"
)

// A node where /run is a tmpfs and the plugin container sees the host's
// /run/gpumem through a hostPath (its own mount), and /var/lib/kubelet sits
// on ext4.
const nodeMountInfo = `22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
25 22 0:23 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,mode=755
30 22 253:1 /var/lib/kubelet /var/lib/kubelet rw,relatime shared:1 - ext4 /dev/vda1 rw
31 25 0:23 /gpumem /run/gpumem rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,mode=755
40 30 0:23 /gpumem /var/lib/kubelet/pods/a/volumes/kubernetes.io~csi/gpumem/mount ro,nosuid,nodev,noexec shared:5 - tmpfs tmpfs rw,mode=755
41 30 0:23 /gpumem /var/lib/kubelet/pods/b/volumes/kubernetes.io~csi/gpumem/mount rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,mode=755
42 30 253:1 /srv/other /var/lib/kubelet/pods/c/volumes/kubernetes.io~csi/gpumem/mount ro,relatime shared:1 - ext4 /dev/vda1 rw
43 30 0:23 /gpumem /var/lib/kubelet/pods/d/volumes/kubernetes.io~csi/gpumem/mount ro,nosuid,nodev,noexec shared:5 - tmpfs tmpfs rw,mode=755
44 43 253:1 /srv/other /var/lib/kubelet/pods/d/volumes/kubernetes.io~csi/gpumem/mount rw,relatime shared:1 - ext4 /dev/vda1 rw
45 30 0:23 /gpumem /var/lib/kubelet/pods/with\040space/mount ro master:7 - tmpfs tmpfs rw
`

func TestParseMountInfo(t *testing.T) {
	entries, err := parseMountInfo(strings.NewReader(nodeMountInfo))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 10 {
		t.Fatalf("parsed %d entries, want 10", len(entries))
	}
	want := mountEntry{device: "0:23", root: "/gpumem", mountPoint: "/var/lib/kubelet/pods/with space/mount", readOnly: true}
	if got := entries[9]; got != want {
		t.Fatalf("last entry = %+v, want %+v (octal escape undone, ro seen)", got, want)
	}
	if entries[0].readOnly {
		t.Fatalf("first entry is rw, parsed as read-only")
	}
}

func TestParseMountInfoRejectsShortLines(t *testing.T) {
	_, err := parseMountInfo(strings.NewReader("22 1 253:1 / /\n"))
	if err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("got %v, want an error naming line 1", err)
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:               "/plain",
		`/a\040b`:              "/a b",
		`/tab\011nl\012bs\134`: "/tab\tnl\nbs\\",
		`/not\08octal`:         `/not\08octal`,
		`/short\04`:            `/short\04`,
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckMounts(t *testing.T) {
	entries, err := parseMountInfo(strings.NewReader(nodeMountInfo))
	if err != nil {
		t.Fatal(err)
	}
	const pods = "/var/lib/kubelet/pods/"
	tests := []struct {
		name, target, source string
		want                 MountState
	}{
		{"published read-only", pods + "a/volumes/kubernetes.io~csi/gpumem/mount", "/run/gpumem", MountState{Mounted: true, OfSource: true, ReadOnly: true}},
		{"publish dir seen through its parent mount", pods + "a/volumes/kubernetes.io~csi/gpumem/mount", "/run/gpumem/", MountState{Mounted: true, OfSource: true, ReadOnly: true}},
		{"writable bind of the source", pods + "b/volumes/kubernetes.io~csi/gpumem/mount", "/run/gpumem", MountState{Mounted: true, OfSource: true}},
		{"another directory mounted", pods + "c/volumes/kubernetes.io~csi/gpumem/mount", "/run/gpumem", MountState{Mounted: true, ReadOnly: true}},
		{"topmost of stacked mounts wins", pods + "d/volumes/kubernetes.io~csi/gpumem/mount", "/run/gpumem", MountState{Mounted: true}},
		{"not a mount point", pods + "e/volumes/kubernetes.io~csi/gpumem/mount", "/run/gpumem", MountState{}},
		{"parent of a mount point is not mounted", pods + "a/volumes/kubernetes.io~csi/gpumem", "/run/gpumem", MountState{}},
		{"escaped mount point", pods + "with space/mount", "/run/gpumem", MountState{Mounted: true, OfSource: true, ReadOnly: true}},
		{"source on another filesystem", pods + "a/volumes/kubernetes.io~csi/gpumem/mount", "/srv/other", MountState{Mounted: true, ReadOnly: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			source := strings.TrimSuffix(tt.source, "/")
			if got := checkMounts(entries, tt.target, source); got != tt.want {
				t.Fatalf("checkMounts(%s, %s) = %+v, want %+v", tt.target, tt.source, got, tt.want)
			}
		})
	}
}

// Without a mount of its own, the publish directory is a subdirectory of
// the filesystem mounted above it (a plain directory under /run).
func TestCheckMountsSourceWithoutOwnMount(t *testing.T) {
	table := `25 22 0:23 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw
40 30 0:23 /gpumem /pods/a/mount ro,nosuid,nodev,noexec shared:5 - tmpfs tmpfs rw
`
	entries, err := parseMountInfo(strings.NewReader(table))
	if err != nil {
		t.Fatal(err)
	}
	if got := checkMounts(entries, "/pods/a/mount", "/run/gpumem"); !got.OfSource {
		t.Fatalf("checkMounts = %+v, want OfSource (0:23 /gpumem on both sides)", got)
	}
	if got := checkMounts(entries, "/pods/a/mount", "/run/other"); got.OfSource {
		t.Fatalf("checkMounts = %+v for /run/other, want not OfSource", got)
	}
}
