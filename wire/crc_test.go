package wire

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// foldVariant is one way of computing the CRC (foldVariants): use makes the package's functions
// compute that way and returns what restores the default.
type foldVariant struct {
	name string
	use  func() (restore func())
}

// eachFold runs f once for each way this CPU computes the CRC, as a subtest.
func eachFold(t *testing.T, f func(t *testing.T)) {
	for _, v := range foldVariants() {
		t.Run(v.name, func(t *testing.T) {
			defer v.use()()
			f(t)
		})
	}
}

// TestUpdateIEEE checks updateIEEE against hash/crc32 at every length to 4 KiB and beyond, from every
// alignment modulo 64 and several starting values, with each body of foldCRC the CPU runs: its head,
// its four lanes and their reduction, the blocks after them, and Barrett's reduction at the end.
func TestUpdateIEEE(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 9000+64)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	eachFold(t, func(t *testing.T) {
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
	})
}

// FuzzUpdateIEEE compares updateIEEE, each way this CPU computes it, with hash/crc32 on arbitrary
// input.
func FuzzUpdateIEEE(f *testing.F) {
	f.Add(uint32(0), make([]byte, 4096))
	f.Add(uint32(0x12345678), make([]byte, 1000))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		want := crc32.Update(crc, crc32.IEEETable, p)
		for _, v := range foldVariants() {
			restore := v.use()
			got := updateIEEE(crc, p)
			restore()
			if got != want {
				t.Fatalf("%s: updateIEEE(%#x, %d bytes) = %#x, want %#x", v.name, crc, len(p), got, want)
			}
		}
	})
}

// TestFoldedICRC checks foldedICRC against hash/crc32 over the same input, for the masked headers
// of IPv4 with and without options and of IPv6, and every length of the rest to 1 KiB, then every
// 61st to 9000 bytes: each puts a different count of bytes into the head.
func TestFoldedICRC(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, maxMaskedLen+9000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	eachFold(t, func(t *testing.T) {
		if !haveFold {
			t.Skip("foldedICRC needs foldCRC")
		}
		testFoldedICRC(t, buf)
	})
}

func testFoldedICRC(t *testing.T, buf []byte) {
	for _, plen := range []int{20 + 8 + BTHLen, 24 + 8 + BTHLen, maxMaskedLen, 40 + 8 + BTHLen} {
		pre := buf[:plen]
		for n := 0; n <= 9000; n++ {
			if n > 1024 && n%61 != 0 {
				continue
			}
			rest := buf[plen : plen+n]
			want := crc32.Update(crc32.Update(lrhCRC, crc32.IEEETable, pre), crc32.IEEETable, rest)
			if got := foldedICRC(pre, nil, rest); got != want {
				t.Fatalf("%d bytes of headers, %d after: %#x, want %#x", plen, n, got, want)
			}
		}
	}
}

// TestSetICRCPieces checks that a packet sealed in parts gets the ICRC SetICRC gives it whole: for
// headers with and without extensions, payloads of every length around the fold's thresholds and
// past a full MTU, cut into one, two or three pieces, and pads of 0 to 3 bytes.
func TestSetICRCPieces(t *testing.T) {
	eachFold(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		ip := make([]byte, 20)
		ip[0] = 0x45
		udp := make([]byte, UDPHeaderLen)
		for _, ext := range []int{0, 4, 16, 20, 28, 40} {
			for _, n := range []int{1, 15, 16, 31, 32, 33, 63, 64, 100, 255, 256, 511, 512, 513, 1000, 1024, 4093, 4096, 4112} {
				for _, cuts := range [][]int{nil, {n / 2}, {n / 3, 2 * n / 3}, {1}} {
					if len(cuts) > 0 && cuts[0] == 0 {
						continue
					}
					pad := (4 - n%4) % 4
					pkt := make([]byte, BTHLen+ext+n+pad+ICRCLen)
					for i := range BTHLen + ext + n {
						pkt[i] = byte(r.Uint32())
					}
					head, payload := pkt[:BTHLen+ext], pkt[BTHLen+ext:BTHLen+ext+n]
					var pieces [][]byte
					at := 0
					for _, c := range append(cuts, n) {
						pieces = append(pieces, payload[at:c])
						at = c
					}
					// The pieces are copies: SetICRCPieces must read them, not the packet's bytes.
					for i := range pieces {
						pieces[i] = append([]byte(nil), pieces[i]...)
					}
					if err := SetICRC(ip, udp, pkt); err != nil {
						t.Fatal(err)
					}
					want := binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:])
					clear(payload)
					tail := pkt[BTHLen+ext+n:]
					if err := SetICRCPieces(ip, udp, head, pieces, tail); err != nil {
						t.Fatal(err)
					}
					if got := binary.LittleEndian.Uint32(tail[pad:]); got != want {
						t.Fatalf("ext %d, payload %d in %d pieces: ICRC %#x, want %#x", ext, n, len(pieces), got, want)
					}
				}
			}
		}
	})
}

// TestFoldConstants derives the folding constants crc_amd64.s holds: for a fold across D bits, x^(D+32)
// and x^(D-32) modulo the CRC-32 polynomial, bit-reflected and shifted left by one (Intel's paper,
// section 3, for the reflected CRC).
func TestFoldConstants(t *testing.T) {
	xnmod := func(n int) uint32 { // x^n mod P, P = 0x104C11DB7 in normal form
		r := uint64(1)
		for range n {
			r <<= 1
			if r&(1<<32) != 0 {
				r ^= 0x104C11DB7
			}
		}
		return uint32(r)
	}
	k := func(n int) uint64 { return uint64(bits.Reverse32(xnmod(n))) << 1 }
	for _, c := range []struct {
		d      int
		hi, lo uint64 // as crc_amd64.s has them: the first quadword, then the second
	}{
		{128, 0x1751997d0, 0x0ccaa009e},
		{256, 0x0f1da05aa, 0x15a546366},
		{512, 0x154442bd4, 0x1c6e41596},
		{1024, 0x1e88ef372, 0x14a7fe880},
		{2048, 0x11542778a, 0x1322d1430},
	} {
		if got0, got1 := k(c.d+32), k(c.d-32); got0 != c.hi || got1 != c.lo {
			t.Errorf("D=%d: %#x %#x, crc_amd64.s has %#x %#x", c.d, got0, got1, c.hi, c.lo)
		}
	}
	if got := k(64); got != 0x163cd6124 {
		t.Errorf("x^64 mod P: %#x, crc_amd64.s has 0x163cd6124", got)
	}
}
