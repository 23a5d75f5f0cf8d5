package csi

// Mounter is what the node service needs from the kernel's mount table. The
// real one (NewMounter) calls mount(2) and reads /proc/self/mountinfo; tests
// without mount privileges use a fake that keeps the table in memory.
type Mounter interface {
	// BindReadOnly bind-mounts the directory source at the existing
	// directory target, then makes that bind read-only, nosuid, nodev and
	// noexec. When it fails, nothing it mounted is left behind.
	BindReadOnly(source, target string) error
	// Unmount removes the topmost mount at target.
	Unmount(target string) error
	// Check reports what is mounted at target, comparing it with source.
	// A target that does not exist is not mounted.
	Check(target, source string) (MountState, error)
}

// MountState is what Check finds at a target path (the topmost mount when
// several are stacked there).
type MountState struct {
	// Mounted: target is a mount point.
	Mounted bool
	// OfSource: the mount shows the same directory as source (same
	// filesystem and same directory within it).
	OfSource bool
	// ReadOnly: the mount carries the ro flag.
	ReadOnly bool
}
