package wire

// Where the socket is found: the daemon creates it at
// DefaultSocketDir/SocketName unless told otherwise, the clients look
// there first (docs/protocol.md), and gpumem-csi's publish directory,
// which pods mount at DefaultSocketDir, holds a SocketName of its own that
// leads to the daemon's socket.
const (
	DefaultSocketDir = "/run/gpumem"
	SocketName       = "allocstats.sock"
)
