package capture

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/wire"
)

// sealed returns a RoCEv2 RC SEND_ONLY carrying payload, from `from` to `to`, with its ICRC sealed as
// goroce's datapath seals it: over an IPv4 header with identification id and DF (or an IPv6 header),
// TOS, TTL and checksums being masked. The headers are built here independently of appendFrame.
func sealed(t testing.TB, from, to netip.AddrPort, id uint16, payload []byte) []byte {
	t.Helper()
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 0x123456, AckReq: true}}
	pkt, err := wire.Append(nil, &f, payload)
	if err != nil {
		t.Fatal(err)
	}
	n := len(pkt)
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], from.Port())
	binary.BigEndian.PutUint16(udp[2:], to.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(8+n))
	var ip []byte
	if from.Addr().Unmap().Is4() {
		ip = []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0}
		binary.BigEndian.PutUint16(ip[2:], uint16(20+8+n))
		binary.BigEndian.PutUint16(ip[4:], id)
		s, d := from.Addr().Unmap().As4(), to.Addr().Unmap().As4()
		ip = append(append(ip, s[:]...), d[:]...)
	} else {
		ip = make([]byte, 8, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(8+n))
		ip[6], ip[7] = 17, 64
		s, d := from.Addr().As16(), to.Addr().As16()
		ip = append(append(ip, s[:]...), d[:]...)
	}
	if err := wire.SetICRC(ip, udp, pkt); err != nil {
		t.Fatal(err)
	}
	return pkt
}

// onesSum is the RFC 1071 sum of b, folded.
func onesSum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xFFFF + s>>16
	}
	return uint16(s)
}

// checkFrame checks an Ethernet frame the Writer built: the IP header and UDP checksums verify, and
// wire.ParseIP, which checks the ICRC against the IP and UDP headers the frame carries, accepts it.
func checkFrame(t testing.TB, frame []byte) wire.Frame {
	t.Helper()
	f, err := checkFrameChecksums(t, frame, true)
	if err != nil {
		t.Fatalf("wire.ParseIP: %v", err)
	}
	return f
}

// checkFrameChecksums checks the IP and UDP checksums of frame (a zero UDP checksum passes unless
// udpSum) and returns what wire.ParseIP says of it.
func checkFrameChecksums(t testing.TB, frame []byte, udpSum bool) (wire.Frame, error) {
	t.Helper()
	if len(frame) < ethHeaderLen+ipv4HeaderLen+8 {
		t.Fatalf("frame of %d bytes", len(frame))
	}
	ip := frame[ethHeaderLen:]
	var pseudo []byte
	var udp []byte
	switch binary.BigEndian.Uint16(frame[12:]) {
	case etherTypeIPv4:
		if onesSum(ip[:20]) != 0xFFFF {
			t.Errorf("IPv4 header checksum does not verify: % x", ip[:20])
		}
		udp = ip[20:]
		pseudo = append(append([]byte{}, ip[12:20]...), 0, 17)
	case etherTypeIPv6:
		udp = ip[40:]
		pseudo = append(append([]byte{}, ip[8:40]...), 0, 17)
	default:
		t.Fatalf("ethertype %#04x", binary.BigEndian.Uint16(frame[12:]))
	}
	pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(udp)))
	switch sum := binary.BigEndian.Uint16(udp[6:]); {
	case sum == 0 && (udpSum || ip[0]>>4 == 6):
		t.Errorf("UDP checksum 0")
	case sum != 0 && onesSum(append(pseudo, udp...)) != 0xFFFF:
		t.Errorf("UDP checksum %#04x does not verify", sum)
	}
	return wire.ParseIP(ip)
}

func TestFrameIPv4(t *testing.T) {
	from, to := netip.MustParseAddrPort("10.0.0.1:49152"), netip.MustParseAddrPort("10.0.0.2:4791")
	for _, id := range []uint16{0, 1, 7, 0xFFFF} {
		for _, n := range []int{0, 1, 3, 1024} { // odd lengths exercise the checksum's last byte and the pad
			pkt := sealed(t, from, to, id, make([]byte, n))
			frame := appendFrame(nil, from, to, 0x02, id, pkt)
			checkFrame(t, frame)
			ip := frame[ethHeaderLen:]
			if got := binary.BigEndian.Uint16(ip[4:]); got != id {
				t.Errorf("identification %d, want %d", got, id)
			}
			if ip[1] != 0x02 || ip[6] != 0x40 || ip[7] != 0 || ip[8] != 64 || ip[9] != 17 {
				t.Errorf("TOS %#x flags %#x%02x TTL %d protocol %d", ip[1], ip[6], ip[7], ip[8], ip[9])
			}
			if want := [6]byte{2, 0, 10, 0, 0, 1}; [6]byte(frame[6:12]) != want {
				t.Errorf("source MAC % x", frame[6:12])
			}
		}
	}
	// Sealed for identification 3, framed with 4: the ICRC must not verify.
	pkt := sealed(t, from, to, 3, nil)
	if _, err := wire.ParseIP(appendFrame(nil, from, to, 0, 4, pkt)[ethHeaderLen:]); err == nil {
		t.Error("an ICRC sealed for identification 3 verified under 4")
	}
}

func TestFrameIPv6(t *testing.T) {
	from, to := netip.MustParseAddrPort("[fd00::1]:49153"), netip.MustParseAddrPort("[fd00::2]:4791")
	pkt := sealed(t, from, to, 0, []byte("hello"))
	frame := appendFrame(nil, from, to, 0xB8|0x02, 0, pkt)
	checkFrame(t, frame)
	ip := frame[ethHeaderLen:]
	if tc := binary.BigEndian.Uint32(ip) >> 20 & 0xFF; tc != 0xBA || ip[7] != 64 {
		t.Errorf("traffic class %#x, hop limit %d", tc, ip[7])
	}
}

// A datagram from an IPv4-mapped address travels in IPv4, as goroce seals it.
func TestFrameMapped(t *testing.T) {
	from, to := netip.MustParseAddrPort("[::ffff:10.0.0.1]:49152"), netip.MustParseAddrPort("10.0.0.2:4791")
	pkt := sealed(t, netip.MustParseAddrPort("10.0.0.1:49152"), to, 5, nil)
	frame := appendFrame(nil, from, to, 0, 5, pkt)
	if binary.BigEndian.Uint16(frame[12:]) != etherTypeIPv4 {
		t.Fatal("not IPv4")
	}
	checkFrame(t, frame)
}
