package allocstats

import "github.com/gpumem/gpumem_exporter/allocstats/wire"

// The protocol's messages as package wire decodes them.
type (
	Message      = wire.Message
	Hello        = wire.Hello
	DeviceReport = wire.DeviceReport
	OOMMessage   = wire.OOMMessage
	Optional     = wire.Optional
	DecodeError  = wire.DecodeError
)

// Message types and results, as in wire.
const (
	ProtocolVersion = wire.ProtocolVersion

	TypeHello   = wire.TypeHello
	TypeStats   = wire.TypeStats
	TypeOOM     = wire.TypeOOM
	TypeUnknown = wire.TypeUnknown

	ResultOK        = wire.ResultOK
	ResultMalformed = wire.ResultMalformed
	ResultRejected  = wire.ResultRejected
	ResultOversize  = wire.ResultOversize
)

// DecodeLine is wire.DecodeLine.
func DecodeLine(line []byte, maxDevices int) (Message, error) {
	return wire.DecodeLine(line, maxDevices)
}

// Some is wire.Some: an Optional that is set.
func Some(v uint64) Optional { return wire.Some(v) }

// Sanitize is wire.Sanitize.
func Sanitize(s string) string { return wire.Sanitize(s) }
