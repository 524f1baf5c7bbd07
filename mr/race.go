//go:build race

package mr

import (
	"runtime"
	"sync"
	"unsafe"
)

// Under the race detector, the device's copies into and out of a region, and its atomics on it, are
// serialized region by region. Two QPs on different shards of a device may write one region at
// once, as two NICs' DMA may; without the race detector that needs no lock (the bytes are plain
// data, and RDMA leaves the result of overlapping writes undefined), but the detector would report
// it as a race inside goroce instead of letting a program's own races show. The program's accesses
// to Bytes are still checked against the device's: read a peer's writes after a completion says so.
type raceGuard struct{ mu sync.Mutex }

func (g *raceGuard) lock()   { g.mu.Lock() }
func (g *raceGuard) unlock() { g.mu.Unlock() }

// read tells the detector that the device reads b now: a payload it sends by reference (GatherRefs,
// ReadRemoteRef) is read later by code it does not see, the ICRC's assembly and the kernel.
func (g *raceGuard) read(b []byte) {
	g.mu.Lock()
	runtime.RaceReadRange(unsafe.Pointer(unsafe.SliceData(b)), len(b))
	g.mu.Unlock()
}
