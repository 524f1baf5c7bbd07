package wire

import "encoding/binary"

// The ICRC's CRC-32 by carry-less multiplication, where the CPU has it (foldCRC, crc_amd64.s).
//
// hash/crc32's AVX-512 loop folds one 512-bit register, a dependency chain of a carry-less multiply
// and a three-way XOR for every 64 bytes: 33-37 GB/s for 4 KiB on this project's machines. foldCRC
// folds four registers 256 bytes apart, which keeps the multiplier busy. And it takes a packet's
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

// foldHeadMax bounds the head foldedICRC builds: zeros, the LRH's 8 bytes, the masked headers and
// the bytes of the rest beyond whole blocks.
const foldHeadMax = 15 + 8 + maxMaskedLen + 15

// foldedICRC is ComputeICRC by foldCRC: the ICRC over the LRH's eight masked bytes, the masked
// headers pre and rest, the packet after its BTH.
func foldedICRC(pre, rest []byte) uint32 {
	var buf [foldHeadMax]byte
	k := len(rest) % 16
	n := 8 + len(pre) + k
	head := buf[:16*((n+15)/16)]
	lrh := head[len(head)-n:]
	// The LRH's eight bytes of all ones, the first four XORed with the CRC's starting register, also
	// all ones.
	binary.LittleEndian.PutUint32(lrh[4:], 0xFFFFFFFF)
	copy(lrh[8:], pre)
	copy(lrh[8+len(pre):], rest[:k])
	return ^foldCRC(head, rest[k:])
}
