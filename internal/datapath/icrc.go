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

// seal fills in pkt's ICRC for the headers the kernel will put in front of it: from src to dst, and
// for IPv4 with identification id.
func seal(pkt []byte, src, dst netip.AddrPort, id uint16) {
	var udp [8]byte
	udpHeader(&udp, src.Port(), dst.Port(), len(pkt))
	from, to := src.Addr().Unmap(), dst.Addr().Unmap()
	if from.Is4() && to.Is4() {
		var ip [20]byte
		ipv4Header(&ip, from, to, len(pkt), id)
		_ = wire.SetICRC(ip[:], udp[:], pkt)
		return
	}
	var ip [40]byte
	ipv6Header(&ip, src.Addr(), dst.Addr(), len(pkt))
	_ = wire.SetICRC(ip[:], udp[:], pkt)
}

// sealPieces is seal for a packet in parts (see wire.SetICRCPieces): head, the payload's pieces and
// tail.
func sealPieces(head []byte, payload [][]byte, tail []byte, src, dst netip.AddrPort, id uint16) {
	n := len(head) + len(tail)
	for _, p := range payload {
		n += len(p)
	}
	var udp [8]byte
	udpHeader(&udp, src.Port(), dst.Port(), n)
	from, to := src.Addr().Unmap(), dst.Addr().Unmap()
	if from.Is4() && to.Is4() {
		var ip [20]byte
		ipv4Header(&ip, from, to, n, id)
		_ = wire.SetICRCPieces(ip[:], udp[:], head, payload, tail)
		return
	}
	var ip [40]byte
	ipv6Header(&ip, src.Addr(), dst.Addr(), n)
	_ = wire.SetICRCPieces(ip[:], udp[:], head, payload, tail)
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
	src, dst := from.Addr().Unmap(), to.Addr().Unmap()
	var udp [8]byte
	udpHeader(&udp, from.Port(), to.Port(), pkt.Len())
	if src.Is4() && dst.Is4() {
		var ip [20]byte
		if mode == ICRCStrict {
			ipv4Header(&ip, src, dst, pkt.Len(), 0)
			return 0, wire.VerifyICRC(ip[:], udp[:], pkt.Bytes()) == nil
		}
		ipv4Header(&ip, src, dst, pkt.Len(), guess)
		id, _, err := v.rec.VerifyIPv4(ip[:], udp[:], pkt.Bytes())
		return id, err == nil
	}
	var ip [40]byte
	ipv6Header(&ip, from.Addr(), to.Addr(), pkt.Len())
	return 0, wire.VerifyICRC(ip[:], udp[:], pkt.Bytes()) == nil
}
