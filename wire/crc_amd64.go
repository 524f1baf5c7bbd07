//go:build amd64 && !purego

package wire

import "golang.org/x/sys/cpu"

// haveFold4 reports that fold4 can run: AVX-512 (F, and VL for its 128-bit VPTERNLOGD) with its
// carry-less multiply, enabled by the OS (x/sys/cpu checks XCR0).
var haveFold4 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ

// fold4Min is the shortest payload fold4 pays for (BenchmarkUpdateIEEE).
const fold4Min = 512

// fold4 folds p, whose length is a non-zero multiple of fold4Block, into the 16 bytes of rest, the
// CRC register state merged into p's first four bytes: the CRC register over rest from zero is then
// the register over p from state.
//
//go:noescape
func fold4(state uint32, p []byte, rest *[16]byte)
