package main

import (
	"fmt"
	"os"

	"github.com/go-kit/log"
	"github.com/prometheus/common/version"

	"github.com/gpumem/gpumem_exporter/allocstats"
)

// socketServer is the allocator stats server of the flags, reporting to
// store and checking reported devices with knownDevice, listening.
func socketServer(o *options, store *allocstats.Store, knownDevice func(string) (string, uint64, bool), logger log.Logger) (*allocstats.Server, error) {
	srv, err := allocstats.NewServer(allocstats.Config{
		SocketPath:      o.socket,
		SocketExplicit:  o.socketExplicit,
		SocketMode:      os.FileMode(o.socketMode),
		MaxMessageBytes: o.maxMessageBytes,
		MaxConnections:  o.maxConnections,
		MaxDevices:      o.maxDevices,
		IdleTimeout:     o.idleTimeout,
		Interval:        o.pollInterval,
		ServerVersion:   version.Version,
		OOMVerdict:      true,                 // the OOM reports answer through OOMEvent.ReplyTo (oom.VerdictReply)
		WarnBefore:      max(o.warnBefore, 0), // the flag's 0: no warnings
		KnownDevice:     knownDevice,
		ProcPath:        o.procPath,

		MaxConnectionsPerUID: o.maxConnectionsPerUID,
		MaxBufferedBytes:     o.maxBufferedBytes,
	}, store, logger)
	if err != nil {
		return nil, err
	}
	if err := srv.Listen(); err != nil {
		if o.socketExplicit {
			return nil, fmt.Errorf("--allocstats.socket=%s: %w; make that directory (writable by this user), or leave the flag out for the default", o.socket, err)
		}
		return nil, fmt.Errorf("%w; give --allocstats.socket a path in a directory this user can write", err)
	}
	return srv, nil
}
