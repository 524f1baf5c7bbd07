package wire

import (
	"encoding/binary"
	"hash/crc32"
)

// ICRCLen is the size of the invariant CRC that ends every RoCEv2 transport packet.
const ICRCLen = 4

// UDPHeaderLen is the size of a UDP header.
const UDPHeaderLen = 8

// UDPPort is the IANA destination port of RoCEv2. IBTA Annex A17.
const UDPPort = 4791

// The ICRC is CRC-32 (the Ethernet polynomial, reflected, as in hash/crc32's IEEE table) over
//
//	8 bytes of 0xFF (the LRH RoCEv2 does not have, masked)
//	‖ the IP header, with the fields routers may change set to all ones:
//	    IPv4: TOS, TTL and header checksum;  IPv6: traffic class, flow label and hop limit
//	‖ the UDP header, with its checksum set to all ones
//	‖ the BTH, with byte 4 (FECN, BECN, Resv6) set to all ones
//	‖ everything after the BTH up to the ICRC: extension headers, payload, pad
//
// and goes on the wire little-endian, like an Ethernet FCS. IBTA Annex A17 (ICRC); confirmed on rxe
// captures and against Linux rxe_icrc.c, which seeds its CRC with 0xdebb20e3, the CRC state after the
// eight masked LRH bytes.
//
// The headers (at most 60+8+12 bytes) are copied into a stack array and masked there. Where the CPU
// folds with a vector carry-less multiply (AVX-512, or AVX2 with VPCLMULQDQ), they go with the rest of the packet into foldCRC (see
// crc.go), unless that rest is short. Elsewhere, and for a short rest (an ACK's AETH, a small SEND),
// they run through a small slicing-by-16 CRC of this package's own (hash/crc32's fast paths are
// reached through function values, which would make the stack array escape and allocate), and a rest
// of 64 bytes or more through hash/crc32's hardware-assisted path. Computing an ICRC never allocates.

// maxMaskedLen is the largest masked prefix: an IPv4 header with options, UDP and BTH.
const maxMaskedLen = 60 + UDPHeaderLen + BTHLen

// lrhCRC is the CRC state after the eight masked LRH bytes.
var lrhCRC = crc32.Update(0, crc32.IEEETable, []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF})

// slicing16 holds the tables of a slicing-by-16 CRC-32 over the IEEE polynomial: a 40-byte masked
// IPv4 prefix takes two rounds of 16 bytes and one of 8, where slicing-by-8 took five.
var slicing16 = func() (t [16][256]uint32) {
	t[0] = *crc32.IEEETable
	for i := range 256 {
		crc := t[0][i]
		for j := 1; j < 16; j++ {
			crc = t[0][crc&0xFF] ^ crc>>8
			t[j][i] = crc
		}
	}
	return t
}()

// clmulMin is the shortest payload worth hash/crc32's call: below it, the slicing-by-16 loop finishes
// before hash/crc32 has reached its hardware path (which starts at 64 bytes there too); an ACK or a
// 16-byte SEND costs a third less this way (BenchmarkICRC).
const clmulMin = 64

// smallUpdate continues a crc32.Update-style CRC (pre- and post-inverted) over p.
func smallUpdate(crc uint32, p []byte) uint32 {
	t := &slicing16
	crc = ^crc
	for len(p) >= 16 {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[0][p[15]] ^ t[1][p[14]] ^ t[2][p[13]] ^ t[3][p[12]] ^
			t[4][p[11]] ^ t[5][p[10]] ^ t[6][p[9]] ^ t[7][p[8]] ^
			t[8][p[7]] ^ t[9][p[6]] ^ t[10][p[5]] ^ t[11][p[4]] ^
			t[12][crc>>24] ^ t[13][crc>>16&0xFF] ^ t[14][crc>>8&0xFF] ^ t[15][crc&0xFF]
		p = p[16:]
	}
	if len(p) >= 8 {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xFF] ^ t[6][crc>>8&0xFF] ^ t[7][crc&0xFF]
		p = p[8:]
	}
	for _, v := range p {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return ^crc
}

// maskedPrefix copies the IP, UDP and BTH headers into buf with the variant fields set to all ones and
// returns the number of bytes written. ip must be a whole IPv4 header (IHL*4 bytes, options included) or
// a 40-byte IPv6 header.
func maskedPrefix(buf *[maxMaskedLen]byte, ip, udp, bth []byte) (int, error) {
	n, err := maskedIPUDP(buf, ip, udp)
	if err != nil {
		return 0, err
	}
	n += copy(buf[n:], bth[:BTHLen])
	buf[n-BTHLen+bthECN] = 0xFF // FECN, BECN, Resv6
	return n, nil
}

// maskedIPUDP is maskedPrefix without the BTH.
func maskedIPUDP(buf *[maxMaskedLen]byte, ip, udp []byte) (int, error) {
	if len(ip) == 0 || len(udp) != UDPHeaderLen {
		return 0, ErrIPHeader
	}
	switch ip[0] >> 4 {
	case 4:
		ihl := int(ip[0]&0xF) * 4
		if ihl < ipv4MinHeaderLen || len(ip) != ihl {
			return 0, ErrIPHeader
		}
		copy(buf[:], ip)
		buf[1] = 0xFF                 // TOS
		buf[8] = 0xFF                 // TTL
		buf[10], buf[11] = 0xFF, 0xFF // header checksum
	case 6:
		if len(ip) != ipv6HeaderLen {
			return 0, ErrIPHeader
		}
		copy(buf[:], ip)
		buf[0] |= 0x0F                            // traffic class, high bits
		buf[1], buf[2], buf[3] = 0xFF, 0xFF, 0xFF // traffic class, low bits, and flow label
		buf[7] = 0xFF                             // hop limit
	default:
		return 0, ErrIPHeader
	}
	n := len(ip)
	n += copy(buf[n:], udp)
	buf[n-2], buf[n-1] = 0xFF, 0xFF // UDP checksum
	return n, nil
}

// ComputeICRC returns the ICRC of a RoCEv2 packet. ip is the IPv4 header (options included) or the IPv6
// header, udp the 8-byte UDP header, and pkt the transport packet from the BTH up to, not including,
// the ICRC. The result is the value whose little-endian encoding goes on the wire.
func ComputeICRC(ip, udp, pkt []byte) (uint32, error) {
	if len(pkt) < BTHLen {
		return 0, ErrTruncated
	}
	var buf [maxMaskedLen]byte
	n, err := maskedPrefix(&buf, ip, udp, pkt)
	if err != nil {
		return 0, err
	}
	rest := pkt[BTHLen:]
	if haveFold && len(rest) >= foldICRCMin {
		return foldedICRC(buf[:n], nil, rest), nil
	}
	crc := smallUpdate(lrhCRC, buf[:n])
	if len(rest) >= clmulMin {
		return crc32.Update(crc, crc32.IEEETable, rest), nil
	}
	return smallUpdate(crc, rest), nil
}

// An ICRCSeed is the ICRC's CRC state after the masked LRH, IP and UDP headers of a packet: the part of
// the ICRC that packets of one flow share when they have the same length and, over IPv4, the same
// identification. A sender or receiver that meets the same headers again and again, as the SENDs
// and ACKs of a ping-pong do, can make the seed once (NewICRCSeed) and finish each packet's ICRC from
// it (ICRCSeed.ICRC): for a small packet that skips most of the work, as the headers are most of
// what the ICRC covers (BenchmarkICRCSeeded).
type ICRCSeed uint32

// NewICRCSeed returns the seed of the headers ip and udp, given as for ComputeICRC.
func NewICRCSeed(ip, udp []byte) (ICRCSeed, error) {
	var buf [maxMaskedLen]byte
	n, err := maskedIPUDP(&buf, ip, udp)
	if err != nil {
		return 0, err
	}
	return ICRCSeed(smallUpdate(lrhCRC, buf[:n])), nil
}

// ICRC returns the ICRC of pkt, the transport packet from the BTH up to, not including, the ICRC, in
// the headers s was made from: ComputeICRC's result for them. Only the length s was made for gives
// that result, since the headers hold it.
func (s ICRCSeed) ICRC(pkt []byte) (uint32, error) {
	if len(pkt) < BTHLen {
		return 0, ErrTruncated
	}
	var bth [BTHLen]byte
	copy(bth[:], pkt)
	bth[bthECN] = 0xFF // FECN, BECN, Resv6
	crc := smallUpdate(uint32(s), bth[:])
	rest := pkt[BTHLen:]
	if len(rest) >= clmulMin {
		return crc32.Update(crc, crc32.IEEETable, rest), nil
	}
	return smallUpdate(crc, rest), nil
}

// SetICRC computes the ICRC of pkt, a whole transport packet including its 4-byte ICRC field, and
// stores it there. ip and udp are as for ComputeICRC.
func SetICRC(ip, udp, pkt []byte) error {
	if len(pkt) < BTHLen+ICRCLen {
		return ErrTruncated
	}
	n := len(pkt) - ICRCLen
	crc, err := ComputeICRC(ip, udp, pkt[:n])
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(pkt[n:], crc)
	return nil
}

// SetICRCPieces is SetICRC for a packet held in parts: head, the BTH and the extension headers; the
// payload's pieces, in order; and tail, the pad and the 4-byte ICRC field, where the ICRC goes. A
// sender that hands the socket the payload where it lies, without copying it next to the headers,
// seals the packet this way.
func SetICRCPieces(ip, udp, head []byte, payload [][]byte, tail []byte) error {
	if len(head) < BTHLen || len(tail) < ICRCLen {
		return ErrTruncated
	}
	var buf [maxMaskedLen]byte
	n, err := maskedPrefix(&buf, ip, udp, head)
	if err != nil {
		return err
	}
	ext, pad := head[BTHLen:], tail[:len(tail)-ICRCLen]
	var crc uint32
	if haveFold && len(payload) > 0 && len(payload[0]) >= foldICRCMin && len(ext) <= maxFoldExt {
		crc = foldedICRC(buf[:n], ext, payload[0])
		payload = payload[1:]
	} else {
		crc = smallUpdate(smallUpdate(lrhCRC, buf[:n]), ext)
	}
	for _, p := range payload {
		crc = updateIEEE(crc, p)
	}
	crc = smallUpdate(crc, pad)
	binary.LittleEndian.PutUint32(tail[len(pad):], crc)
	return nil
}

// VerifyICRC checks the ICRC at the end of pkt, a whole transport packet, against the IP and UDP headers
// it arrived with. It returns ErrICRC on a mismatch.
func VerifyICRC(ip, udp, pkt []byte) error {
	if len(pkt) < BTHLen+ICRCLen {
		return ErrTruncated
	}
	n := len(pkt) - ICRCLen
	crc, err := ComputeICRC(ip, udp, pkt[:n])
	if err != nil {
		return err
	}
	if crc != binary.LittleEndian.Uint32(pkt[n:]) {
		return ErrICRC
	}
	return nil
}
