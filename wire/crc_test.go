package wire

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// updateIEEE is crc32.Update(crc, crc32.IEEETable, p) by foldCRC, which the tests below check
// against hash/crc32 from any starting register and at any length.
func updateIEEE(crc uint32, p []byte) uint32 {
	if !haveFold || len(p) < 16 {
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

// TestUpdateIEEE checks updateIEEE against hash/crc32 at every length to 4 KiB and beyond, from every
// alignment modulo 64 and several starting values: foldCRC's head, its four lanes and their
// reduction, the blocks after them, and Barrett's reduction at the end.
func TestUpdateIEEE(t *testing.T) {
	if !haveFold {
		t.Log("no AVX-512 carry-less multiply here: updateIEEE is hash/crc32's")
	}
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 9000+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for _, crc := range []uint32{0, 0xFFFFFFFF, r.Uint32()} {
		for n := 0; n <= 9000; n++ {
			off := n % 64
			if n > 4200 && n%97 != 0 {
				continue
			}
			p := buf[off : off+n]
			if got, want := updateIEEE(crc, p), crc32.Update(crc, crc32.IEEETable, p); got != want {
				t.Fatalf("updateIEEE(%#x, %d bytes at offset %d) = %#x, want %#x", crc, n, off, got, want)
			}
		}
	}
}

// FuzzUpdateIEEE compares updateIEEE with hash/crc32 on arbitrary input.
func FuzzUpdateIEEE(f *testing.F) {
	f.Add(uint32(0), make([]byte, 4096))
	f.Add(uint32(0x12345678), make([]byte, 1000))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		if got, want := updateIEEE(crc, p), crc32.Update(crc, crc32.IEEETable, p); got != want {
			t.Fatalf("updateIEEE(%#x, %d bytes) = %#x, want %#x", crc, len(p), got, want)
		}
	})
}

// TestFoldedICRC checks foldedICRC against hash/crc32 over the same input, for the masked headers
// of IPv4 with and without options and of IPv6, and every length of the rest to 1 KiB, then every
// 61st to 9000 bytes: each puts a different count of bytes into the head.
func TestFoldedICRC(t *testing.T) {
	if !haveFold {
		t.Skip("no AVX-512 carry-less multiply here")
	}
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, maxMaskedLen+9000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for _, plen := range []int{20 + 8 + BTHLen, 24 + 8 + BTHLen, maxMaskedLen, 40 + 8 + BTHLen} {
		pre := buf[:plen]
		for n := 0; n <= 9000; n++ {
			if n > 1024 && n%61 != 0 {
				continue
			}
			rest := buf[plen : plen+n]
			want := crc32.Update(crc32.Update(lrhCRC, crc32.IEEETable, pre), crc32.IEEETable, rest)
			if got := foldedICRC(pre, rest); got != want {
				t.Fatalf("%d bytes of headers, %d after: %#x, want %#x", plen, n, got, want)
			}
		}
	}
}
