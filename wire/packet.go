package wire

import "encoding/binary"

// Packet is a validated RoCEv2 transport packet: the UDP payload from the BTH through the ICRC. Only Parse
// makes one; after it, the accessors trust the header chain and do not check lengths again. A Packet
// refers to the bytes it was parsed from and does not copy them.
//
// The accessor of an extension header the opcode does not carry returns nil; use Has or the opcode's
// OpInfo to know which are present.
type Packet struct {
	b       []byte
	info    *OpInfo
	payload uint16
}

// Parse validates a whole transport packet once: the opcode is known, the transport version is 0, the
// packet is long enough for the header chain its opcode requires, its length is a multiple of 4, the pad
// count fits, and the payload is allowed and no larger than MaxPayload. It does not check the ICRC, which
// covers IP and UDP headers Parse does not see: use VerifyICRC, or ParseIP when the IP header is at hand.
// Parse never allocates and never panics.
func Parse(b []byte) (Packet, error) { return parse(b, false) }

// parse is Parse, or with reserved ParseReserved: the opcode must be valid, or else one of the reserved
// RC opcodes, and the checks that follow are the same for both.
func parse(b []byte, reserved bool) (Packet, error) {
	if len(b) < BTHLen+ICRCLen {
		return Packet{}, errShortBTH
	}
	info := &opTable[b[bthOpcode]]
	if reserved {
		if info.valid || info.Transport != TransportRC || info.HeaderLen == 0 {
			return Packet{}, ErrBadOpcode
		}
	} else if !info.valid {
		return Packet{}, ErrBadOpcode
	}
	bth := BTH(b)
	if bth.TVer() != TransportVersion {
		return Packet{}, ErrBadVersion
	}
	hl := int(info.HeaderLen)
	if len(b) < hl+ICRCLen {
		return Packet{}, errShortHeaders
	}
	if len(b)%4 != 0 {
		return Packet{}, errUnaligned
	}
	rest := len(b) - hl - ICRCLen // payload and pad
	pad := bth.PadCnt()
	if !info.Payload {
		if rest != 0 {
			return Packet{}, errUnexpectedPay
		}
		if pad != 0 {
			return Packet{}, errPadNoPayload
		}
		return Packet{b: b, info: info}, nil
	}
	if pad > rest {
		return Packet{}, errPadExceeds
	}
	// rest is a multiple of 4 and pad is at most 3, so payload+pad is the minimal padding of payload.
	n := rest - pad
	if n > MaxPayload {
		return Packet{}, errPayloadTooLarge
	}
	if info.Op == OpAtomicWrite && n != 8 {
		return Packet{}, errAtomicWriteLen
	}
	return Packet{b: b, info: info, payload: uint16(n)}, nil
}

// ParseReserved parses b, which Parse refused with ErrBadOpcode, as an RC request with a reserved
// opcode: a BTH, then payload to the ICRC. Its Info is not Valid and its Op is OpInvalid. An RC
// responder answers such a request with NAK invalid request, as IBTA Vol 1 9.7.5 asks of responder
// errors (qp/CONFORMANCE.md L5; rxe drops it), and for that needs its PSN. Any other b is
// ErrBadOpcode.
func ParseReserved(b []byte) (Packet, error) { return parse(b, true) }

// Bytes returns the whole packet, BTH through ICRC.
func (p Packet) Bytes() []byte { return p.b }

// Len returns the length of the whole packet in bytes.
func (p Packet) Len() int { return len(p.b) }

// Opcode returns the packet's opcode.
func (p Packet) Opcode() Opcode { return Opcode(p.b[bthOpcode]) }

// Info returns the opcode table entry of the packet's opcode.
func (p Packet) Info() *OpInfo { return p.info }

// BTH returns the base transport header.
func (p Packet) BTH() BTH { return BTH(p.b[:BTHLen]) }

// Has reports whether the packet carries extension header h.
func (p Packet) Has(h Header) bool { return p.info.Headers.Has(h) }

func (p Packet) header(h Header) []byte {
	if !p.info.Headers.Has(h) {
		return nil
	}
	off := int(p.info.off[h])
	return p.b[off : off+int(headerLen[h]) : off+int(headerLen[h])]
}

// RETH returns the RDMA extended transport header, or nil.
func (p Packet) RETH() RETH { return RETH(p.header(HdrRETH)) }

// AETH returns the ACK extended transport header, or nil.
func (p Packet) AETH() AETH { return AETH(p.header(HdrAETH)) }

// AtomicETH returns the atomic extended transport header, or nil.
func (p Packet) AtomicETH() AtomicETH { return AtomicETH(p.header(HdrAtomicETH)) }

// AtomicAckETH returns the atomic acknowledge extended transport header, or nil.
func (p Packet) AtomicAckETH() AtomicAckETH { return AtomicAckETH(p.header(HdrAtomicAck)) }

// ImmDt returns the immediate data header, or nil.
func (p Packet) ImmDt() ImmDt { return ImmDt(p.header(HdrImmDt)) }

// IETH returns the invalidate extended transport header, or nil.
func (p Packet) IETH() IETH { return IETH(p.header(HdrIETH)) }

// DETH returns the datagram extended transport header, or nil.
func (p Packet) DETH() DETH { return DETH(p.header(HdrDETH)) }

// FETH returns the flush extended transport header, or nil.
func (p Packet) FETH() FETH { return FETH(p.header(HdrFETH)) }

// CNPReserved returns the 16 reserved bytes of a CNP, or nil.
func (p Packet) CNPReserved() []byte { return p.header(HdrCNP) }

// Payload returns the payload, without pad and ICRC.
func (p Packet) Payload() []byte {
	hl := int(p.info.HeaderLen)
	return p.b[hl : hl+int(p.payload) : hl+int(p.payload)]
}

// PayloadLen returns the payload length in bytes.
func (p Packet) PayloadLen() int { return int(p.payload) }

// ICRC returns the ICRC the packet carries.
func (p Packet) ICRC() uint32 { return binary.LittleEndian.Uint32(p.b[len(p.b)-ICRCLen:]) }

// VerifyICRC checks the packet's ICRC against the IP and UDP headers it arrived with.
func (p Packet) VerifyICRC(ip, udp []byte) error { return VerifyICRC(ip, udp, p.b) }

// Fields holds every header field of a transport packet, for building packets with Append and for
// decoding one whole with Packet.Fields. Only the headers the opcode carries are read or written.
type Fields struct {
	BTH         BTHFields
	DETH        DETHFields
	FETH        uint32
	RETH        RETHFields
	AtomicETH   AtomicETHFields
	AETH        AETHFields
	AtomicAck   uint64 // original remote data of an ATOMIC ACKNOWLEDGE
	Imm         uint32 // immediate data
	IETH        RKey   // rkey a SEND_WITH_INVALIDATE invalidates
	CNPReserved [CNPLen]byte
}

// Fields decodes every header the packet carries. Fields of absent headers are zero.
func (p Packet) Fields() Fields {
	f := Fields{BTH: p.BTH().Fields()}
	i := p.info
	if i.Headers.Has(HdrDETH) {
		f.DETH = p.DETH().Fields()
	}
	if i.Headers.Has(HdrFETH) {
		f.FETH = p.FETH().Bits()
	}
	if i.Headers.Has(HdrRETH) {
		f.RETH = p.RETH().Fields()
	}
	if i.Headers.Has(HdrAtomicETH) {
		f.AtomicETH = p.AtomicETH().Fields()
	}
	if i.Headers.Has(HdrAETH) {
		f.AETH = p.AETH().Fields()
	}
	if i.Headers.Has(HdrAtomicAck) {
		f.AtomicAck = p.AtomicAckETH().OrigData()
	}
	if i.Headers.Has(HdrImmDt) {
		f.Imm = p.ImmDt().Imm()
	}
	if i.Headers.Has(HdrIETH) {
		f.IETH = p.IETH().RKey()
	}
	if i.Headers.Has(HdrCNP) {
		copy(f.CNPReserved[:], p.CNPReserved())
	}
	return f
}

// Len returns the length of the packet f describes with a payload of n bytes: headers, payload, pad and
// ICRC. It returns 0 for an invalid opcode.
func (f *Fields) Len(n int) int {
	i := f.BTH.Opcode.Info()
	if !i.valid {
		return 0
	}
	return int(i.HeaderLen) + n + PadLen(n) + ICRCLen
}

// PadLen returns the number of pad bytes that follow a payload of n bytes: the count that rounds it up
// to a multiple of 4. IBTA Vol 1 9.2 (PadCnt).
func PadLen(n int) int { return -n & 3 }

// Append appends a whole transport packet to dst: the BTH and the extension headers f's opcode calls
// for, then payload, zero pad and a zero ICRC for SetICRC to fill in. The BTH's PadCnt is derived from
// the payload length; f.BTH.PadCnt is ignored. Append allocates only when dst lacks capacity.
func Append(dst []byte, f *Fields, payload []byte) ([]byte, error) {
	dst, err := AppendHeaders(dst, f, len(payload))
	if err != nil {
		return dst, err
	}
	dst = append(dst, payload...)
	return AppendTrailer(dst, len(payload)), nil
}

// AppendHeaders appends the BTH and extension headers of a packet that will carry an n-byte payload,
// with PadCnt set for n. The caller then appends the payload itself (for example by gathering it straight
// from memory) and calls AppendTrailer. On error dst is returned unchanged.
func AppendHeaders(dst []byte, f *Fields, n int) ([]byte, error) {
	i := f.BTH.Opcode.Info()
	if !i.valid {
		return dst, ErrBadOpcode
	}
	if n > 0 && !i.Payload {
		return dst, errBuildPayload
	}
	if n > MaxPayload {
		return dst, errPayloadTooLarge
	}
	if i.Op == OpAtomicWrite && n != 8 {
		return dst, errAtomicWriteLen
	}
	dst, b := grow(dst, int(i.HeaderLen))
	BTH(b).Encode(&f.BTH)
	BTH(b).SetPadCnt(PadLen(n))
	hs := i.Headers
	if hs.Has(HdrDETH) {
		DETH(b[i.off[HdrDETH]:]).Encode(&f.DETH)
	}
	if hs.Has(HdrFETH) {
		FETH(b[i.off[HdrFETH]:]).SetBits(f.FETH)
	}
	if hs.Has(HdrRETH) {
		RETH(b[i.off[HdrRETH]:]).Encode(&f.RETH)
	}
	if hs.Has(HdrAtomicETH) {
		AtomicETH(b[i.off[HdrAtomicETH]:]).Encode(&f.AtomicETH)
	}
	if hs.Has(HdrAETH) {
		AETH(b[i.off[HdrAETH]:]).Encode(&f.AETH)
	}
	if hs.Has(HdrAtomicAck) {
		AtomicAckETH(b[i.off[HdrAtomicAck]:]).SetOrigData(f.AtomicAck)
	}
	if hs.Has(HdrImmDt) {
		ImmDt(b[i.off[HdrImmDt]:]).SetImm(f.Imm)
	}
	if hs.Has(HdrIETH) {
		IETH(b[i.off[HdrIETH]:]).SetRKey(f.IETH)
	}
	if hs.Has(HdrCNP) {
		copy(b[i.off[HdrCNP]:], f.CNPReserved[:])
	}
	return dst, nil
}

// AppendTrailer appends the zero pad that follows an n-byte payload and a zero ICRC.
func AppendTrailer(dst []byte, n int) []byte {
	dst, b := grow(dst, PadLen(n)+ICRCLen)
	clear(b)
	return dst
}
