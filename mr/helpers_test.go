package mr

import (
	"encoding/binary"
	"testing"
	"unsafe"
)

// guardLen is the number of guard bytes on each side of a region registered by guardedBuf.
const guardLen = 64

func guardByte(i int) byte { return byte(0xA5 ^ i*7) }

// guardedBuf returns n bytes inside a larger buffer, starting skew bytes past an 8-byte boundary, with
// guard bytes on each side that the test's cleanup asserts were never changed.
func guardedBuf(t testing.TB, n, skew int) []byte {
	t.Helper()
	all := make([]byte, 2*guardLen+n+8)
	start := guardLen + skew
	for i := range all {
		all[i] = guardByte(i)
	}
	mem := all[start : start+n : start+n]
	clear(mem)
	t.Cleanup(func() { checkGuards(t, all, start, n) })
	return mem
}

func checkGuards(t testing.TB, all []byte, start, n int) {
	t.Helper()
	for i := range all {
		if i >= start && i < start+n {
			continue
		}
		if all[i] != guardByte(i) {
			t.Fatalf("guard byte %d (region at %d, %d bytes) changed to %#x", i, start, n, all[i])
		}
	}
}

func mustRegister(t testing.TB, tb *Table, pd *PD, buf []byte, access Access, opts ...Option) *Region {
	t.Helper()
	r, err := tb.Register(pd, buf, access, opts...)
	if err != nil {
		t.Fatalf("Register(%v): %v", access, err)
	}
	return r
}

// allRemote is every right a region can grant a peer, with the LocalWrite they require.
const allRemote = LocalWrite | RemoteWrite | RemoteRead | RemoteAtomic

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

func putNative(b []byte, v uint64) { binary.NativeEndian.PutUint64(b, v) }
