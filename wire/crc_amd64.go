//go:build amd64 && !purego

package wire

import "golang.org/x/sys/cpu"

// haveFold reports that foldCRC can run: AVX-512 (F, and VL for its 128-bit VPTERNLOGD) with its
// carry-less multiply, enabled by the OS (x/sys/cpu checks XCR0).
var haveFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ

// foldCRC returns the CRC register (not inverted) over head and then p, starting from zero. len(head)
// is a non-zero multiple of 16, len(p) a multiple of 16. p takes four 512-bit registers 256 bytes apart
// when it has 512 bytes or more; the head and the rest go one 16-byte block at a time.
//
//go:noescape
func foldCRC(head, p []byte) uint32
