package sim

import (
	"encoding/binary"

	"github.com/goroce/goroce/wire"
)

// Sizes of the framing around a transport packet on the simulated wire.
const (
	ipv4HeaderLen = 20
	headerRoom    = ipv4HeaderLen + wire.UDPHeaderLen // IPv4 and UDP in front of the BTH
	// ethOverhead is what Ethernet adds to an IP packet on the wire: preamble and SFD (8), MAC header
	// (14), FCS (4) and the inter-frame gap (12). IEEE 802.3 clause 3 and 4.4.2.
	ethOverhead = 8 + 14 + 4 + 12
	// ethMinIP is the smallest IP packet a 64-byte Ethernet frame carries without padding.
	ethMinIP = 64 - 14 - 4
	// maxFrame holds the largest datagram: headers, a 4096-byte payload, pad and ICRC.
	maxFrame = headerRoom + 4096 + 128
)

// ECN codepoints of the IP TOS byte's low two bits. RFC 3168 section 5.
const (
	ecnMask = 0x3
	ecnECT0 = 0x2
	ecnCE   = 0x3
)

// packet is one datagram in flight: IPv4 ‖ UDP ‖ BTH ... ICRC, in buf. Packets come from and return to
// the simulator's pool.
type packet struct {
	buf    []byte
	id     uint64 // simulator-wide sequence number of the original transmission; duplicates share it
	inPort int32  // the switch port it arrived on, for PFC ingress accounting; -1 elsewhere
	flow   int32  // the flow of the endpoint that sent it, -1 for none
	dup    bool   // a copy made by a duplicating link
}

func (p *packet) ipLen() int    { return len(p.buf) }
func (p *packet) wireLen() int  { return max(len(p.buf), ethMinIP) + ethOverhead }
func (p *packet) tos() uint8    { return p.buf[1] }
func (p *packet) dstIP() uint32 { return binary.BigEndian.Uint32(p.buf[16:]) }
func (p *packet) srcIP() uint32 { return binary.BigEndian.Uint32(p.buf[12:]) }
func (p *packet) sport() uint16 { return binary.BigEndian.Uint16(p.buf[20:]) }
func (p *packet) transport() []byte {
	return p.buf[headerRoom:]
}

// setTOS rewrites the TOS byte and the IPv4 header checksum, as a router marking CE does. The ICRC masks
// TOS, so it stays valid.
func (p *packet) setTOS(tos uint8) {
	p.buf[1] = tos
	ipChecksum(p.buf[:ipv4HeaderLen])
}

// frame builds the IPv4 and UDP headers in front of the transport packet in b[headerRoom:] and seals
// its ICRC. Identification 0 with DF, TTL 64, as goroce's device sends. RFC 791; IBTA Annex A17.
func frame(b []byte, src, dst uint32, sport uint16, tos uint8) {
	n := len(b) - headerRoom
	ip := b[:ipv4HeaderLen]
	ip[0], ip[1] = 0x45, tos
	binary.BigEndian.PutUint16(ip[2:], uint16(len(b)))
	ip[4], ip[5], ip[6], ip[7] = 0, 0, 0x40, 0
	ip[8], ip[9] = 64, 17
	binary.BigEndian.PutUint32(ip[12:], src)
	binary.BigEndian.PutUint32(ip[16:], dst)
	ipChecksum(ip)
	udp := b[ipv4HeaderLen:headerRoom]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], wire.UDPPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(wire.UDPHeaderLen+n))
	udp[6], udp[7] = 0, 0
	_ = wire.SetICRC(ip, udp, b[headerRoom:])
}

// ipChecksum fills in the IPv4 header checksum. RFC 1071.
func ipChecksum(ip []byte) {
	ip[10], ip[11] = 0, 0
	var sum uint32
	for i := 0; i < len(ip); i += 2 {
		sum += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xFFFF + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
}

// ipChecksumOK verifies an IPv4 header checksum.
func ipChecksumOK(ip []byte) bool {
	var sum uint32
	for i := 0; i < len(ip); i += 2 {
		sum += uint32(ip[i])<<8 | uint32(ip[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xFFFF + sum>>16
	}
	return uint16(sum) == 0xFFFF
}

// hostAddr is host i's IPv4 address, 10.0.x.y with x.y = i+1.
func hostAddr(i int) uint32 { return 10<<24 | uint32(i+1)&0xFFFF }

// hostIndex inverts hostAddr; -1 if a is no host's address.
func hostIndex(a uint32) int {
	if a>>16 != 10<<8 {
		return -1
	}
	return int(a&0xFFFF) - 1
}

// UDPSourcePort returns the UDP source port rxe uses for a connection between two QPNs: the flow label
// of rdma_calc_flow_label folded into 14 bits above 0xC000 (rdma_get_udp_sport). Both ends compute the
// same port. include/rdma/ib_verbs.h.
func UDPSourcePort(local, remote wire.QPN) uint16 {
	v := uint64(local) * uint64(remote)
	v ^= v >> 20
	v ^= v >> 40
	fl := uint32(v & 0xFFFFF)
	return uint16(fl&0x3FFF^(fl&0xFC000)>>14) | 0xC000
}

// pool hands out packets without allocating in the steady state.
type pool struct {
	free []*packet
}

func (p *pool) get() *packet {
	if n := len(p.free); n > 0 {
		k := p.free[n-1]
		p.free = p.free[:n-1]
		return k
	}
	return &packet{buf: make([]byte, 0, maxFrame)}
}

func (p *pool) put(k *packet) {
	k.buf = k.buf[:0]
	k.dup = false
	p.free = append(p.free, k)
}
