package datapath

import (
	"encoding/binary"
	"net/netip"

	"github.com/goroce/goroce/wire"
)

// The ICRC covers the IP and UDP headers the packet travels in (with TOS, TTL, checksums and flow
// label masked), which the kernel writes. The datapath rebuilds them to seal a packet it sends and to
// check one it receives. IBTA Annex A17.4 (RoCEv2 packet format, ICRC).

// ipv4Header writes the IPv4 header a RoCEv2 packet of n transport bytes travels in: identification
// id, DF set as goroce sends it (IP_PMTUDISC_DO), TTL 64; TOS, TTL and checksum are masked by the ICRC.
func ipv4Header(h *[20]byte, src, dst netip.Addr, n int, id uint16) {
	*h = [20]byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17}
	binary.BigEndian.PutUint16(h[2:], uint16(20+wire.UDPHeaderLen+n))
	binary.BigEndian.PutUint16(h[4:], id)
	s, t := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], t[:])
}

// IPv4Header is ipv4Header for goroce's UD receive buffers (the GRH holds the IPv4 header).
func IPv4Header(h *[20]byte, src, dst netip.Addr, n int) { ipv4Header(h, src, dst, n, 0) }

// ipv6Header writes the IPv6 header of a RoCEv2 packet of n transport bytes.
func ipv6Header(h *[40]byte, src, dst netip.Addr, n int) {
	*h = [40]byte{0x60}
	binary.BigEndian.PutUint16(h[4:], uint16(wire.UDPHeaderLen+n))
	h[6], h[7] = 17, 64
	s, t := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], t[:])
}

func udpHeader(h *[8]byte, sport, dport uint16, n int) {
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(wire.UDPHeaderLen+n))
	h[6], h[7] = 0, 0
}

// wireHeaders holds the IP and UDP headers a packet travels in, as the datapath rebuilds them.
type wireHeaders struct {
	ip  [40]byte
	udp [8]byte
}

// fill writes the headers of a packet of n transport bytes from src to dst (IPv4 when both are, with
// identification id) and returns them: ip is 20 bytes for IPv4, 40 for IPv6.
func (h *wireHeaders) fill(src, dst netip.AddrPort, n int, id uint16) (ip, udp []byte) {
	udpHeader(&h.udp, src.Port(), dst.Port(), n)
	from, to := src.Addr().Unmap(), dst.Addr().Unmap()
	if from.Is4() && to.Is4() {
		ipv4Header((*[20]byte)(h.ip[:20]), from, to, n, id)
		return h.ip[:20], h.udp[:]
	}
	ipv6Header(&h.ip, src.Addr(), dst.Addr(), n)
	return h.ip[:], h.udp[:]
}

// seal fills in pkt's ICRC for the headers the kernel will put in front of it: from src to dst, and
// for IPv4 with identification id.
func seal(pkt []byte, src, dst netip.AddrPort, id uint16) {
	var h wireHeaders
	ip, udp := h.fill(src, dst, len(pkt), id)
	_ = wire.SetICRC(ip, udp, pkt)
}

// sealPieces is seal for a packet in parts (see wire.SetICRCPieces): head, the payload's pieces and
// tail.
func sealPieces(head []byte, payload [][]byte, tail []byte, src, dst netip.AddrPort, id uint16) {
	n := len(head) + len(tail)
	for _, p := range payload {
		n += len(p)
	}
	var h wireHeaders
	ip, udp := h.fill(src, dst, n, id)
	_ = wire.SetICRCPieces(ip, udp, head, payload, tail)
}

// verifier checks received ICRCs; each shard's driver has one.
type verifier struct {
	rec wire.IDRecovery
}

// verify checks pkt's ICRC against the headers it traveled in, from from to to. For IPv4 the sender's
// identification is not known to a socket: guess is tried first (0 for a datagram, the segment's index
// in a GRO run from a goroce sender), then, unless mode is ICRCStrict, the identification is recovered
// from the CRC (wire.IDRecovery), with DF required.
func (v *verifier) verify(mode ICRCMode, from, to netip.AddrPort, pkt wire.Packet, guess uint16) (id uint16, ok bool) {
	if mode == ICRCOff {
		return guess, true
	}
	try := guess
	if mode == ICRCStrict {
		try = 0
	}
	var h wireHeaders
	ip, udp := h.fill(from, to, pkt.Len(), try)
	if len(ip) == 20 && mode != ICRCStrict {
		id, _, err := v.rec.VerifyIPv4(ip, udp, pkt.Bytes())
		return id, err == nil
	}
	return 0, wire.VerifyICRC(ip, udp, pkt.Bytes()) == nil
}
