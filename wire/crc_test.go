package wire

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestUpdateIEEE checks updateIEEE against hash/crc32 at every length to 4 KiB and beyond, from every
// alignment modulo 64 and several starting values: the four-lane fold, the reduction of its lanes, and
// the hand-over of what it leaves to hash/crc32.
func TestUpdateIEEE(t *testing.T) {
	if !haveFold4 {
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

// BenchmarkUpdateIEEE compares updateIEEE with hash/crc32's Update on payloads around the sizes a
// RoCE packet carries; the crossover sets fold4Min.
func BenchmarkUpdateIEEE(b *testing.B) {
	for _, n := range []int{256, 512, 1024, 4096} {
		p := make([]byte, n)
		b.Run(fmt.Sprintf("wire/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				updateIEEE(0, p)
			}
		})
		b.Run(fmt.Sprintf("crc32/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Update(0, crc32.IEEETable, p)
			}
		})
	}
}
