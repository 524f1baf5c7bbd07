//go:build race

package perftest

// raceEnabled says the race detector is on. write_lat polls memory the device writes, as perftest
// polls memory the NIC writes; no Go synchronization orders the two, so the detector reports it.
const raceEnabled = true
