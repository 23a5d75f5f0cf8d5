package allocstats

import "github.com/gpumem/gpumem_exporter/allocstats/wire"

// The protocol's values that other packages hand to a Session (a simulated
// node's reports, tests), as package wire decodes them.
type (
	Hello        = wire.Hello
	DeviceReport = wire.DeviceReport
	OOMMessage   = wire.OOMMessage
	Optional     = wire.Optional
)

// Some is wire.Some: an Optional that is set.
func Some(v uint64) Optional { return wire.Some(v) }
