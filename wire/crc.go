package wire

import (
	"encoding/binary"
	"hash/crc32"
)

// The ICRC's CRC-32 by carry-less multiplication, where the CPU has it (foldCRC, crc_amd64.s).
//
// hash/crc32's AVX-512 loop folds one 512-bit register, a dependency chain of a carry-less multiply
// and a three-way XOR for every 64 bytes: 33-37 GB/s for 4 KiB on the project's AVX-512 machines.
// foldCRC folds four such registers 256 bytes apart, which keeps the multiplier busy. Without AVX-512
// hash/crc32 folds four 128-bit registers, about 8.5 GB/s on the project's AMD EPYC machines (Zen 3:
// AVX2 and the 256-bit VPCLMULQDQ, no AVX-512); there foldCRC folds four 256-bit registers 128 bytes
// apart, 1.7 times as fast for 4 KiB (BenchmarkUpdateIEEE, BenchmarkICRC). And it takes a packet's
// masked headers, the first 48 bytes or more of the ICRC's input, as 16-byte blocks in registers:
// through slicing tables they cost as much as the 4 KiB fold itself once the copies of the payload
// have pushed the tables out of the cache (perf, a one-QP WRITE stream). Intel, "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ Instruction" (2009): folding, and Barrett's
// reduction at the end.
//
// foldCRC starts from a zero register and takes whole 16-byte blocks. Two facts fit any input to
// that. Zero bytes leave a zero register at zero, so a head may start with zeros that round it up to
// whole blocks. And for this reflected CRC, a register r before bytes b gives what a zero register
// gives before b with r XORed into b's first four bytes, so the starting register goes into the
// head's first bytes of input.

// foldICRCMin is the shortest rest (the packet after its BTH) ComputeICRC gives foldCRC: below it
// the slicing tables are faster while they are in the cache, as in a ping-pong (BenchmarkICRC).
const foldICRCMin = 32

// updateIEEE is crc32.Update(crc, crc32.IEEETable, p), by foldCRC where the CPU has it and p is long
// enough to pay for the head it needs.
func updateIEEE(crc uint32, p []byte) uint32 {
	if !haveFold || len(p) < 64 {
		return crc32.Update(crc, crc32.IEEETable, p)
	}
	// The head is p's bytes beyond whole blocks, at least four of them to take the register.
	k := len(p) % 16
	if k < 4 {
		k += 16
	}
	var buf [32]byte
	head := buf[:16*((k+15)/16)]
	at := len(head) - k
	copy(head[at:], p[:k])
	binary.LittleEndian.PutUint32(head[at:], binary.LittleEndian.Uint32(head[at:])^^crc)
	return ^foldCRC(head, p[k:])
}

// maxFoldExt bounds the extension headers foldedICRC takes with the masked headers: RETH and
// immediate data are 20 bytes, an atomic request's 28.
const maxFoldExt = 32

// foldHeadMax bounds the head foldedICRC builds: zeros, the LRH's 8 bytes, the masked headers, the
// extension headers and the bytes of the rest beyond whole blocks.
const foldHeadMax = 15 + 8 + maxMaskedLen + maxFoldExt + 15

// foldedICRC returns the ICRC, by foldCRC, over the LRH's eight masked bytes, the masked headers pre,
// ext (at most maxFoldExt bytes) and rest.
func foldedICRC(pre, ext, rest []byte) uint32 {
	var buf [foldHeadMax]byte
	k := len(rest) % 16
	n := 8 + len(pre) + len(ext) + k
	head := buf[:16*((n+15)/16)]
	lrh := head[len(head)-n:]
	// The LRH's eight bytes of all ones, the first four XORed with the CRC's starting register, also
	// all ones.
	binary.LittleEndian.PutUint32(lrh[4:], 0xFFFFFFFF)
	m := 8 + copy(lrh[8:], pre)
	m += copy(lrh[m:], ext)
	copy(lrh[m:], rest[:k])
	return ^foldCRC(head, rest[k:])
}
