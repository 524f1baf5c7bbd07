//go:build amd64 && !purego

package wire

import "golang.org/x/sys/cpu"

var (
	// fold512 reports that foldCRC512 can run: AVX-512 (F, and VL for its 128-bit VPTERNLOGD) with
	// its carry-less multiply, enabled by the OS (x/sys/cpu checks XCR0).
	fold512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ
	// fold256 reports that foldCRC256 can run: AVX2 (which x/sys/cpu reports only where the OS saves
	// the 256-bit registers) and the VEX-encoded VPCLMULQDQ, CPUID leaf 7's ECX bit 10. x/sys/cpu
	// reports that bit only with AVX-512; AMD's Zen 3 has it without.
	fold256 = cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ && cpuid7ECX()&(1<<10) != 0

	// haveFold reports that foldCRC can run.
	haveFold = fold512 || fold256
	// wide picks foldCRC512 where both run; the tests turn it off to check foldCRC256 as well.
	wide = fold512
)

// foldCRC returns the CRC register (not inverted) over head and then p, starting from zero. len(head)
// is a non-zero multiple of 16, len(p) a multiple of 16. haveFold must hold.
func foldCRC(head, p []byte) uint32 {
	if wide {
		return foldCRC512(head, p)
	}
	return foldCRC256(head, p)
}

// foldCRC512 is foldCRC with 512-bit registers: p takes four of them 256 bytes apart when it has 512
// bytes or more; the head and the rest go one 16-byte block at a time.
//
//go:noescape
func foldCRC512(head, p []byte) uint32

// foldCRC256 is foldCRC with 256-bit registers, four of them 128 bytes apart when p has 256 bytes or
// more.
//
//go:noescape
func foldCRC256(head, p []byte) uint32

func cpuid7ECX() uint32

// ICRCMethod names how this process computes the ICRC's CRC-32: "AVX-512 fold" or "AVX2 fold"
// (carry-less multiplication in 512- or 256-bit registers, crc_amd64.s) where the CPU has it, else
// "hash/crc32". Benchmarks say which, since the ICRC's cost per byte differs between them.
func ICRCMethod() string {
	switch {
	case !haveFold:
		return "hash/crc32"
	case wide:
		return "AVX-512 fold"
	}
	return "AVX2 fold"
}
