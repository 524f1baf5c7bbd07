package wire

import (
	"net/netip"
	"testing"
)

// benchPacket builds an MTU-4096 RDMA WRITE MIDDLE packet and the IPv4/UDP headers it would travel in.
func benchPacket(b *testing.B, payloadLen int) (ip, udp, pkt []byte, f Fields, payload []byte) {
	payload = make([]byte, payloadLen)
	for i := range payload {
		payload[i] = byte(i)
	}
	f = Fields{BTH: BTHFields{Opcode: RCWriteMiddle, PKey: DefaultPKey, DestQP: 0x11, PSN: 100}}
	pkt, err := Append(nil, &f, payload)
	if err != nil {
		b.Fatal(err)
	}
	src, dst := netip.MustParseAddr("10.0.0.1").As4(), netip.MustParseAddr("10.0.0.2").As4()
	total := 20 + 8 + len(pkt)
	ip = []byte{0x45, 0, byte(total >> 8), byte(total), 0, 0, 0x40, 0, 64, 17, 0, 0}
	ip = append(append(ip, src[:]...), dst[:]...)
	ul := 8 + len(pkt)
	udp = []byte{0xC0, 0x00, 0x12, 0xB7, byte(ul >> 8), byte(ul), 0, 0}
	if err := SetICRC(ip, udp, pkt); err != nil {
		b.Fatal(err)
	}
	return ip, udp, pkt, f, payload
}

func BenchmarkParse(b *testing.B) {
	_, _, pkt, _, _ := benchPacket(b, 4096)
	b.ReportAllocs()
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		if _, err := Parse(pkt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseIP(b *testing.B) {
	ip, udp, pkt, _, _ := benchPacket(b, 4096)
	frame := append(append(append([]byte(nil), ip...), udp...), pkt...)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := ParseIP(frame); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppend(b *testing.B) {
	_, _, _, f, payload := benchPacket(b, 4096)
	buf := make([]byte, 0, 8192)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if _, err := Append(buf[:0], &f, payload); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkICRC measures VerifyICRC on whole packets of several payload sizes, each way this CPU
// computes the CRC (foldVariants).
func BenchmarkICRC(b *testing.B) {
	for _, v := range foldVariants() {
		for _, n := range []int{0, 16, 48, 1024, 4096} {
			b.Run(v.name+"/"+itoa(n), func(b *testing.B) {
				defer v.use()()
				benchICRC(b, n)
			})
		}
	}
}

func benchICRC(b *testing.B, n int) {
	ip, udp, pkt, _, _ := benchPacket(b, n)
	b.ReportAllocs()
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		if err := VerifyICRC(ip, udp, pkt); err != nil {
			b.Fatal(err)
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

// BenchmarkUpdateIEEE measures updateIEEE each way this CPU computes it (foldVariants), hash/crc32's
// own among them, at a packet's payload sizes: the ratio of the two is the fold's gain here.
func BenchmarkUpdateIEEE(b *testing.B) {
	p := make([]byte, 4096)
	for i := range p {
		p[i] = byte(i * 7)
	}
	for _, v := range foldVariants() {
		for _, n := range []int{256, 1024, 4096} {
			b.Run(v.name+"/"+itoa(n), func(b *testing.B) {
				defer v.use()()
				b.SetBytes(int64(n))
				for b.Loop() {
					updateIEEE(0, p[:n])
				}
			})
		}
	}
}
