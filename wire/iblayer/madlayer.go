package iblayer

import (
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/goroce/goroce/wire/mad"
)

// MAD is the layer of a management datagram: the payload of a UD SEND to QP1, such as the RDMA CM's
// ConnectRequest. The BTH's decoder chooses it for those packets; Contents is the 256-byte MAD.
type MAD struct {
	layers.BaseLayer
	mad.HeaderFields
	// MAD is the validated datagram: MAD.REQ() and the other accessors give the CM messages, and
	// MAD.String() a one-line summary.
	MAD mad.MAD
}

// LayerType returns LayerTypeMAD.
func (m *MAD) LayerType() gopacket.LayerType { return LayerTypeMAD }

// CanDecode returns LayerTypeMAD.
func (m *MAD) CanDecode() gopacket.LayerClass { return LayerTypeMAD }

// NextLayerType returns gopacket.LayerTypeZero: nothing follows a MAD.
func (m *MAD) NextLayerType() gopacket.LayerType { return gopacket.LayerTypeZero }

// DecodeFromBytes decodes a MAD with mad.Parse; its errors are mad's.
func (m *MAD) DecodeFromBytes(data []byte, _ gopacket.DecodeFeedback) error {
	v, err := mad.Parse(data)
	if err != nil {
		return err
	}
	*m = MAD{BaseLayer: layers.BaseLayer{Contents: v}, HeaderFields: v.Header().Fields(), MAD: v}
	return nil
}

// SerializeTo writes the MAD's bytes in front of what buf holds. The fields are not re-encoded: MAD is a
// view, build a new one with mad.Header.Encode.
func (m *MAD) SerializeTo(buf gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	b, err := buf.PrependBytes(len(m.Contents))
	if err == nil {
		copy(b, m.Contents)
	}
	return err
}

func decodeMAD(data []byte, p gopacket.PacketBuilder) error {
	m := &MAD{}
	if err := m.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(m)
	return nil
}
