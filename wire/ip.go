package wire

import "encoding/binary"

// IP protocol numbers and header sizes the RoCEv2 framing uses.
const (
	ipv4MinHeaderLen = 20
	ipv6HeaderLen    = 40
	protoUDP         = 17
)

// Frame is a RoCEv2 transport packet together with the IP and UDP headers it traveled in, as a raw
// socket, a packet socket or a capture file sees it.
type Frame struct {
	IP  []byte // the IPv4 header with its options, or the IPv6 header
	UDP []byte // the UDP header
	Packet
}

var (
	errNotIP       = detail(ErrIPHeader, "wire: not an IPv4 or IPv6 packet")
	errIPShort     = detail(ErrTruncated, "wire: truncated IP packet: shorter than its IP and UDP headers")
	errIPTotal     = detail(ErrTruncated, "wire: truncated IP packet: shorter than its IP length field")
	errIPHeaderLen = detail(ErrIPHeader, "wire: IPv4 header length field below 20 bytes")
	errNotUDP      = detail(ErrIPHeader, "wire: IP payload is not UDP (IPv6 extension headers are not supported)")
	errFragment    = detail(ErrIPHeader, "wire: IPv4 fragment")
	errUDPLen      = detail(ErrIPHeader, "wire: UDP length disagrees with the IP length")
	errNotRoCEPort = detail(ErrIPHeader, "wire: UDP destination port is not 4791")
)

// ParseIP parses an IPv4 or IPv6 packet that carries a RoCEv2 packet: the IP and UDP headers and their
// lengths, the transport packet by Parse's rules, and the ICRC. Bytes after the IP length (link-layer
// padding) are ignored. IPv6 extension headers and IPv4 fragments are not accepted. Like Parse it never
// allocates.
func ParseIP(b []byte) (Frame, error) {
	if len(b) == 0 {
		return Frame{}, errNotIP
	}
	var ip []byte
	var end int
	switch b[0] >> 4 {
	case 4:
		if len(b) < ipv4MinHeaderLen+UDPHeaderLen {
			return Frame{}, errIPShort
		}
		ihl := int(b[0]&0xF) * 4
		if ihl < ipv4MinHeaderLen {
			return Frame{}, errIPHeaderLen
		}
		end = int(binary.BigEndian.Uint16(b[2:]))
		if len(b) < ihl+UDPHeaderLen {
			return Frame{}, errIPShort
		}
		if end < ihl+UDPHeaderLen {
			return Frame{}, errUDPLen
		}
		if b[9] != protoUDP {
			return Frame{}, errNotUDP
		}
		if binary.BigEndian.Uint16(b[6:])&0x3FFF != 0 { // more fragments, or an offset
			return Frame{}, errFragment
		}
		ip = b[:ihl]
	case 6:
		if len(b) < ipv6HeaderLen+UDPHeaderLen {
			return Frame{}, errIPShort
		}
		if b[6] != protoUDP {
			return Frame{}, errNotUDP
		}
		end = ipv6HeaderLen + int(binary.BigEndian.Uint16(b[4:]))
		ip = b[:ipv6HeaderLen]
	default:
		return Frame{}, errNotIP
	}
	if end > len(b) {
		return Frame{}, errIPTotal
	}
	udp := b[len(ip) : len(ip)+UDPHeaderLen]
	if int(binary.BigEndian.Uint16(udp[4:])) != end-len(ip) {
		return Frame{}, errUDPLen
	}
	if binary.BigEndian.Uint16(udp[2:]) != UDPPort {
		return Frame{}, errNotRoCEPort
	}
	p, err := Parse(b[len(ip)+UDPHeaderLen : end])
	if err != nil {
		return Frame{}, err
	}
	if err := VerifyICRC(ip, udp, p.b); err != nil {
		return Frame{}, err
	}
	return Frame{IP: ip, UDP: udp, Packet: p}, nil
}
