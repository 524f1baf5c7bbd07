package wire

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

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
}
