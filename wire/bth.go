package wire

import "encoding/binary"

// BTHLen is the size of the base transport header. IBTA Vol 1 9.2 (BTH).
const BTHLen = 12

// BTH is a view of a base transport header. It is the first header of every RoCEv2 transport packet,
// right after the UDP header. IBTA Vol 1 9.2 (Base Transport Header).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    OpCode     |S|M|Pad|  TVer |             P_Key             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|F|B|   Resv6   |                     DestQP                    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|A|    Resv7    |                      PSN                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// S is Solicited Event, M MigReq, F and B the FECN and BECN congestion bits (byte 4 is masked to all
// ones in the ICRC), A AckReq. Accessors do not check the length: use them on a slice of at least
// BTHLen bytes, such as one Parse returned.
type BTH []byte

const (
	bthOpcode = 0
	bthFlags  = 1 // SE, MigReq, PadCnt, TVer
	bthPKey   = 2
	bthECN    = 4 // FECN, BECN, Resv6
	bthDestQP = 4 // low 24 bits of the second word
	bthAck    = 8 // AckReq, Resv7
	bthPSN    = 8 // low 24 bits of the third word

	bthSEBit     = 0x80
	bthMigReqBit = 0x40
	bthPadShift  = 4
	bthPadMask   = 0x3
	bthTVerMask  = 0x0F
	bthFECNBit   = 0x80
	bthBECNBit   = 0x40
	bthResv6Mask = 0x3F
	bthAckReqBit = 0x80
	bthResv7Mask = 0x7F
)

// TransportVersion is the only BTH TVer defined; packets with another version are dropped.
// IBTA Vol 1 9.2 (TVer).
const TransportVersion = 0

// Opcode returns the OpCode field.
func (b BTH) Opcode() Opcode { return Opcode(b[bthOpcode]) }

// SolicitedEvent returns the SE bit: the requester asks the responder to raise a completion event.
func (b BTH) SolicitedEvent() bool { return b[bthFlags]&bthSEBit != 0 }

// MigReq returns the migration request bit. rxe sends 0, ConnectX NICs 1; receivers ignore it.
func (b BTH) MigReq() bool { return b[bthFlags]&bthMigReqBit != 0 }

// PadCnt returns the number of pad bytes (0 to 3) between the payload and the ICRC.
func (b BTH) PadCnt() int { return int(b[bthFlags]>>bthPadShift) & bthPadMask }

// TVer returns the transport header version; TransportVersion is the only valid value.
func (b BTH) TVer() uint8 { return b[bthFlags] & bthTVerMask }

// PKey returns the partition key.
func (b BTH) PKey() PKey { return PKey(binary.BigEndian.Uint16(b[bthPKey:])) }

// FECN returns the forward explicit congestion notification bit. IBTA Vol 1 Annex A10.
func (b BTH) FECN() bool { return b[bthECN]&bthFECNBit != 0 }

// BECN returns the backward explicit congestion notification bit; a RoCEv2 CNP sets it. IBTA Annex A17.9.3.
func (b BTH) BECN() bool { return b[bthECN]&bthBECNBit != 0 }

// DestQP returns the destination queue pair number.
func (b BTH) DestQP() QPN { return QPN(binary.BigEndian.Uint32(b[bthDestQP:]) & PSNMask) }

// AckReq returns the acknowledge request bit: the responder must acknowledge this packet.
func (b BTH) AckReq() bool { return b[bthAck]&bthAckReqBit != 0 }

// PSN returns the packet sequence number.
func (b BTH) PSN() PSN { return PSN(binary.BigEndian.Uint32(b[bthPSN:]) & PSNMask) }

// SetOpcode sets the OpCode field.
func (b BTH) SetOpcode(o Opcode) { b[bthOpcode] = byte(o) }

// SetSolicitedEvent sets the SE bit.
func (b BTH) SetSolicitedEvent(v bool) { setBit(&b[bthFlags], bthSEBit, v) }

// SetMigReq sets the MigReq bit.
func (b BTH) SetMigReq(v bool) { setBit(&b[bthFlags], bthMigReqBit, v) }

// SetPadCnt sets the pad count; n must be 0 to 3.
func (b BTH) SetPadCnt(n int) {
	b[bthFlags] = b[bthFlags]&^(bthPadMask<<bthPadShift) | byte(n&bthPadMask)<<bthPadShift
}

// SetPKey sets the partition key.
func (b BTH) SetPKey(k PKey) { binary.BigEndian.PutUint16(b[bthPKey:], uint16(k)) }

// SetFECN sets the FECN bit.
func (b BTH) SetFECN(v bool) { setBit(&b[bthECN], bthFECNBit, v) }

// SetBECN sets the BECN bit.
func (b BTH) SetBECN(v bool) { setBit(&b[bthECN], bthBECNBit, v) }

// SetDestQP sets the destination QP, keeping FECN, BECN and Resv6.
func (b BTH) SetDestQP(q QPN) { put24(b[bthDestQP+1:], uint32(q)) }

// SetAckReq sets the AckReq bit.
func (b BTH) SetAckReq(v bool) { setBit(&b[bthAck], bthAckReqBit, v) }

// SetPSN sets the PSN, keeping AckReq and Resv7.
func (b BTH) SetPSN(p PSN) { put24(b[bthPSN+1:], uint32(p)) }

// BTHFields holds every field of a BTH, reserved bits included so that a decoded header re-encodes to the
// same bytes.
type BTHFields struct {
	Opcode         Opcode
	SolicitedEvent bool
	MigReq         bool
	PadCnt         uint8
	TVer           uint8
	PKey           PKey
	FECN           bool
	BECN           bool
	Resv6          uint8
	DestQP         QPN
	AckReq         bool
	Resv7          uint8
	PSN            PSN
}

// Fields decodes the whole header.
func (b BTH) Fields() BTHFields {
	return BTHFields{
		Opcode:         b.Opcode(),
		SolicitedEvent: b.SolicitedEvent(),
		MigReq:         b.MigReq(),
		PadCnt:         uint8(b.PadCnt()),
		TVer:           b.TVer(),
		PKey:           b.PKey(),
		FECN:           b.FECN(),
		BECN:           b.BECN(),
		Resv6:          b[bthECN] & bthResv6Mask,
		DestQP:         b.DestQP(),
		AckReq:         b.AckReq(),
		Resv7:          b[bthAck] & bthResv7Mask,
		PSN:            b.PSN(),
	}
}

// Encode writes all of f into b.
func (b BTH) Encode(f *BTHFields) {
	b[bthOpcode] = byte(f.Opcode)
	b[bthFlags] = bit(f.SolicitedEvent, bthSEBit) | bit(f.MigReq, bthMigReqBit) |
		(f.PadCnt&bthPadMask)<<bthPadShift | f.TVer&bthTVerMask
	binary.BigEndian.PutUint16(b[bthPKey:], uint16(f.PKey))
	binary.BigEndian.PutUint32(b[bthDestQP:], uint32(f.DestQP)&PSNMask)
	b[bthECN] = bit(f.FECN, bthFECNBit) | bit(f.BECN, bthBECNBit) | f.Resv6&bthResv6Mask
	binary.BigEndian.PutUint32(b[bthPSN:], uint32(f.PSN)&PSNMask)
	b[bthAck] = bit(f.AckReq, bthAckReqBit) | f.Resv7&bthResv7Mask
}

// Append appends the encoding of f to dst.
func (f *BTHFields) Append(dst []byte) []byte {
	dst, h := grow(dst, BTHLen)
	BTH(h).Encode(f)
	return dst
}

func setBit(b *byte, mask byte, v bool) {
	if v {
		*b |= mask
	} else {
		*b &^= mask
	}
}

func bit(v bool, mask byte) byte {
	if v {
		return mask
	}
	return 0
}

// put24 writes the low 24 bits of v big-endian into b[0:3].
func put24(b []byte, v uint32) {
	_ = b[2]
	b[0] = byte(v >> 16)
	b[1] = byte(v >> 8)
	b[2] = byte(v)
}

// get24 reads a 24-bit big-endian value from b[0:3].
func get24(b []byte) uint32 {
	_ = b[2]
	return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])
}

// grow extends dst by n bytes and returns the extended slice and the n new bytes. The new bytes are not
// zeroed when dst's capacity is reused; callers overwrite all of them.
func grow(dst []byte, n int) ([]byte, []byte) {
	l := len(dst)
	if cap(dst)-l < n {
		nb := make([]byte, l, 2*cap(dst)+n)
		copy(nb, dst)
		dst = nb
	}
	dst = dst[:l+n]
	return dst, dst[l:]
}
