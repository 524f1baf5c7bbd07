package mad

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/goroce/goroce/wire"
)

// Building CM messages. Each message has a Fields struct holding every field of IBTA Vol 1 chapter 12's
// table for it; the view's Fields method decodes one and Encode writes one back into the 232 data bytes,
// zeroing the reserved bits and the private data past what the struct carries. AppendCM (or the struct's
// Append) writes a whole 256-byte MAD: the common header (base version 1, class CM, class version 2,
// method Send, the transaction ID, the attribute) and the message.
//
// Numeric fields wider than their place on the wire are cut to it, as wire's headers do; byte fields
// longer than theirs (private data, ARI, additional information) make Append fail with
// ErrFieldTooLong, since cutting them would lose data silently. A Fields struct that Fields returned
// refers to the bytes of the view for its byte fields; Encode copies them.

// ErrFieldTooLong is the error of an Append whose private data, ARI or additional information does not
// fit the message.
var ErrFieldTooLong = errors.New("mad: field longer than the CM message allows")

// Message is a CM message that AppendCM can build: one of the *XxxFields types of this package.
type Message interface {
	// Attribute returns the message's attribute ID.
	Attribute() AttributeID
	// encode writes the message into the 232 data bytes after the MAD header.
	encode(d []byte)
	// check reports ErrFieldTooLong for a byte field that does not fit.
	check() error
}

// AppendCM appends a whole CM MAD carrying m to dst, with transaction ID tid. It allocates only when
// dst lacks room for Len bytes. On error dst is returned unchanged.
func AppendCM(dst []byte, tid uint64, m Message) ([]byte, error) {
	if err := m.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, m.Attribute())
	m.encode(d)
	return dst, nil
}

// appendCM appends a MAD of attribute a with its header written and returns it and its data part for
// the message's Encode. The Fields types' Append methods call it directly rather than through
// AppendCM's interface, so that building a message from a Fields on the stack does not allocate.
func appendCM(dst []byte, tid uint64, a AttributeID) (out, data []byte) {
	l := len(dst)
	if cap(dst)-l < Len {
		nb := make([]byte, l, l+Len)
		copy(nb, dst)
		dst = nb
	}
	dst = dst[:l+Len]
	b := dst[l:]
	Header(b).Encode(&HeaderFields{BaseVersion: BaseVersion, MgmtClass: ClassCM, ClassVersion: CMClassVersion,
		Method: MethodSend, TransactionID: tid, AttributeID: a})
	return dst, b[HeaderLen:]
}

func put16(b []byte, off int, v uint16) { binary.BigEndian.PutUint16(b[off:], v) }
func put32(b []byte, off int, v uint32) { binary.BigEndian.PutUint32(b[off:], v) }
func put64(b []byte, off int, v uint64) { binary.BigEndian.PutUint64(b[off:], v) }
func put24(b []byte, off int, v uint32) {
	b[off], b[off+1], b[off+2] = byte(v>>16), byte(v>>8), byte(v)
}

// field places v, cut to width bits, shift bits below the top of a byte.
func field(v uint8, shift, width uint) byte {
	return (v & (1<<width - 1)) << (8 - shift - width)
}

func flag(v bool, shift uint) byte {
	if v {
		return 1 << (7 - shift)
	}
	return 0
}

func putGID(b []byte, off int, a netip.Addr) {
	g := a.As16()
	copy(b[off:off+16], g[:])
}

// putBytes copies p into the n bytes at off and zeroes the rest.
func putBytes(b []byte, off, n int, p []byte) {
	c := copy(b[off:off+n], p)
	clear(b[off+c : off+n])
}

func tooLong(p []byte, n int) error {
	if len(p) > n {
		return ErrFieldTooLong
	}
	return nil
}

func (p *Path) encode(b []byte) {
	put16(b, pathLocalLID, p.LocalLID)
	put16(b, pathRemoteLID, p.RemoteLID)
	putGID(b, pathLocalGID, p.LocalGID)
	putGID(b, pathRemoteGID, p.RemoteGID)
	put32(b, pathFlowLabel, p.FlowLabel<<12)
	b[pathRate] = p.PacketRate & 0x3f
	b[pathTClass] = p.TrafficClass
	b[pathHopLimit] = p.HopLimit
	b[pathSL] = field(p.SL, 0, 4) | flag(p.SubnetLocal, 4)
	b[pathACKTimeout] = field(p.LocalACKTimeout, 0, 5)
}

// REQFields holds every field of a ConnectRequest. IBTA Vol 1 12.6.5 (Table 106).
type REQFields struct {
	LocalCommID             uint32
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               wire.QKey
	LocalQPN                wire.QPN
	ResponderResources      uint8
	LocalEECN               uint32 // 24 bits
	InitiatorDepth          uint8
	RemoteEECN              uint32 // 24 bits
	RemoteCMResponseTimeout uint8  // 5 bits
	TransportServiceType    TransportType
	EndToEndFlowControl     bool
	StartingPSN             wire.PSN
	LocalCMResponseTimeout  uint8 // 5 bits
	RetryCount              uint8 // 3 bits
	PKey                    wire.PKey
	PathMTU                 wire.MTU // 4 bits
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransportType   uint8 // 3 bits
	Primary                 Path
	Alternate               Path
	SAPSupported            bool
	PrivateData             []byte // at most REQPrivateDataLen bytes
}

// Attribute returns AttrConnectRequest.
func (f *REQFields) Attribute() AttributeID { return AttrConnectRequest }

func (f *REQFields) check() error { return tooLong(f.PrivateData, REQPrivateDataLen) }

// Append appends a whole MAD carrying f; see AppendCM.
func (f *REQFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *REQFields) encode(d []byte) { REQ(d).Encode(f) }

// Encode writes all of f into r; private data past len(f.PrivateData) is zeroed, and private data
// longer than REQPrivateDataLen is cut.
func (r REQ) Encode(f *REQFields) {
	put32(r, cmLocalCommID, f.LocalCommID)
	put32(r, 4, 0)
	put64(r, reqServiceID, f.ServiceID)
	put64(r, reqLocalCAGUID, f.LocalCAGUID)
	put32(r, 24, 0)
	put32(r, reqLocalQKey, uint32(f.LocalQKey))
	put24(r, reqLocalQPN, uint32(f.LocalQPN))
	r[reqRespRes] = f.ResponderResources
	put24(r, reqLocalEECN, f.LocalEECN)
	r[reqInitDepth] = f.InitiatorDepth
	put24(r, reqRemoteEECN, f.RemoteEECN)
	r[reqTransport] = field(f.RemoteCMResponseTimeout, 0, 5) | field(uint8(f.TransportServiceType), 5, 2) |
		flag(f.EndToEndFlowControl, 7)
	put24(r, reqStartingPSN, uint32(f.StartingPSN))
	r[reqRetry] = field(f.LocalCMResponseTimeout, 0, 5) | field(f.RetryCount, 5, 3)
	put16(r, reqPKey, uint16(f.PKey))
	r[reqPathMTU] = field(uint8(f.PathMTU), 0, 4) | flag(f.RDCExists, 4) | field(f.RNRRetryCount, 5, 3)
	r[reqMaxRetries] = field(f.MaxCMRetries, 0, 4) | flag(f.SRQ, 4) | field(f.ExtendedTransportType, 5, 3)
	f.Primary.encode(r[reqPrimary : reqPrimary+pathLen])
	f.Alternate.encode(r[reqAlternate : reqAlternate+pathLen])
	r[reqSAP] |= flag(f.SAPSupported, 5)
	putBytes(r, reqPrivateData, REQPrivateDataLen, f.PrivateData)
}

// Fields decodes the whole message; PrivateData refers to r's bytes.
func (r REQ) Fields() REQFields {
	return REQFields{
		LocalCommID:             r.LocalCommID(),
		ServiceID:               r.ServiceID(),
		LocalCAGUID:             r.LocalCAGUID(),
		LocalQKey:               r.LocalQKey(),
		LocalQPN:                r.LocalQPN(),
		ResponderResources:      r.ResponderResources(),
		LocalEECN:               r.LocalEECN(),
		InitiatorDepth:          r.InitiatorDepth(),
		RemoteEECN:              r.RemoteEECN(),
		RemoteCMResponseTimeout: r.RemoteCMResponseTimeout(),
		TransportServiceType:    r.TransportServiceType(),
		EndToEndFlowControl:     r.EndToEndFlowControl(),
		StartingPSN:             r.StartingPSN(),
		LocalCMResponseTimeout:  r.LocalCMResponseTimeout(),
		RetryCount:              r.RetryCount(),
		PKey:                    r.PKey(),
		PathMTU:                 r.PathMTU(),
		RDCExists:               r.RDCExists(),
		RNRRetryCount:           r.RNRRetryCount(),
		MaxCMRetries:            r.MaxCMRetries(),
		SRQ:                     r.SRQ(),
		ExtendedTransportType:   r.ExtendedTransportType(),
		Primary:                 r.PrimaryPath(),
		Alternate:               r.AlternatePath(),
		SAPSupported:            r.SAPSupported(),
		PrivateData:             r.PrivateData(),
	}
}

// MRAFields holds every field of a message receipt acknowledgement. IBTA Vol 1 12.6.6 (Table 107).
type MRAFields struct {
	LocalCommID    uint32
	RemoteCommID   uint32
	MessageMRAed   MessageType // 2 bits
	ServiceTimeout uint8       // 5 bits
	PrivateData    []byte      // at most MRAPrivateDataLen bytes
}

// Attribute returns AttrMRA.
func (f *MRAFields) Attribute() AttributeID { return AttrMRA }

func (f *MRAFields) check() error { return tooLong(f.PrivateData, MRAPrivateDataLen) }

// Append appends a whole MAD carrying f; see AppendCM.
func (f *MRAFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *MRAFields) encode(d []byte) { MRA(d).Encode(f) }

// Encode writes all of f into m.
func (m MRA) Encode(f *MRAFields) {
	put32(m, cmLocalCommID, f.LocalCommID)
	put32(m, cmRemoteCommID, f.RemoteCommID)
	m[mraMessage] = field(uint8(f.MessageMRAed), 0, 2)
	m[mraTimeout] = field(f.ServiceTimeout, 0, 5)
	putBytes(m, mraPrivateData, MRAPrivateDataLen, f.PrivateData)
}

// Fields decodes the whole message; PrivateData refers to m's bytes.
func (m MRA) Fields() MRAFields {
	return MRAFields{LocalCommID: m.LocalCommID(), RemoteCommID: m.RemoteCommID(), MessageMRAed: m.MessageMRAed(),
		ServiceTimeout: m.ServiceTimeout(), PrivateData: m.PrivateData()}
}

// REJFields holds every field of a ConnectReject. IBTA Vol 1 12.6.7 (Table 108). The rejected info
// length on the wire is len(ARI).
type REJFields struct {
	LocalCommID     uint32
	RemoteCommID    uint32
	MessageRejected MessageType // 2 bits
	Reason          RejectReason
	ARI             []byte // at most REJARILen bytes
	PrivateData     []byte // at most REJPrivateDataLen bytes
}

// Attribute returns AttrConnectReject.
func (f *REJFields) Attribute() AttributeID { return AttrConnectReject }

func (f *REJFields) check() error {
	return errors.Join(tooLong(f.ARI, REJARILen), tooLong(f.PrivateData, REJPrivateDataLen))
}

// Append appends a whole MAD carrying f; see AppendCM.
func (f *REJFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *REJFields) encode(d []byte) { REJ(d).Encode(f) }

// Encode writes all of f into r.
func (r REJ) Encode(f *REJFields) {
	put32(r, cmLocalCommID, f.LocalCommID)
	put32(r, cmRemoteCommID, f.RemoteCommID)
	n := min(len(f.ARI), REJARILen)
	r[rejMessageRejected] = field(uint8(f.MessageRejected), 0, 2)
	r[rejInfoLen] = field(uint8(n), 0, 7)
	put16(r, rejReason, uint16(f.Reason))
	putBytes(r, rejARI, REJARILen, f.ARI)
	putBytes(r, rejPrivateData, REJPrivateDataLen, f.PrivateData)
}

// Fields decodes the whole message; ARI and PrivateData refer to r's bytes.
func (r REJ) Fields() REJFields {
	return REJFields{LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(),
		MessageRejected: r.MessageRejected(), Reason: r.Reason(), ARI: r.ARI(), PrivateData: r.PrivateData()}
}

// REPFields holds every field of a ConnectReply. IBTA Vol 1 12.6.8 (Table 110).
type REPFields struct {
	LocalCommID         uint32
	RemoteCommID        uint32
	LocalQKey           wire.QKey
	LocalQPN            wire.QPN
	LocalEECN           uint32 // 24 bits
	StartingPSN         wire.PSN
	ResponderResources  uint8
	InitiatorDepth      uint8
	TargetACKDelay      uint8 // 5 bits
	FailoverAccepted    uint8 // 2 bits
	EndToEndFlowControl bool
	RNRRetryCount       uint8 // 3 bits
	SRQ                 bool
	LocalCAGUID         uint64
	PrivateData         []byte // at most REPPrivateDataLen bytes
}

// Attribute returns AttrConnectReply.
func (f *REPFields) Attribute() AttributeID { return AttrConnectReply }

func (f *REPFields) check() error { return tooLong(f.PrivateData, REPPrivateDataLen) }

// Append appends a whole MAD carrying f; see AppendCM.
func (f *REPFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *REPFields) encode(d []byte) { REP(d).Encode(f) }

// Encode writes all of f into r.
func (r REP) Encode(f *REPFields) {
	put32(r, cmLocalCommID, f.LocalCommID)
	put32(r, cmRemoteCommID, f.RemoteCommID)
	put32(r, repLocalQKey, uint32(f.LocalQKey))
	put32(r, repLocalQPN, uint32(f.LocalQPN)<<8)
	put32(r, repLocalEECN, f.LocalEECN<<8)
	put32(r, repStartingPSN, uint32(f.StartingPSN)<<8)
	r[repRespRes] = f.ResponderResources
	r[repInitDepth] = f.InitiatorDepth
	r[repAckDelay] = field(f.TargetACKDelay, 0, 5) | field(f.FailoverAccepted, 5, 2) | flag(f.EndToEndFlowControl, 7)
	r[repRNRRetry] = field(f.RNRRetryCount, 0, 3) | flag(f.SRQ, 3)
	put64(r, repLocalCAGUID, f.LocalCAGUID)
	putBytes(r, repPrivateData, REPPrivateDataLen, f.PrivateData)
}

// Fields decodes the whole message; PrivateData refers to r's bytes.
func (r REP) Fields() REPFields {
	return REPFields{
		LocalCommID:         r.LocalCommID(),
		RemoteCommID:        r.RemoteCommID(),
		LocalQKey:           r.LocalQKey(),
		LocalQPN:            r.LocalQPN(),
		LocalEECN:           r.LocalEECN(),
		StartingPSN:         r.StartingPSN(),
		ResponderResources:  r.ResponderResources(),
		InitiatorDepth:      r.InitiatorDepth(),
		TargetACKDelay:      r.TargetACKDelay(),
		FailoverAccepted:    r.FailoverAccepted(),
		EndToEndFlowControl: r.EndToEndFlowControl(),
		RNRRetryCount:       r.RNRRetryCount(),
		SRQ:                 r.SRQ(),
		LocalCAGUID:         r.LocalCAGUID(),
		PrivateData:         r.PrivateData(),
	}
}

// CommFields holds the fields of the messages that carry only the communication IDs and private data.
type CommFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  []byte // at most RTUPrivateDataLen (DREPPrivateDataLen) bytes
}

// Encode writes all of f into c.
func (c Comm) Encode(f *CommFields) {
	put32(c, cmLocalCommID, f.LocalCommID)
	put32(c, cmRemoteCommID, f.RemoteCommID)
	putBytes(c, commPrivateData, RTUPrivateDataLen, f.PrivateData)
}

// Fields decodes the whole message; PrivateData refers to c's bytes.
func (c Comm) Fields() CommFields {
	return CommFields{LocalCommID: c.LocalCommID(), RemoteCommID: c.RemoteCommID(), PrivateData: c.PrivateData()}
}

// RTUFields holds every field of a ReadyToUse. IBTA Vol 1 12.6.9 (Table 111).
type RTUFields CommFields

// Attribute returns AttrReadyToUse.
func (f *RTUFields) Attribute() AttributeID { return AttrReadyToUse }

func (f *RTUFields) check() error { return tooLong(f.PrivateData, RTUPrivateDataLen) }

// Append appends a whole MAD carrying f; see AppendCM.
func (f *RTUFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *RTUFields) encode(d []byte) { Comm(d).Encode((*CommFields)(f)) }

// DREPFields holds every field of a DisconnectReply. IBTA Vol 1 12.6.11 (Table 113).
type DREPFields CommFields

// Attribute returns AttrDisconnectReply.
func (f *DREPFields) Attribute() AttributeID { return AttrDisconnectReply }

func (f *DREPFields) check() error { return tooLong(f.PrivateData, DREPPrivateDataLen) }

// Append appends a whole MAD carrying f; see AppendCM.
func (f *DREPFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *DREPFields) encode(d []byte) { Comm(d).Encode((*CommFields)(f)) }

// DREQFields holds every field of a DisconnectRequest. IBTA Vol 1 12.6.10 (Table 112).
type DREQFields struct {
	LocalCommID  uint32
	RemoteCommID uint32
	RemoteQPN    wire.QPN
	PrivateData  []byte // at most DREQPrivateDataLen bytes
}

// Attribute returns AttrDisconnectRequest.
func (f *DREQFields) Attribute() AttributeID { return AttrDisconnectRequest }

func (f *DREQFields) check() error { return tooLong(f.PrivateData, DREQPrivateDataLen) }

// Append appends a whole MAD carrying f; see AppendCM.
func (f *DREQFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *DREQFields) encode(d []byte) { DREQ(d).Encode(f) }

// Encode writes all of f into d.
func (d DREQ) Encode(f *DREQFields) {
	put32(d, cmLocalCommID, f.LocalCommID)
	put32(d, cmRemoteCommID, f.RemoteCommID)
	put32(d, dreqRemoteQPN, uint32(f.RemoteQPN)<<8)
	putBytes(d, dreqPrivateData, DREQPrivateDataLen, f.PrivateData)
}

// Fields decodes the whole message; PrivateData refers to d's bytes.
func (d DREQ) Fields() DREQFields {
	return DREQFields{LocalCommID: d.LocalCommID(), RemoteCommID: d.RemoteCommID(), RemoteQPN: d.RemoteQPN(),
		PrivateData: d.PrivateData()}
}

// SIDRReqFields holds every field of a SIDR_REQ. IBTA Vol 1 12.11.1 (Table 119).
type SIDRReqFields struct {
	RequestID   uint32
	PKey        wire.PKey
	ServiceID   uint64
	PrivateData []byte // at most SIDRReqPrivateDataLen bytes
}

// Attribute returns AttrSIDRRequest.
func (f *SIDRReqFields) Attribute() AttributeID { return AttrSIDRRequest }

func (f *SIDRReqFields) check() error { return tooLong(f.PrivateData, SIDRReqPrivateDataLen) }

// Append appends a whole MAD carrying f; see AppendCM.
func (f *SIDRReqFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *SIDRReqFields) encode(d []byte) { SIDRReq(d).Encode(f) }

// Encode writes all of f into s.
func (s SIDRReq) Encode(f *SIDRReqFields) {
	put32(s, 0, f.RequestID)
	put32(s, sidrReqPKey, uint32(f.PKey)<<16)
	put64(s, sidrReqServiceID, f.ServiceID)
	putBytes(s, sidrReqPrivateData, SIDRReqPrivateDataLen, f.PrivateData)
}

// Fields decodes the whole message; PrivateData refers to s's bytes.
func (s SIDRReq) Fields() SIDRReqFields {
	return SIDRReqFields{RequestID: s.RequestID(), PKey: s.PKey(), ServiceID: s.ServiceID(),
		PrivateData: s.PrivateData()}
}

// SIDRRepFields holds every field of a SIDR_REP. IBTA Vol 1 12.11.2 (Table 120). The additional
// information length on the wire is len(AdditionalInfo).
type SIDRRepFields struct {
	RequestID      uint32
	Status         SIDRStatus
	QPN            wire.QPN
	ServiceID      uint64
	QKey           wire.QKey
	AdditionalInfo []byte // at most SIDRRepInfoLen bytes
	PrivateData    []byte // at most SIDRRepPrivateDataLen bytes
}

// Attribute returns AttrSIDRReply.
func (f *SIDRRepFields) Attribute() AttributeID { return AttrSIDRReply }

func (f *SIDRRepFields) check() error {
	return errors.Join(tooLong(f.AdditionalInfo, SIDRRepInfoLen), tooLong(f.PrivateData, SIDRRepPrivateDataLen))
}

// Append appends a whole MAD carrying f; see AppendCM.
func (f *SIDRRepFields) Append(dst []byte, tid uint64) ([]byte, error) {
	if err := f.check(); err != nil {
		return dst, err
	}
	dst, d := appendCM(dst, tid, f.Attribute())
	f.encode(d)
	return dst, nil
}

func (f *SIDRRepFields) encode(d []byte) { SIDRRep(d).Encode(f) }

// Encode writes all of f into s.
func (s SIDRRep) Encode(f *SIDRRepFields) {
	put32(s, 0, f.RequestID)
	s[sidrRepStatus] = byte(f.Status)
	s[sidrRepInfoLen] = byte(min(len(f.AdditionalInfo), SIDRRepInfoLen))
	put16(s, 6, 0)
	put32(s, sidrRepQPN, uint32(f.QPN)<<8)
	put64(s, sidrRepServiceID, f.ServiceID)
	put32(s, sidrRepQKey, uint32(f.QKey))
	putBytes(s, sidrRepInfo, SIDRRepInfoLen, f.AdditionalInfo)
	putBytes(s, sidrRepPrivateData, SIDRRepPrivateDataLen, f.PrivateData)
}

// Fields decodes the whole message; AdditionalInfo and PrivateData refer to s's bytes.
func (s SIDRRep) Fields() SIDRRepFields {
	return SIDRRepFields{RequestID: s.RequestID(), Status: s.Status(), QPN: s.QPN(), ServiceID: s.ServiceID(),
		QKey: s.QKey(), AdditionalInfo: s.AdditionalInfo(), PrivateData: s.PrivateData()}
}
