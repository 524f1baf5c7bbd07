package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

// TestGoldenCaptures checks every RoCEv2 packet of the real rxe captures in testdata: it parses with its
// IP and UDP headers, its ICRC verifies, and rebuilding it from its decoded fields gives the same bytes.
func TestGoldenCaptures(t *testing.T) {
	frames := goldenFrames(t)
	seen := map[Opcode]int{}
	for _, c := range frames {
		name := fmt.Sprintf("%s#%d", c.file, c.n)
		f, err := ParseIP(c.ip)
		if err != nil {
			t.Errorf("%s: ParseIP: %v", name, err)
			continue
		}
		seen[f.Opcode()]++

		fields := f.Fields()
		rebuilt, err := Append(nil, &fields, f.Payload())
		if err != nil {
			t.Errorf("%s: Append: %v", name, err)
			continue
		}
		if err := SetICRC(f.IP, f.UDP, rebuilt); err != nil {
			t.Errorf("%s: SetICRC: %v", name, err)
			continue
		}
		if !bytes.Equal(rebuilt, f.Bytes()) {
			t.Errorf("%s: rebuilt packet differs\n got %x\nwant %x", name, rebuilt, f.Bytes())
		}
	}
	t.Logf("%d packets; opcodes: %v", len(frames), seen)
	for _, want := range []Opcode{RCSendFirst, RCSendMiddle, RCSendLast, RCSendOnly, RCWriteFirst,
		RCWriteMiddle, RCWriteLast, RCWriteOnly, RCReadRequest, RCReadResponseOnly, RCAcknowledge, UDSendOnly} {
		if seen[want] == 0 {
			t.Errorf("no %v packet in the captures", want)
		}
	}
}

// maskedBit reports whether bit (byte i, mask m) of an IP packet lies in a field the ICRC masks.
func maskedBit(ip []byte, i int) bool {
	var ipLen int
	if ip[0]>>4 == 4 {
		ipLen = int(ip[0]&0xF) * 4
		switch i {
		case 1, 8, 10, 11: // TOS, TTL, header checksum
			return true
		}
	} else {
		ipLen = 40
		switch i {
		case 1, 2, 3, 7: // traffic class and flow label, hop limit
			return true
		}
	}
	switch i - ipLen {
	case 6, 7: // UDP checksum
		return true
	case UDPHeaderLen + bthECN: // BTH FECN, BECN, Resv6
		return true
	}
	return false
}

// TestGoldenBitFlips flips every bit of a sample of captured packets, one at a time. A flip in a field the
// ICRC covers must fail: with ErrICRC, or earlier with another error when the flip breaks the headers.
// A flip in a masked field (TOS or traffic class, TTL or hop limit, IP and UDP checksums, BTH byte 4)
// must still verify: that is what makes the CRC invariant across routers.
func TestGoldenBitFlips(t *testing.T) {
	frames := goldenFrames(t)
	// One packet of each opcode of each file keeps the test fast while covering every header shape.
	type key struct {
		file string
		op   byte
	}
	sample := map[key]capturedFrame{}
	for _, c := range frames {
		ipLen := 40
		if c.ip[0]>>4 == 4 {
			ipLen = int(c.ip[0]&0xF) * 4
		}
		k := key{c.file, c.ip[ipLen+UDPHeaderLen]}
		if _, ok := sample[k]; !ok {
			sample[k] = c
		}
	}
	for _, c := range sample {
		ip := bytes.Clone(c.ip)
		for i := range ip {
			if ip[0]>>4 == 6 && i == 0 {
				// Byte 0 holds the version; the low nibble (traffic class) is masked.
				continue
			}
			for bit := 0; bit < 8; bit++ {
				ip[i] ^= 1 << bit
				_, err := ParseIP(ip)
				if maskedBit(c.ip, i) {
					if err != nil {
						t.Errorf("%s#%d: flip of masked byte %d bit %d: %v", c.file, c.n, i, bit, err)
					}
				} else if err == nil {
					t.Errorf("%s#%d: flip of byte %d bit %d went undetected", c.file, c.n, i, bit)
				}
				ip[i] ^= 1 << bit
			}
		}
	}
	if len(sample) < 10 {
		t.Fatalf("only %d sample packets", len(sample))
	}
}

// TestGoldenTruncation cuts captured packets at every length: each prefix of an IP packet fails with
// ErrTruncated, since its IP length field promises more.
func TestGoldenTruncation(t *testing.T) {
	for _, c := range goldenFrames(t)[:40] {
		for n := 0; n < len(c.ip); n++ {
			_, err := ParseIP(c.ip[:n])
			if n == 0 {
				if !errors.Is(err, ErrIPHeader) {
					t.Fatalf("%s#%d: empty packet: %v", c.file, c.n, err)
				}
				continue
			}
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("%s#%d cut to %d bytes: got %v, want ErrTruncated", c.file, c.n, n, err)
			}
		}
	}
}

// TestICRCKnownAnswers checks the two published ICRC vectors of scapy's RoCE tests
// (secdev/scapy test/contrib/roce.uts): a UC SEND_ONLY built by scapy, and a CNP captured from a
// ConnectX-4 Lx.
func TestICRCKnownAnswers(t *testing.T) {
	uc := []byte{
		0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, // tos 1, id 1144, DF, ttl 64
		192, 168, 0, 7, 192, 168, 0, 7,
		0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2, // UDP 49152 -> 4791, len 44
		0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10, // UC SEND_ONLY, M, pad 2, PSN 13571856
		'F', '0', 0x81, 0x8b, 0xe2, 0x89, '5', 0xd9, 0x0e, 0x9a, 0x95, 'P', 'T', 0x01, 0xbe, 0x88, '^', 'P', 0, 0,
		0x78, 0xf3, 0x53, 0xf3, // ICRC as scapy expects it on the wire
	}
	cnp := []byte{
		0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61,
		0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00, 0x12, 0x01,
		0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00,
		0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0x82, 0xfd, 0x00, 0x2a,
	}
	for _, tc := range []struct {
		name string
		ip   []byte
		op   Opcode
	}{{"scapy UC SEND_ONLY", uc, UCSendOnly}, {"ConnectX-4 Lx CNP", cnp, CNP}} {
		f, err := ParseIP(tc.ip)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if f.Opcode() != tc.op {
			t.Errorf("%s: opcode %v, want %v", tc.name, f.Opcode(), tc.op)
		}
		want := binary.LittleEndian.Uint32(tc.ip[len(tc.ip)-4:])
		got, err := ComputeICRC(f.IP, f.UDP, f.Bytes()[:f.Len()-ICRCLen])
		if err != nil || got != want {
			t.Errorf("%s: ICRC %#08x (%v), want %#08x", tc.name, got, err, want)
		}
	}
	// The CNP's fields as Annex A17.9.3 describes them.
	f, _ := ParseIP(cnp)
	b := f.BTH()
	if !b.BECN() || b.FECN() || b.DestQP() != 0x118 || b.PSN() != 0 || b.AckReq() || f.PayloadLen() != 0 {
		t.Errorf("CNP fields: %+v", b.Fields())
	}
}
