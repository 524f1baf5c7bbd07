//go:build amd64 && !purego

package wire

import "golang.org/x/sys/cpu"

var (
	// fold512 reports that foldCRC's 512-bit body can run: AVX-512 (F, and VL for its 128-bit
	// VPTERNLOGD) with its carry-less multiply, enabled by the OS (x/sys/cpu checks XCR0).
	fold512 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ
	// fold256 reports that foldCRC's 256-bit body can run: AVX2 (which x/sys/cpu reports only where
	// the OS saves the 256-bit registers) and the VEX-encoded VPCLMULQDQ, CPUID leaf 7's ECX bit 10.
	// x/sys/cpu reports that bit only with AVX-512; AMD's Zen 3 has it without.
	fold256 = cpu.X86.HasAVX2 && cpu.X86.HasPCLMULQDQ && cpuid7ECX()&(1<<10) != 0

	// haveFold reports that foldCRC can run.
	haveFold = fold512 || fold256
	// wide makes foldCRC take its 512-bit body, where both run; the tests turn it off to check the
	// 256-bit one as well. crc_amd64.s reads it.
	wide = fold512
)

// foldCRC returns the CRC register (not inverted) over head and then p, starting from zero. len(head)
// is a non-zero multiple of 16, len(p) a multiple of 16. haveFold must hold; wide picks the 512-bit
// body.
//
//go:noescape
func foldCRC(head, p []byte) uint32

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
