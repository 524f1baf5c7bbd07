package iblayer

import (
	"fmt"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/goroce/goroce/wire"
)

// extBase is what every extension header layer shares: its bytes, the bytes after it up to the end of the
// message payload, and the layer that follows it, which only the BTH's opcode determines.
type extBase struct {
	layers.BaseLayer
	next gopacket.LayerType
}

// NextLayerType returns the layer of the next extension header or the payload.
func (e *extBase) NextLayerType() gopacket.LayerType {
	if e.next == gopacket.LayerTypeZero {
		return gopacket.LayerTypePayload
	}
	return e.next
}

func (e *extBase) setNext(t gopacket.LayerType) { e.next = t }

// split takes the first n bytes of data as the header.
func (e *extBase) split(data []byte, h wire.Header) error {
	n := h.Len()
	if len(data) < n {
		return fmt.Errorf("iblayer: %v needs %d bytes, %d left: %w", h, n, len(data), wire.ErrTruncated)
	}
	e.BaseLayer = layers.BaseLayer{Contents: data[:n:n], Payload: data[n:]}
	e.next = gopacket.LayerTypePayload
	return nil
}

// prepend makes room for header h in front of what buf holds.
func prepend(buf gopacket.SerializeBuffer, h wire.Header) ([]byte, error) {
	return buf.PrependBytes(h.Len())
}

// ext is an extension header layer as decodeBTH builds it.
type ext interface {
	gopacket.DecodingLayer
	gopacket.Layer
	setNext(gopacket.LayerType)
}

// newExt decodes header h from the start of data and links it to the layer after it. It reports false
// when data is too short, which happens only in a truncated capture.
func newExt(h wire.Header, data []byte, next gopacket.LayerType) (gopacket.Layer, bool) {
	var l ext
	switch h {
	case wire.HdrDETH:
		l = &DETH{}
	case wire.HdrFETH:
		l = &FETH{}
	case wire.HdrRETH:
		l = &RETH{}
	case wire.HdrAtomicETH:
		l = &AtomicETH{}
	case wire.HdrAETH:
		l = &AETH{}
	case wire.HdrAtomicAck:
		l = &AtomicAckETH{}
	case wire.HdrImmDt:
		l = &ImmDt{}
	case wire.HdrIETH:
		l = &IETH{}
	case wire.HdrCNP:
		l = &CNP{}
	default:
		return nil, false
	}
	if l.DecodeFromBytes(data, gopacket.NilDecodeFeedback) != nil {
		return nil, false
	}
	l.setNext(next)
	return l, true
}

// decodeExt decodes one extension header on its own, for gopacket.NewPacket with an extension layer type
// as the first decoder.
func decodeExt[T any, PT interface {
	*T
	gopacket.DecodingLayer
	gopacket.Layer
}](data []byte, p gopacket.PacketBuilder) error {
	l := PT(new(T))
	if err := l.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(l)
	return p.NextDecoder(l.NextLayerType())
}

// RETH is the RDMA extended transport header layer: where an RDMA WRITE or READ goes in the responder's
// memory. IBTA Vol 1 9.3 (RETH).
type RETH struct {
	extBase
	wire.RETHFields
}

// LayerType returns LayerTypeRETH.
func (r *RETH) LayerType() gopacket.LayerType { return LayerTypeRETH }

// CanDecode returns LayerTypeRETH.
func (r *RETH) CanDecode() gopacket.LayerClass { return LayerTypeRETH }

// DecodeFromBytes decodes the header from the start of data.
func (r *RETH) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := r.split(data, wire.HdrRETH); err != nil {
		return err
	}
	r.RETHFields = wire.RETH(r.Contents).Fields()
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (r *RETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrRETH)
	if err == nil {
		wire.RETH(b).Encode(&r.RETHFields)
	}
	return err
}

// AETH is the ACK extended transport header layer: the syndrome (ACK, RNR NAK or NAK) and the
// responder's message sequence number. IBTA Vol 1 9.3 (AETH).
type AETH struct {
	extBase
	wire.AETHFields
}

// LayerType returns LayerTypeAETH.
func (a *AETH) LayerType() gopacket.LayerType { return LayerTypeAETH }

// CanDecode returns LayerTypeAETH.
func (a *AETH) CanDecode() gopacket.LayerClass { return LayerTypeAETH }

// DecodeFromBytes decodes the header from the start of data.
func (a *AETH) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := a.split(data, wire.HdrAETH); err != nil {
		return err
	}
	a.AETHFields = wire.AETH(a.Contents).Fields()
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (a *AETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrAETH)
	if err == nil {
		wire.AETH(b).Encode(&a.AETHFields)
	}
	return err
}

// AtomicETH is the atomic extended transport header layer of a compare-and-swap or fetch-and-add.
// IBTA Vol 1 9.3 (AtomicETH).
type AtomicETH struct {
	extBase
	wire.AtomicETHFields
}

// LayerType returns LayerTypeAtomicETH.
func (a *AtomicETH) LayerType() gopacket.LayerType { return LayerTypeAtomicETH }

// CanDecode returns LayerTypeAtomicETH.
func (a *AtomicETH) CanDecode() gopacket.LayerClass { return LayerTypeAtomicETH }

// DecodeFromBytes decodes the header from the start of data.
func (a *AtomicETH) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := a.split(data, wire.HdrAtomicETH); err != nil {
		return err
	}
	a.AtomicETHFields = wire.AtomicETH(a.Contents).Fields()
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (a *AtomicETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrAtomicETH)
	if err == nil {
		wire.AtomicETH(b).Encode(&a.AtomicETHFields)
	}
	return err
}

// AtomicAckETH is the atomic acknowledge extended transport header layer: the value the target held
// before the atomic. IBTA Vol 1 9.3 (AtomicAckETH).
type AtomicAckETH struct {
	extBase
	OrigData uint64
}

// LayerType returns LayerTypeAtomicAckETH.
func (a *AtomicAckETH) LayerType() gopacket.LayerType { return LayerTypeAtomicAckETH }

// CanDecode returns LayerTypeAtomicAckETH.
func (a *AtomicAckETH) CanDecode() gopacket.LayerClass { return LayerTypeAtomicAckETH }

// DecodeFromBytes decodes the header from the start of data.
func (a *AtomicAckETH) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := a.split(data, wire.HdrAtomicAck); err != nil {
		return err
	}
	a.OrigData = wire.AtomicAckETH(a.Contents).OrigData()
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (a *AtomicAckETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrAtomicAck)
	if err == nil {
		wire.AtomicAckETH(b).SetOrigData(a.OrigData)
	}
	return err
}

// ImmDt is the immediate data layer: 4 bytes the sender hands to the receiver's completion.
// IBTA Vol 1 9.3 (ImmDt).
type ImmDt struct {
	extBase
	Imm uint32
}

// LayerType returns LayerTypeImmDt.
func (i *ImmDt) LayerType() gopacket.LayerType { return LayerTypeImmDt }

// CanDecode returns LayerTypeImmDt.
func (i *ImmDt) CanDecode() gopacket.LayerClass { return LayerTypeImmDt }

// DecodeFromBytes decodes the header from the start of data.
func (i *ImmDt) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := i.split(data, wire.HdrImmDt); err != nil {
		return err
	}
	i.Imm = wire.ImmDt(i.Contents).Imm()
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (i *ImmDt) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrImmDt)
	if err == nil {
		wire.ImmDt(b).SetImm(i.Imm)
	}
	return err
}

// IETH is the invalidate extended transport header layer of a SEND_WITH_INVALIDATE: the rkey the
// responder invalidates. IBTA Vol 1 9.3 (IETH).
type IETH struct {
	extBase
	RKey wire.RKey
}

// LayerType returns LayerTypeIETH.
func (i *IETH) LayerType() gopacket.LayerType { return LayerTypeIETH }

// CanDecode returns LayerTypeIETH.
func (i *IETH) CanDecode() gopacket.LayerClass { return LayerTypeIETH }

// DecodeFromBytes decodes the header from the start of data.
func (i *IETH) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := i.split(data, wire.HdrIETH); err != nil {
		return err
	}
	i.RKey = wire.IETH(i.Contents).RKey()
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (i *IETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrIETH)
	if err == nil {
		wire.IETH(b).SetRKey(i.RKey)
	}
	return err
}

// DETH is the datagram extended transport header layer of a UD packet: the Q_Key and the sender's QP.
// IBTA Vol 1 9.3 (DETH).
type DETH struct {
	extBase
	wire.DETHFields
}

// LayerType returns LayerTypeDETH.
func (d *DETH) LayerType() gopacket.LayerType { return LayerTypeDETH }

// CanDecode returns LayerTypeDETH.
func (d *DETH) CanDecode() gopacket.LayerClass { return LayerTypeDETH }

// DecodeFromBytes decodes the header from the start of data.
func (d *DETH) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := d.split(data, wire.HdrDETH); err != nil {
		return err
	}
	d.DETHFields = wire.DETH(d.Contents).Fields()
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (d *DETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrDETH)
	if err == nil {
		wire.DETH(b).Encode(&d.DETHFields)
	}
	return err
}

// FETH is the flush extended transport header layer of a FLUSH: placement type and selectivity level.
// IBTA 1.5 Memory Placement Extensions.
type FETH struct {
	extBase
	Bits uint32 // the whole word; see PlacementType and SelectivityLevel
}

// LayerType returns LayerTypeFETH.
func (f *FETH) LayerType() gopacket.LayerType { return LayerTypeFETH }

// CanDecode returns LayerTypeFETH.
func (f *FETH) CanDecode() gopacket.LayerClass { return LayerTypeFETH }

// PlacementType returns the placement type (wire.FlushGlobal, wire.FlushPersistent).
func (f *FETH) PlacementType() uint8 { return uint8(f.Bits & 0xF) }

// SelectivityLevel returns the selectivity level (wire.FlushRange, wire.FlushMR).
func (f *FETH) SelectivityLevel() uint8 { return uint8(f.Bits>>4) & 0x3 }

// DecodeFromBytes decodes the header from the start of data.
func (f *FETH) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := f.split(data, wire.HdrFETH); err != nil {
		return err
	}
	f.Bits = wire.FETH(f.Contents).Bits()
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (f *FETH) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrFETH)
	if err == nil {
		wire.FETH(b).SetBits(f.Bits)
	}
	return err
}

// CNP is the body of a RoCEv2 congestion notification packet: 16 reserved bytes. The BTH's BECN bit
// and destination QP say which flow to slow down. IBTA Annex A17.9.3.
type CNP struct {
	extBase
	Reserved [wire.CNPLen]byte
}

// LayerType returns LayerTypeCNP.
func (c *CNP) LayerType() gopacket.LayerType { return LayerTypeCNP }

// CanDecode returns LayerTypeCNP.
func (c *CNP) CanDecode() gopacket.LayerClass { return LayerTypeCNP }

// DecodeFromBytes decodes the header from the start of data.
func (c *CNP) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	if err := c.split(data, wire.HdrCNP); err != nil {
		return err
	}
	copy(c.Reserved[:], c.Contents)
	return nil
}

// SerializeTo writes the header in front of what buf holds.
func (c *CNP) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := prepend(buf, wire.HdrCNP)
	if err == nil {
		copy(b, c.Reserved[:])
	}
	return err
}
