package mr

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Atomics run on the real memory with sync/atomic when its address is 8-byte aligned, and otherwise
// under one of a fixed set of locks chosen by the address (a region with a chosen IOVA can map an
// aligned VA to an unaligned address). The path depends only on the address, so every goroce atomic on
// the same 8 bytes, from any table, QP or goroutine, takes the same path and they are atomic with
// respect to each other. They are not atomic with respect to plain copies (WriteRemote, Scatter, the
// owner's own stores) nor to atomics on overlapping but different addresses; IBTA asks no more
// (IBV_ATOMIC_HCA).

// stripeCount is the number of locks of the unaligned path, a power of two.
const stripeCount = 64

var stripes [stripeCount]struct {
	sync.Mutex
	_ [64 - unsafe.Sizeof(sync.Mutex{})]byte // one lock per cache line
}

func stripe(p *byte) *sync.Mutex {
	a := uintptr(unsafe.Pointer(p))
	return &stripes[(a^a>>12)&(stripeCount-1)].Mutex
}

// word returns b's first 8 bytes as a *uint64 if they are 8-byte aligned. Callers pass len(b) == 8.
func word(b []byte) (*uint64, bool) {
	p := unsafe.Pointer(&b[0])
	if uintptr(p)%atomicSize != 0 {
		return nil, false
	}
	return (*uint64)(p), true
}

// compareSwap runs compare-and-swap on b[:8] in host byte order and returns the old value.
func compareSwap(b []byte, compare, swap uint64) uint64 {
	if w, ok := word(b); ok {
		for {
			old := atomic.LoadUint64(w)
			if old != compare || atomic.CompareAndSwapUint64(w, old, swap) {
				return old
			}
		}
	}
	mu := stripe(&b[0])
	mu.Lock()
	old := binary.NativeEndian.Uint64(b)
	if old == compare {
		binary.NativeEndian.PutUint64(b, swap)
	}
	mu.Unlock()
	return old
}

// fetchAdd adds add to b[:8] in host byte order and returns the old value.
func fetchAdd(b []byte, add uint64) uint64 {
	if w, ok := word(b); ok {
		return atomic.AddUint64(w, add) - add
	}
	mu := stripe(&b[0])
	mu.Lock()
	old := binary.NativeEndian.Uint64(b)
	binary.NativeEndian.PutUint64(b, old+add)
	mu.Unlock()
	return old
}
