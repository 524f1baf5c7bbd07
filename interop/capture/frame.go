package capture

import (
	"encoding/binary"
	"net/netip"

	"github.com/goroce/goroce/wire"
)

// Framing a RoCEv2 transport packet as the kernel sends it, so that the ICRC, which covers the IP
// and UDP headers (IBTA Annex A17.4; see wire.ComputeICRC), verifies in the capture:
//
//	Ethernet  synthetic locally administered MACs (a device has no MAC: it sends on a UDP socket)
//	IPv4      identification as traced, DF set (goroce, rxe and ConnectX set it), TOS as traced,
//	          TTL 64 (Linux's ip_default_ttl), header checksum computed
//	IPv6      traffic class as traced, flow label 0 (the kernel may set one; the ICRC masks it),
//	          hop limit 64
//	UDP       ports and length, checksum computed: a goroce device sends on an ordinary UDP socket,
//	          which the kernel checksums (IPv4 RoCEv2 NICs send 0 instead; the ICRC masks it)

// Header sizes and fields. IEEE 802.3 clause 3.1.1 (MAC frame); RFC 791 section 3.1 (IPv4);
// RFC 8200 section 3 (IPv6); RFC 768 (UDP).
const (
	ethHeaderLen  = 14
	ipv4HeaderLen = 20
	ipv6HeaderLen = 40

	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86DD

	ipv4VersionIHL = 0x45   // version 4, five 32-bit words, no options
	ipv4DF         = 0x4000 // flags and fragment offset: Don't Fragment, offset 0
	ipProtoUDP     = 17
	defaultTTL     = 64 // Linux net.ipv4.ip_default_ttl and net.ipv6.conf.*.hop_limit
)

// macOf returns the synthetic MAC of an address: 02:00 (a locally administered unicast prefix, IEEE
// 802 clause 8.2.2) followed by the IPv4 address, or by the last four bytes of an IPv6 address.
func macOf(a netip.Addr) [6]byte {
	b := a.As16()
	return [6]byte{0x02, 0x00, b[12], b[13], b[14], b[15]}
}

// is4 reports whether a packet between from and to travels in IPv4, as goroce's datapath decides when
// it seals one: both addresses IPv4 or IPv4-mapped.
func is4(from, to netip.Addr) bool { return from.Unmap().Is4() && to.Unmap().Is4() }

// appendFrame appends the Ethernet frame of a RoCEv2 transport packet pkt (BTH through ICRC) sent from
// `from` to `to` with the given TOS (traffic class) and IPv4 identification.
func appendFrame(b []byte, from, to netip.AddrPort, tos uint8, id uint16, pkt []byte) []byte {
	src, dst := from.Addr().Unmap(), to.Addr().Unmap()
	v4 := is4(src, dst)
	smac, dmac := macOf(src), macOf(dst)
	b = append(b, dmac[:]...)
	b = append(b, smac[:]...)
	udpLen := wire.UDPHeaderLen + len(pkt)
	var ip []byte
	if v4 {
		b = binary.BigEndian.AppendUint16(b, etherTypeIPv4)
		start := len(b)
		b = append(b, ipv4VersionIHL, tos)
		b = binary.BigEndian.AppendUint16(b, uint16(ipv4HeaderLen+udpLen))
		b = binary.BigEndian.AppendUint16(b, id)
		b = binary.BigEndian.AppendUint16(b, ipv4DF)
		b = append(b, defaultTTL, ipProtoUDP, 0, 0)
		s, d := src.As4(), dst.As4()
		b = append(append(b, s[:]...), d[:]...)
		ip = b[start:]
		binary.BigEndian.PutUint16(ip[10:], ^fold(checksum(0, ip)))
	} else {
		b = binary.BigEndian.AppendUint16(b, etherTypeIPv6)
		start := len(b)
		b = binary.BigEndian.AppendUint32(b, 6<<28|uint32(tos)<<20) // version, traffic class, flow label 0
		b = binary.BigEndian.AppendUint16(b, uint16(udpLen))
		b = append(b, ipProtoUDP, defaultTTL)
		s, d := src.As16(), dst.As16()
		b = append(append(b, s[:]...), d[:]...)
		ip = b[start:]
	}
	u := len(b)
	b = binary.BigEndian.AppendUint16(b, from.Port())
	b = binary.BigEndian.AppendUint16(b, to.Port())
	b = binary.BigEndian.AppendUint16(b, uint16(udpLen))
	b = append(b, 0, 0)
	b = append(b, pkt...)
	binary.BigEndian.PutUint16(b[u+6:], udpChecksum(ip, b[u:]))
	return b
}

// appendEthernet appends an Ethernet header for the IPv4 or IPv6 packet ip, with the synthetic MACs of
// its addresses, and the packet.
func appendEthernet(b, ip []byte) []byte {
	var src, dst netip.Addr
	typ := uint16(etherTypeIPv4)
	switch {
	case len(ip) >= ipv4HeaderLen && ip[0]>>4 == 4:
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	case len(ip) >= ipv6HeaderLen && ip[0]>>4 == 6:
		typ = etherTypeIPv6
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	default:
		src, dst = netip.IPv4Unspecified(), netip.IPv4Unspecified()
	}
	smac, dmac := macOf(src), macOf(dst)
	b = append(b, dmac[:]...)
	b = append(b, smac[:]...)
	b = binary.BigEndian.AppendUint16(b, typ)
	return append(b, ip...)
}

// udpChecksum returns the checksum of the UDP datagram udp (its checksum field zero) carried in the
// IPv4 or IPv6 header ip: the ones' complement sum over the pseudo-header and the datagram, with 0
// sent as 0xFFFF. RFC 768; RFC 8200 section 8.1.
func udpChecksum(ip, udp []byte) uint16 {
	var sum uint32
	if ip[0]>>4 == 4 {
		sum = checksum(sum, ip[12:20]) // source and destination
	} else {
		sum = checksum(sum, ip[8:40])
	}
	sum += ipProtoUDP + uint32(len(udp))
	c := ^fold(checksum(sum, udp))
	if c == 0 {
		c = 0xFFFF
	}
	return c
}

// checksum adds b, as big-endian 16-bit words (an odd last byte padded with zero), to the running
// ones' complement sum. RFC 1071.
func checksum(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

// fold folds a running sum into 16 bits.
func fold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xFFFF + sum>>16
	}
	return uint16(sum)
}
