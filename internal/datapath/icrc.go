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

// seededMax is the largest transport packet whose ICRC the datapath finishes from a remembered seed
// (icrcSeeds): ACKs, small SENDs, READ requests, atomics. The IP and UDP headers are most of what
// such a packet's ICRC covers; a larger packet's headers are a small part of its ICRC, and its seeds
// would only push out the small packets'.
const seededMax = 64

// seedSlots is how many seeds an icrcSeeds remembers: a power of two.
const seedSlots = 4

// icrcSeeds remembers the ICRC seeds (wire.ICRCSeed) of the last few IPv4 and UDP headers a sealer or
// a verifier built, so that the ICRC of a small packet in the same headers as one before it covers
// only the BTH and what follows: in a ping-pong every SEND and ACK travels in the headers of the one
// a round trip before. The headers are most of a small packet's ICRC: hot, a 16-byte SEND's costs
// 13 ns from a seed against 26 (wire's BenchmarkICRCSeeded and BenchmarkICRC). IPv6 headers are not
// remembered. The zero value is empty; it is not safe for concurrent use.
type icrcSeeds struct {
	keys  [seedSlots]seedKey
	seeds [seedSlots]wire.ICRCSeed
}

// seedKey is what a packet's IPv4 and UDP headers hold besides what every goroce packet's hold and
// what the ICRC masks.
type seedKey struct {
	src, dst netip.AddrPort
	n        uint16 // transport bytes, ICRC included; 0 marks an empty slot
	id       uint16 // identification
}

// seed returns the seed of the headers of a packet of n transport bytes from src to dst with
// identification id, made and remembered on a miss. ok is false for a packet over seededMax or not
// over IPv4: the caller computes its whole ICRC.
func (c *icrcSeeds) seed(src, dst netip.AddrPort, n int, id uint16) (s wire.ICRCSeed, ok bool) {
	if n > seededMax {
		return 0, false
	}
	k := seedKey{src: src, dst: dst, n: uint16(n), id: id}
	i := int(k.n^k.id^src.Port()^dst.Port()) & (seedSlots - 1)
	if c.keys[i] == k {
		return c.seeds[i], true
	}
	if !src.Addr().Unmap().Is4() || !dst.Addr().Unmap().Is4() {
		return 0, false
	}
	var h wireHeaders
	ip, udp := h.fill(src, dst, n, id)
	s, err := wire.NewICRCSeed(ip, udp)
	if err != nil {
		return 0, false
	}
	c.keys[i], c.seeds[i] = k, s
	return s, true
}

// seal is the package's seal, from a remembered seed where there is one.
func (c *icrcSeeds) seal(pkt []byte, src, dst netip.AddrPort, id uint16) {
	if s, ok := c.seed(src, dst, len(pkt), id); ok {
		n := len(pkt) - wire.ICRCLen
		if crc, err := s.ICRC(pkt[:n]); err == nil {
			binary.LittleEndian.PutUint32(pkt[n:], crc)
			return
		}
	}
	seal(pkt, src, dst, id)
}

// verifier checks received ICRCs; each shard's driver has one.
type verifier struct {
	rec   wire.IDRecovery
	seeds icrcSeeds
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
	if s, ok := v.seeds.seed(from, to, pkt.Len(), try); ok {
		b := pkt.Bytes()
		n := len(b) - wire.ICRCLen
		if crc, err := s.ICRC(b[:n]); err == nil && crc == binary.LittleEndian.Uint32(b[n:]) {
			return try, true
		}
		// Another identification than the guess, or a damaged packet: the whole check tells.
	}
	var h wireHeaders
	ip, udp := h.fill(from, to, pkt.Len(), try)
	if len(ip) == 20 && mode != ICRCStrict {
		id, _, err := v.rec.VerifyIPv4(ip, udp, pkt.Bytes())
		return id, err == nil
	}
	return 0, wire.VerifyICRC(ip, udp, pkt.Bytes()) == nil
}
