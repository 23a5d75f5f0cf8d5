package allocstats

// Device UUIDs of the tests, in NVML's spelling and in the others a client
// may send.
const (
	testUUID     = "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	testUUIDBare = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	testUUIDHex  = "0A1B2C3D4E5F6789ABCDEF0123456789"
	testUUID2    = "GPU-11111111-2222-3333-4444-555555555555"
	unknownUUID  = "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"
)
