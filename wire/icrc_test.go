package wire

import (
	"encoding/binary"
	"fmt"
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

// TestICRCSeed finishes the ICRC of every captured packet (rxe's and goroce's, IPv4 and IPv6) from
// the seed of its headers, and of synthetic packets of every transport length up to 200 bytes (each
// takes a different mix of the CRC's rounds, and those of 64 bytes and more hash/crc32's path): the
// result must be ComputeICRC's, and for a capture the ICRC on the wire.
func TestICRCSeed(t *testing.T) {
	check := func(name string, ip, udp, pkt []byte, onWire bool) {
		t.Helper()
		seed, err := NewICRCSeed(ip, udp)
		if err != nil {
			t.Fatalf("%s: NewICRCSeed: %v", name, err)
		}
		n := len(pkt) - ICRCLen
		got, err := seed.ICRC(pkt[:n])
		if err != nil {
			t.Fatalf("%s: ICRC: %v", name, err)
		}
		want, err := ComputeICRC(ip, udp, pkt[:n])
		if err != nil {
			t.Fatalf("%s: ComputeICRC: %v", name, err)
		}
		if got != want {
			t.Fatalf("%s: ICRC from the seed %#08x, ComputeICRC %#08x", name, got, want)
		}
		if wire := binary.LittleEndian.Uint32(pkt[n:]); onWire && got != wire {
			t.Fatalf("%s: ICRC from the seed %#08x, on the wire %#08x", name, got, wire)
		}
	}
	frames := goldenFrames(t)
	if len(frames) == 0 {
		t.Fatal("no captures")
	}
	for _, c := range frames {
		ihl := ipv6HeaderLen
		if c.ip[0]>>4 == 4 {
			ihl = int(c.ip[0]&0xF) * 4
		}
		check(fmt.Sprintf("%s#%d", c.file, c.n), c.ip[:ihl], c.ip[ihl:ihl+UDPHeaderLen], c.ip[ihl+UDPHeaderLen:], true)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for n := BTHLen; n <= 200; n++ {
		pkt := make([]byte, n+ICRCLen)
		for i := range pkt {
			pkt[i] = byte(rng.Uint32())
		}
		udp := []byte{0xC0, 0x01, 0x12, 0xB7, 0, 0, 0x12, 0x34}
		binary.BigEndian.PutUint16(udp[4:], uint16(UDPHeaderLen+len(pkt)))
		v4 := []byte{0x45, 0x8A, 0, 0, byte(n), 7, 0x40, 0, 3, 17, 0xAB, 0xCD, 10, 0, 0, 1, 10, 0, 0, 2}
		binary.BigEndian.PutUint16(v4[2:], uint16(len(v4)+len(udp)+len(pkt)))
		check(fmt.Sprintf("IPv4, %d bytes", n), v4, udp, pkt, false)
		v6 := make([]byte, ipv6HeaderLen)
		v6[0], v6[1], v6[6], v6[7] = 0x61, 0x23, 17, 9
		for i := 8; i < 40; i++ {
			v6[i] = byte(rng.Uint32())
		}
		binary.BigEndian.PutUint16(v6[4:], uint16(len(udp)+len(pkt)))
		check(fmt.Sprintf("IPv6, %d bytes", n), v6, udp, pkt, false)
	}
	if _, err := NewICRCSeed([]byte{0x45, 0}, make([]byte, UDPHeaderLen)); err != ErrIPHeader {
		t.Errorf("NewICRCSeed of a cut IPv4 header: %v, want ErrIPHeader", err)
	}
	if _, err := ICRCSeed(0).ICRC(make([]byte, BTHLen-1)); err != ErrTruncated {
		t.Errorf("ICRC of 11 bytes: %v, want ErrTruncated", err)
	}
}

// BenchmarkICRCSeeded is BenchmarkICRC's verification of a packet from the BTH on, for packets whose
// headers' seed (NewICRCSeed) is known: what a sealer or a verifier that keeps seeds pays per packet.
func BenchmarkICRCSeeded(b *testing.B) {
	for _, n := range []int{0, 16, 48} {
		b.Run(itoa(n), func(b *testing.B) {
			ip, udp, pkt, _, _ := benchPacket(b, n)
			seed, err := NewICRCSeed(ip, udp)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(pkt)))
			for b.Loop() {
				if c, err := seed.ICRC(pkt[:len(pkt)-ICRCLen]); err != nil || c != binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:]) {
					b.Fatal("ICRC mismatch", err)
				}
			}
		})
	}
}
