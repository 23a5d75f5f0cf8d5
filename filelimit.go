package main

import (
	"github.com/go-kit/log"

	"github.com/gpumem/gpumem_exporter/internal/fdbudget"
	"github.com/gpumem/gpumem_exporter/workload"
)

// fitFileLimit fits the connection caps under the open file limit
// (internal/fdbudget) and gives the resolver what they leave.
func fitFileLimit(o *options, logger log.Logger) error {
	listeners := 1
	if o.webConfig != nil && o.webConfig.WebListenAddresses != nil {
		listeners = max(1, len(*o.webConfig.WebListenAddresses))
	}
	c := fdbudget.Caps{
		SocketConnections: o.maxConnections, SocketConnectionsPerUID: o.maxConnectionsPerUID,
		WebConnections: o.webMaxConnections, WebListeners: listeners, MaxPidfds: workload.MaxPidfds,
	}
	if o.healthAddress != "" {
		c.HealthConnections = fdbudget.HealthMaxConnections
	}
	c, err := fdbudget.Fit(c, logger)
	if err != nil {
		return err
	}
	o.maxConnections, o.maxConnectionsPerUID, o.pidfds = c.SocketConnections, c.SocketConnectionsPerUID, c.Pidfds
	return nil
}
