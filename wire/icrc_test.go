package wire

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestSmallUpdate checks the slicing-by-16 CRC of the masked headers against hash/crc32 for every
// length up to 200 bytes, from several starting CRCs: each length takes a different mix of its
// 16-byte, 8-byte and single-byte rounds.
func TestSmallUpdate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 200)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for _, seed := range []uint32{0, lrhCRC, 0xFFFFFFFF, rng.Uint32()} {
		for n := range len(buf) + 1 {
			if got, want := smallUpdate(seed, buf[:n]), crc32.Update(seed, crc32.IEEETable, buf[:n]); got != want {
				t.Fatalf("seed %#x, %d bytes: %#x, want %#x", seed, n, got, want)
			}
		}
	}
}
