// Package iblayer adapts goroce's RoCEv2 codec (package wire) to gopacket, so that gopacket-based tools
// decode the InfiniBand transport headers RoCEv2 carries in UDP to port 4791. wire itself never imports
// gopacket; this package is the edge where the two meet.
//
// Importing the package registers LayerTypeBTH on UDP port 4791 (layers.RegisterUDPPortLayerType), after
// which gopacket.NewPacket decodes a RoCEv2 frame into
//
//	Ethernet | IPv4 or IPv6 | UDP | BTH | extension headers | Payload
//
// BTH is the base transport header; its decoder validates the whole transport packet once with
// wire.Parse and then adds one layer per extension header the opcode carries, in wire order (DETH, FETH,
// RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, CNP), so a user asks for the header they care about:
//
//	if r, ok := pkt.Layer(iblayer.LayerTypeRETH).(*iblayer.RETH); ok { use(r.VA, r.RKey, r.DMALen) }
//
// The message payload (without pad and ICRC) follows as gopacket.Payload. The pad and the ICRC are
// trailer fields of the BTH layer; ComputeICRC and VerifyICRC check the ICRC against the packet's IP and
// UDP headers, and SetICRC fills it in after gopacket.SerializeLayers.
//
// A packet wire rejects decodes to a gopacket.DecodeFailure whose Error is wire's error, matchable with
// errors.Is against wire.ErrTruncated, wire.ErrBadOpcode and the other sentinels. A packet the capture
// cut short (the IP or UDP layer marked the packet truncated) is decoded as far as its bytes go instead:
// the BTH has Truncated set, and the extension headers that are wholly present follow.
//
// Every layer implements gopacket.DecodingLayer and gopacket.SerializableLayer. With a
// gopacket.DecodingLayerParser, add the BTH and the extension layers you need; the parser reports
// gopacket.UnsupportedLayerType for the others, and BTH.Packet gives every header anyway. An extension
// layer learns which layer follows it from the BTH's decoder, so alone (DecodeFromBytes only) it reports
// gopacket.LayerTypePayload as its next layer.
//
// # Layer type numbers
//
// gopacket reserves 0-999 for itself and suggests 1000-1999 for application layers. goroce uses
// 1470-1489 (after the RoCEv2 port, 4791, read backwards in part; chosen only to be memorable and unlikely
// to collide):
//
//	1470 BTH            1475 ImmDt          1480 MAD (a UD SEND to QP1 carrying a management datagram)
//	1471 RETH           1476 IETH           1481-1489 reserved for goroce
//	1472 AETH           1477 DETH
//	1473 AtomicETH      1478 FETH
//	1474 AtomicAckETH   1479 CNP
package iblayer

import (
	"encoding/binary"
	"fmt"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/goroce/goroce/wire"
)

// Layer type numbers; see the package documentation.
const LayerTypeNumberBase = 1470

// The layer types of the package, registered with gopacket at init.
var (
	LayerTypeBTH          = register(0, "BTH", decodeBTH)
	LayerTypeRETH         = register(1, "RETH", decodeExt[RETH])
	LayerTypeAETH         = register(2, "AETH", decodeExt[AETH])
	LayerTypeAtomicETH    = register(3, "AtomicETH", decodeExt[AtomicETH])
	LayerTypeAtomicAckETH = register(4, "AtomicAckETH", decodeExt[AtomicAckETH])
	LayerTypeImmDt        = register(5, "ImmDt", decodeExt[ImmDt])
	LayerTypeIETH         = register(6, "IETH", decodeExt[IETH])
	LayerTypeDETH         = register(7, "DETH", decodeExt[DETH])
	LayerTypeFETH         = register(8, "FETH", decodeExt[FETH])
	LayerTypeCNP          = register(9, "CNP", decodeExt[CNP])
	LayerTypeMAD          = register(10, "MAD", decodeMAD)
)

func register(n int, name string, dec func([]byte, gopacket.PacketBuilder) error) gopacket.LayerType {
	return gopacket.RegisterLayerType(LayerTypeNumberBase+n, gopacket.LayerTypeMetadata{
		Name:    name,
		Decoder: gopacket.DecodeFunc(dec),
	})
}

func init() {
	layers.RegisterUDPPortLayerType(wire.UDPPort, LayerTypeBTH)
}

// extLayerType maps wire's extension headers to their layer types.
var extLayerType = [...]*gopacket.LayerType{
	wire.HdrDETH:      &LayerTypeDETH,
	wire.HdrFETH:      &LayerTypeFETH,
	wire.HdrRETH:      &LayerTypeRETH,
	wire.HdrAtomicETH: &LayerTypeAtomicETH,
	wire.HdrAETH:      &LayerTypeAETH,
	wire.HdrAtomicAck: &LayerTypeAtomicAckETH,
	wire.HdrImmDt:     &LayerTypeImmDt,
	wire.HdrIETH:      &LayerTypeIETH,
	wire.HdrCNP:       &LayerTypeCNP,
}

// BTH is the base transport header layer, and the trailer (pad and ICRC) of the transport packet it
// starts. IBTA Vol 1 9.2 (BTH); IBTA Annex A17 (RoCEv2 ICRC).
//
// Contents is the 12 header bytes; Payload is everything after them up to the end of the message
// payload: the extension headers and the payload, not the pad and ICRC.
type BTH struct {
	layers.BaseLayer
	wire.BTHFields

	// Packet is the transport packet as wire.Parse validated it, BTH through ICRC: every extension header
	// is at hand through its views (Packet.RETH(), ...). It is the zero Packet, whose methods must not be
	// called, when Truncated is set.
	Packet wire.Packet
	// Truncated reports that the capture cut the packet short: the header fields and the extension
	// headers wholly present were decoded, Payload holds the bytes captured after them, and Pad and ICRC
	// are unknown.
	Truncated bool
	// Pad is the 0 to 3 pad bytes between the payload and the ICRC.
	Pad []byte
	// ICRC is the invariant CRC the packet carries, as a number (it travels little-endian).
	ICRC uint32

	next gopacket.LayerType
}

// LayerType returns LayerTypeBTH.
func (b *BTH) LayerType() gopacket.LayerType { return LayerTypeBTH }

// CanDecode returns LayerTypeBTH.
func (b *BTH) CanDecode() gopacket.LayerClass { return LayerTypeBTH }

// NextLayerType returns the layer of the first extension header, or gopacket.LayerTypePayload.
func (b *BTH) NextLayerType() gopacket.LayerType { return b.next }

// info returns the table entry of the packet's opcode.
func (b *BTH) info() *wire.OpInfo { return b.Opcode.Info() }

// DecodeFromBytes decodes a transport packet, BTH through ICRC, with wire.Parse; its errors are wire's.
// When df reports the packet truncated (the IP or UDP length exceeds the bytes captured), it decodes the
// header as far as it goes instead and sets Truncated.
func (b *BTH) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	*b = BTH{}
	if truncated(df) {
		return b.decodeTruncated(data)
	}
	p, err := wire.Parse(data)
	if err != nil {
		return err
	}
	info := p.Info()
	hl := int(info.HeaderLen)
	end := hl + p.PayloadLen()
	b.Contents = data[:wire.BTHLen:wire.BTHLen]
	b.Payload = data[wire.BTHLen:end:end]
	b.BTHFields = p.BTH().Fields()
	b.Packet = p
	b.Pad = data[end : len(data)-wire.ICRCLen : len(data)-wire.ICRCLen]
	b.ICRC = p.ICRC()
	b.next = firstLayer(info, 0)
	return nil
}

func (b *BTH) decodeTruncated(data []byte) error {
	if len(data) < wire.BTHLen {
		return fmt.Errorf("iblayer: truncated capture holds %d bytes of a BTH: %w", len(data), wire.ErrTruncated)
	}
	b.Truncated = true
	b.Contents = data[:wire.BTHLen:wire.BTHLen]
	b.Payload = data[wire.BTHLen:]
	b.BTHFields = wire.BTH(data).Fields()
	b.next = firstLayer(b.info(), 0)
	return nil
}

// truncated reports whether the packet being decoded is marked truncated by an earlier layer.
func truncated(df gopacket.DecodeFeedback) bool {
	m, ok := df.(interface {
		Metadata() *gopacket.PacketMetadata
	})
	return ok && m.Metadata().Truncated
}

// firstLayer returns the layer type of the first extension header of info at or after h, or Payload.
func firstLayer(info *wire.OpInfo, h wire.Header) gopacket.LayerType {
	if !info.Valid() {
		return gopacket.LayerTypePayload
	}
	for ; int(h) < len(extLayerType); h++ {
		if info.Headers.Has(h) {
			return *extLayerType[h]
		}
	}
	return gopacket.LayerTypePayload
}

// SerializeTo writes the BTH in front of what b holds (the extension headers and payload) and the pad
// and ICRC behind it. With opts.FixLengths the pad count is set from the payload length. The ICRC written
// is the ICRC field: it covers IP and UDP headers serialized later, so fill it in with SetICRC once the
// whole packet is built.
func (b *BTH) SerializeTo(buf gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	if opts.FixLengths {
		b.PadCnt = uint8(wire.PadLen(len(buf.Bytes())))
	}
	pad := int(b.PadCnt & 3)
	tail, err := buf.AppendBytes(pad + wire.ICRCLen)
	if err != nil {
		return err
	}
	clear(tail[:pad])
	if len(b.Pad) == pad {
		copy(tail, b.Pad)
	}
	binary.LittleEndian.PutUint32(tail[pad:], b.ICRC)
	h, err := buf.PrependBytes(wire.BTHLen)
	if err != nil {
		return err
	}
	wire.BTH(h).Encode(&b.BTHFields)
	return nil
}

// decodeBTH decodes the BTH, one layer per extension header, and the payload: a MAD for a UD SEND to
// QP1, gopacket.Payload otherwise.
func decodeBTH(data []byte, p gopacket.PacketBuilder) error {
	b := &BTH{}
	if err := b.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(b)
	info := b.info()
	rest := b.Payload
	for h := wire.Header(0); int(h) < len(extLayerType); h++ {
		if !info.Valid() || !info.Headers.Has(h) {
			continue
		}
		l, ok := newExt(h, rest, firstLayer(info, h+1))
		if !ok { // only when truncated: this header is cut short
			return nil
		}
		p.AddLayer(l)
		rest = l.LayerPayload()
	}
	if len(rest) == 0 {
		return nil
	}
	if b.DestQP == wire.QPNGSI && info.Transport == wire.TransportUD && !b.Truncated {
		return p.NextDecoder(LayerTypeMAD)
	}
	return p.NextDecoder(gopacket.LayerTypePayload)
}

// ComputeICRC returns the ICRC that pkt's RoCEv2 transport packet should carry, computed over its IP and
// UDP headers as wire.ComputeICRC does. Compare it with the BTH layer's ICRC field.
func ComputeICRC(pkt gopacket.Packet) (uint32, error) {
	ip, udp, b, err := icrcParts(pkt)
	if err != nil {
		return 0, err
	}
	tp := b.Packet.Bytes()
	return wire.ComputeICRC(ip, udp, tp[:len(tp)-wire.ICRCLen])
}

// VerifyICRC checks the ICRC of pkt's RoCEv2 transport packet; it returns wire.ErrICRC on a mismatch
// and wire.ErrTruncated when the capture does not hold the whole packet.
func VerifyICRC(pkt gopacket.Packet) error {
	ip, udp, b, err := icrcParts(pkt)
	if err != nil {
		return err
	}
	return wire.VerifyICRC(ip, udp, b.Packet.Bytes())
}

var (
	errNoBTH   = fmt.Errorf("iblayer: packet has no BTH layer: %w", wire.ErrTruncated)
	errNoIPUDP = fmt.Errorf("iblayer: packet has no IPv4 or IPv6 and UDP header before its BTH: %w", wire.ErrIPHeader)
	errIPv6Ext = fmt.Errorf("iblayer: IPv6 extension headers before UDP are not supported: %w", wire.ErrIPHeader)
	errTrunc   = fmt.Errorf("iblayer: truncated capture: the ICRC is not captured: %w", wire.ErrTruncated)
)

// icrcParts returns the IP header, UDP header and BTH layer the ICRC covers.
func icrcParts(pkt gopacket.Packet) (ip, udp []byte, b *BTH, err error) {
	b, ok := pkt.Layer(LayerTypeBTH).(*BTH)
	if !ok {
		return nil, nil, nil, errNoBTH
	}
	if b.Truncated {
		return nil, nil, nil, errTrunc
	}
	u, ok := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if !ok {
		return nil, nil, nil, errNoIPUDP
	}
	switch n := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		ip = n.Contents
	case *layers.IPv6:
		if n.NextHeader != layers.IPProtocolUDP {
			return nil, nil, nil, errIPv6Ext
		}
		ip = n.Contents
	default:
		return nil, nil, nil, errNoIPUDP
	}
	return ip, u.Contents, b, nil
}

var (
	errSetICRCShort = fmt.Errorf("iblayer: SetICRC: shorter than its IP and UDP headers: %w", wire.ErrTruncated)
	errSetICRCIP    = fmt.Errorf("iblayer: SetICRC: not an IPv4 or IPv6 packet with UDP: %w", wire.ErrIPHeader)
)

// SetICRC computes and stores the ICRC of a serialized RoCEv2 IP packet: ip runs from the IPv4 or IPv6
// header to the end of the ICRC. Call it on the IP part of gopacket.SerializeLayers' output. Serialize
// the UDP layer without a checksum, as RoCEv2 senders do: the ICRC changes bytes a UDP checksum covers.
func SetICRC(ip []byte) error {
	if len(ip) == 0 {
		return errSetICRCShort
	}
	var hl, end int
	switch ip[0] >> 4 {
	case 4:
		hl = int(ip[0]&0xF) * 4
		if len(ip) < 20 || hl < 20 || ip[9] != byte(layers.IPProtocolUDP) {
			return errSetICRCIP
		}
		end = int(binary.BigEndian.Uint16(ip[2:]))
	case 6:
		hl = 40
		if len(ip) < hl || ip[6] != byte(layers.IPProtocolUDP) {
			return errSetICRCIP
		}
		end = hl + int(binary.BigEndian.Uint16(ip[4:]))
	default:
		return errSetICRCIP
	}
	if end > len(ip) || end < hl+wire.UDPHeaderLen {
		return errSetICRCShort
	}
	return wire.SetICRC(ip[:hl], ip[hl:hl+wire.UDPHeaderLen], ip[hl+wire.UDPHeaderLen:end])
}
