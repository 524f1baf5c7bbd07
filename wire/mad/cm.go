package mad

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/goroce/goroce/wire"
)

// The CM message views below cover the 232 data bytes after the MAD header; offsets are from the start
// of that data. IBTA Vol 1 12.6 (CM message formats); Linux include/rdma/ibta_vol1_c12.h. Their
// accessors do not check lengths: get them from a parsed MAD (MAD.REQ and friends), which is always whole.

// The pair of communication IDs most CM messages start with: the sender's and the receiver's.
const (
	cmLocalCommID  = 0
	cmRemoteCommID = 4
)

func be32(b []byte, off int) uint32 { return binary.BigEndian.Uint32(b[off:]) }
func be24(b []byte, off int) uint32 {
	return uint32(b[off])<<16 | uint32(b[off+1])<<8 | uint32(b[off+2])
}

// REQ is a view of a ConnectRequest: the active side asks to connect a QP to a service.
// IBTA Vol 1 12.6.5 (Table 106).
type REQ []byte

const (
	reqServiceID   = 8
	reqLocalCAGUID = 16
	reqLocalQKey   = 28
	reqLocalQPN    = 32 // 24 bits, then ResponderResources
	reqRespRes     = 35
	reqInitDepth   = 39
	reqTransport   = 43 // RemoteCMResponseTimeout(5) TransportServiceType(2) E2EFlowControl(1)
	reqStartingPSN = 44 // 24 bits, then LocalCMResponseTimeout(5) RetryCount(3)
	reqRetry       = 47
	reqPKey        = 48
	reqPathMTU     = 50 // PathMTU(4) RDCExists(1) RNRRetryCount(3)
	reqLocalLID    = 52
	reqRemoteLID   = 54
	reqLocalGID    = 56
	reqRemoteGID   = 72
	reqPrivateData = 140
	reqPrivateLen  = 92
)

// LocalCommID returns the active side's communication ID, which every later message of the connection
// carries.
func (r REQ) LocalCommID() uint32 { return be32(r, cmLocalCommID) }

// ServiceID returns the service the request is for. rdma_cm encodes (port space << 16) + port: rping's
// default, RDMA_PS_TCP port 7174, is 0x0000000001061c06.
func (r REQ) ServiceID() uint64 { return binary.BigEndian.Uint64(r[reqServiceID:]) }

// LocalCAGUID returns the active side's channel adapter GUID.
func (r REQ) LocalCAGUID() uint64 { return binary.BigEndian.Uint64(r[reqLocalCAGUID:]) }

// LocalQKey returns the active side's Q_Key (meaningful for RD only).
func (r REQ) LocalQKey() wire.QKey { return wire.QKey(be32(r, reqLocalQKey)) }

// LocalQPN returns the QP the active side connects: the destination QP of the passive side's packets.
func (r REQ) LocalQPN() wire.QPN { return wire.QPN(be24(r, reqLocalQPN)) }

// ResponderResources returns how many RDMA READs and atomics the active side accepts in flight.
func (r REQ) ResponderResources() uint8 { return r[reqRespRes] }

// InitiatorDepth returns how many RDMA READs and atomics the active side issues in flight.
func (r REQ) InitiatorDepth() uint8 { return r[reqInitDepth] }

// TransportServiceType returns the QP type asked for: 0 RC, 1 UC, 2 RD.
func (r REQ) TransportServiceType() uint8 { return r[reqTransport] >> 1 & 0x3 }

// StartingPSN returns the first PSN the active side will send.
func (r REQ) StartingPSN() wire.PSN { return wire.PSN(be24(r, reqStartingPSN)) }

// RetryCount returns the transport retry count the active side asks for.
func (r REQ) RetryCount() uint8 { return r[reqRetry] & 0x7 }

// PKey returns the partition key.
func (r REQ) PKey() wire.PKey { return wire.PKey(binary.BigEndian.Uint16(r[reqPKey:])) }

// PathMTU returns the path MTU the connection will use.
func (r REQ) PathMTU() wire.MTU { return wire.MTU(r[reqPathMTU] >> 4) }

// RNRRetryCount returns the RNR retry count the active side asks for; 7 means retry forever.
func (r REQ) RNRRetryCount() uint8 { return r[reqPathMTU] & 0x7 }

// LocalGID returns the primary path's GID of the active side; on RoCEv2 over IPv4 an IPv4-mapped address.
func (r REQ) LocalGID() netip.Addr { return netip.AddrFrom16([16]byte(r[reqLocalGID:])) }

// RemoteGID returns the primary path's GID of the passive side.
func (r REQ) RemoteGID() netip.Addr { return netip.AddrFrom16([16]byte(r[reqRemoteGID:])) }

// PrivateData returns the 92 bytes of private data; rdma_cm puts its 36-byte CMA header first.
func (r REQ) PrivateData() []byte { return r[reqPrivateData : reqPrivateData+reqPrivateLen] }

// REP is a view of a ConnectReply: the passive side accepts and names its QP. IBTA Vol 1 12.6.8 (Table 110).
type REP []byte

const (
	repLocalQKey   = 8
	repLocalQPN    = 12
	repStartingPSN = 20
	repRespRes     = 24
	repInitDepth   = 25
	repRNRRetry    = 27
	repLocalCAGUID = 28
	repPrivateData = 36
	repPrivateLen  = 196
)

// LocalCommID returns the passive side's communication ID.
func (r REP) LocalCommID() uint32 { return be32(r, cmLocalCommID) }

// RemoteCommID returns the active side's communication ID, from its REQ.
func (r REP) RemoteCommID() uint32 { return be32(r, cmRemoteCommID) }

// LocalQKey returns the passive side's Q_Key (meaningful for RD only).
func (r REP) LocalQKey() wire.QKey { return wire.QKey(be32(r, repLocalQKey)) }

// LocalQPN returns the passive side's QP: the destination QP of the active side's packets.
func (r REP) LocalQPN() wire.QPN { return wire.QPN(be24(r, repLocalQPN)) }

// StartingPSN returns the first PSN the passive side will send.
func (r REP) StartingPSN() wire.PSN { return wire.PSN(be24(r, repStartingPSN)) }

// ResponderResources returns how many RDMA READs and atomics the passive side accepts in flight.
func (r REP) ResponderResources() uint8 { return r[repRespRes] }

// InitiatorDepth returns how many RDMA READs and atomics the passive side issues in flight.
func (r REP) InitiatorDepth() uint8 { return r[repInitDepth] }

// RNRRetryCount returns the RNR retry count the passive side asks for.
func (r REP) RNRRetryCount() uint8 { return r[repRNRRetry] >> 5 }

// LocalCAGUID returns the passive side's channel adapter GUID.
func (r REP) LocalCAGUID() uint64 { return binary.BigEndian.Uint64(r[repLocalCAGUID:]) }

// PrivateData returns the 196 bytes of private data.
func (r REP) PrivateData() []byte { return r[repPrivateData : repPrivateData+repPrivateLen] }

// Comm is a view of a CM message that carries only the two communication IDs and private data:
// ReadyToUse, DisconnectReply (and the start of every connected-mode message). IBTA Vol 1 12.6.9, 12.6.11.
type Comm []byte

// LocalCommID returns the sender's communication ID.
func (c Comm) LocalCommID() uint32 { return be32(c, cmLocalCommID) }

// RemoteCommID returns the receiver's communication ID.
func (c Comm) RemoteCommID() uint32 { return be32(c, cmRemoteCommID) }

// DREQ is a view of a DisconnectRequest. IBTA Vol 1 12.6.10.
type DREQ []byte

const dreqRemoteQPN = 8

// LocalCommID returns the sender's communication ID.
func (d DREQ) LocalCommID() uint32 { return be32(d, cmLocalCommID) }

// RemoteCommID returns the receiver's communication ID.
func (d DREQ) RemoteCommID() uint32 { return be32(d, cmRemoteCommID) }

// RemoteQPN returns the receiver's QP the disconnect is for.
func (d DREQ) RemoteQPN() wire.QPN { return wire.QPN(be24(d, dreqRemoteQPN)) }

// REJ is a view of a ConnectReject. IBTA Vol 1 12.6.7 (Table 108).
type REJ []byte

const (
	rejMessageRejected = 8  // top 2 bits
	rejInfoLen         = 9  // top 7 bits
	rejReason          = 10 // 16 bits
	rejARI             = 12
	rejARILen          = 72
)

// LocalCommID returns the sender's communication ID.
func (r REJ) LocalCommID() uint32 { return be32(r, cmLocalCommID) }

// RemoteCommID returns the receiver's communication ID.
func (r REJ) RemoteCommID() uint32 { return be32(r, cmRemoteCommID) }

// MessageRejected returns which message is rejected: 0 REQ, 1 REP, 2 neither (a timeout on an MRA'd
// message).
func (r REJ) MessageRejected() uint8 { return r[rejMessageRejected] >> 6 }

// Reason returns why.
func (r REJ) Reason() RejectReason { return RejectReason(binary.BigEndian.Uint16(r[rejReason:])) }

// ARI returns the additional reject information, as long as its length field says (at most 72 bytes).
func (r REJ) ARI() []byte {
	n := min(int(r[rejInfoLen]>>1), rejARILen)
	return r[rejARI : rejARI+n]
}

// MRA is a view of a message receipt acknowledgement: "got it, answer comes later". IBTA Vol 1 12.6.6.
type MRA []byte

// LocalCommID returns the sender's communication ID.
func (m MRA) LocalCommID() uint32 { return be32(m, cmLocalCommID) }

// RemoteCommID returns the receiver's communication ID.
func (m MRA) RemoteCommID() uint32 { return be32(m, cmRemoteCommID) }

// MessageMRAed returns which message is acknowledged: 0 REQ, 1 REP, 2 LAP.
func (m MRA) MessageMRAed() uint8 { return m[8] >> 6 }

// ServiceTimeout returns the 5-bit timeout code the receiver should wait: 4.096 µs × 2^code.
func (m MRA) ServiceTimeout() uint8 { return m[9] >> 3 }

// SIDRReq is a view of a SIDR_REQ: a UD client asks which QP serves a service ID. IBTA Vol 1 12.11.1.
type SIDRReq []byte

// RequestID returns the request ID the reply echoes.
func (s SIDRReq) RequestID() uint32 { return be32(s, 0) }

// ServiceID returns the service asked for.
func (s SIDRReq) ServiceID() uint64 { return binary.BigEndian.Uint64(s[8:]) }

// SIDRRep is a view of a SIDR_REP. IBTA Vol 1 12.11.2.
type SIDRRep []byte

// RequestID returns the request ID of the SIDR_REQ this answers.
func (s SIDRRep) RequestID() uint32 { return be32(s, 0) }

// Status returns the outcome: 0 the QP is valid, 1 no such service, 2 rejected, ...
func (s SIDRRep) Status() uint8 { return s[4] }

// QPN returns the QP that serves the service.
func (s SIDRRep) QPN() wire.QPN { return wire.QPN(be24(s, 8)) }

// ServiceID returns the service resolved.
func (s SIDRRep) ServiceID() uint64 { return binary.BigEndian.Uint64(s[12:]) }

// QKey returns the Q_Key to send to the QP with.
func (s SIDRRep) QKey() wire.QKey { return wire.QKey(be32(s, 20)) }

func (m MAD) cmData(a AttributeID) []byte {
	h := m.Header()
	if h.MgmtClass() != ClassCM || h.AttributeID() != a {
		return nil
	}
	return m.Data()
}

// REQ returns the ConnectRequest the MAD carries, or nil.
func (m MAD) REQ() REQ { return REQ(m.cmData(AttrConnectRequest)) }

// REP returns the ConnectReply the MAD carries, or nil.
func (m MAD) REP() REP { return REP(m.cmData(AttrConnectReply)) }

// RTU returns the ReadyToUse the MAD carries, or nil.
func (m MAD) RTU() Comm { return Comm(m.cmData(AttrReadyToUse)) }

// DREQ returns the DisconnectRequest the MAD carries, or nil.
func (m MAD) DREQ() DREQ { return DREQ(m.cmData(AttrDisconnectRequest)) }

// DREP returns the DisconnectReply the MAD carries, or nil.
func (m MAD) DREP() Comm { return Comm(m.cmData(AttrDisconnectReply)) }

// REJ returns the ConnectReject the MAD carries, or nil.
func (m MAD) REJ() REJ { return REJ(m.cmData(AttrConnectReject)) }

// MRA returns the MRA the MAD carries, or nil.
func (m MAD) MRA() MRA { return MRA(m.cmData(AttrMRA)) }

// SIDRReq returns the SIDR_REQ the MAD carries, or nil.
func (m MAD) SIDRReq() SIDRReq { return SIDRReq(m.cmData(AttrSIDRRequest)) }

// SIDRRep returns the SIDR_REP the MAD carries, or nil.
func (m MAD) SIDRRep() SIDRRep { return SIDRRep(m.cmData(AttrSIDRReply)) }

// cmSummary formats the key fields of a CM message, or "" for attributes without any.
func (m MAD) cmSummary() string {
	d := m.Data()
	switch m.Header().AttributeID() {
	case AttrConnectRequest:
		r := REQ(d)
		return fmt.Sprintf("comm=%#08x qpn=%v psn=%v service=%#016x mtu=%v", r.LocalCommID(), r.LocalQPN(),
			r.StartingPSN(), r.ServiceID(), r.PathMTU())
	case AttrConnectReply:
		r := REP(d)
		return fmt.Sprintf("comm=%#08x remote-comm=%#08x qpn=%v psn=%v", r.LocalCommID(), r.RemoteCommID(),
			r.LocalQPN(), r.StartingPSN())
	case AttrDisconnectRequest:
		r := DREQ(d)
		return fmt.Sprintf("comm=%#08x remote-comm=%#08x remote-qpn=%v", r.LocalCommID(), r.RemoteCommID(),
			r.RemoteQPN())
	case AttrConnectReject:
		r := REJ(d)
		return fmt.Sprintf("comm=%#08x remote-comm=%#08x reason=%v rejected=%s", r.LocalCommID(),
			r.RemoteCommID(), r.Reason(), messageName(r.MessageRejected()))
	case AttrMRA:
		r := MRA(d)
		return fmt.Sprintf("comm=%#08x remote-comm=%#08x mraed=%s timeout=%d", r.LocalCommID(),
			r.RemoteCommID(), messageName(r.MessageMRAed()), r.ServiceTimeout())
	case AttrReadyToUse, AttrDisconnectReply, AttrLoadAlternatePath, AttrAlternatePathResp:
		r := Comm(d)
		return fmt.Sprintf("comm=%#08x remote-comm=%#08x", r.LocalCommID(), r.RemoteCommID())
	case AttrSIDRRequest:
		r := SIDRReq(d)
		return fmt.Sprintf("req=%#08x service=%#016x", r.RequestID(), r.ServiceID())
	case AttrSIDRReply:
		r := SIDRRep(d)
		return fmt.Sprintf("req=%#08x status=%d qpn=%v qkey=%#08x", r.RequestID(), r.Status(), r.QPN(),
			uint32(r.QKey()))
	}
	return ""
}

// messageName names the message a REJ rejects or an MRA acknowledges.
func messageName(v uint8) string {
	switch v {
	case 0:
		return "REQ"
	case 1:
		return "REP"
	case 2:
		return "other"
	}
	return "reserved"
}

// RejectReason is the reason code of a ConnectReject. IBTA Vol 1 12.6.7 (Table 109); Linux
// include/rdma/ib_cm.h (enum ib_cm_rej_reason).
type RejectReason uint16

// Reject reasons.
const (
	RejNoQP                     RejectReason = 1
	RejNoEEC                    RejectReason = 2
	RejNoResources              RejectReason = 3
	RejTimeout                  RejectReason = 4
	RejUnsupportedRequest       RejectReason = 5
	RejInvalidCommID            RejectReason = 6
	RejInvalidCommInstance      RejectReason = 7
	RejInvalidServiceID         RejectReason = 8
	RejInvalidTransportType     RejectReason = 9
	RejStaleConnection          RejectReason = 10
	RejRDCNotExist              RejectReason = 11
	RejInvalidGID               RejectReason = 12
	RejInvalidLID               RejectReason = 13
	RejInvalidSL                RejectReason = 14
	RejInvalidTrafficClass      RejectReason = 15
	RejInvalidHopLimit          RejectReason = 16
	RejInvalidPacketRate        RejectReason = 17
	RejInvalidAltGID            RejectReason = 18
	RejInvalidAltLID            RejectReason = 19
	RejInvalidAltSL             RejectReason = 20
	RejInvalidAltTrafficClass   RejectReason = 21
	RejInvalidAltHopLimit       RejectReason = 22
	RejInvalidAltPacketRate     RejectReason = 23
	RejPortCMRedirect           RejectReason = 24
	RejPortRedirect             RejectReason = 25
	RejInvalidMTU               RejectReason = 26
	RejInsufficientRespResource RejectReason = 27
	RejConsumerReject           RejectReason = 28
	RejInvalidRNRRetry          RejectReason = 29
	RejDuplicateLocalCommID     RejectReason = 30
	RejInvalidClassVersion      RejectReason = 31
	RejInvalidFlowLabel         RejectReason = 32
	RejInvalidAltFlowLabel      RejectReason = 33
)

var rejectNames = [...]string{
	RejNoQP:                     "no-qp",
	RejNoEEC:                    "no-eec",
	RejNoResources:              "no-resources",
	RejTimeout:                  "timeout",
	RejUnsupportedRequest:       "unsupported-request",
	RejInvalidCommID:            "invalid-comm-id",
	RejInvalidCommInstance:      "invalid-comm-instance",
	RejInvalidServiceID:         "invalid-service-id",
	RejInvalidTransportType:     "invalid-transport-type",
	RejStaleConnection:          "stale-connection",
	RejRDCNotExist:              "rdc-not-exist",
	RejInvalidGID:               "invalid-gid",
	RejInvalidLID:               "invalid-lid",
	RejInvalidSL:                "invalid-sl",
	RejInvalidTrafficClass:      "invalid-traffic-class",
	RejInvalidHopLimit:          "invalid-hop-limit",
	RejInvalidPacketRate:        "invalid-packet-rate",
	RejInvalidAltGID:            "invalid-alt-gid",
	RejInvalidAltLID:            "invalid-alt-lid",
	RejInvalidAltSL:             "invalid-alt-sl",
	RejInvalidAltTrafficClass:   "invalid-alt-traffic-class",
	RejInvalidAltHopLimit:       "invalid-alt-hop-limit",
	RejInvalidAltPacketRate:     "invalid-alt-packet-rate",
	RejPortCMRedirect:           "port-cm-redirect",
	RejPortRedirect:             "port-redirect",
	RejInvalidMTU:               "invalid-mtu",
	RejInsufficientRespResource: "insufficient-resp-resources",
	RejConsumerReject:           "consumer-reject",
	RejInvalidRNRRetry:          "invalid-rnr-retry",
	RejDuplicateLocalCommID:     "duplicate-local-comm-id",
	RejInvalidClassVersion:      "invalid-class-version",
	RejInvalidFlowLabel:         "invalid-flow-label",
	RejInvalidAltFlowLabel:      "invalid-alt-flow-label",
}

func (r RejectReason) String() string {
	if int(r) < len(rejectNames) && rejectNames[r] != "" {
		return rejectNames[r] + "(" + strconv.Itoa(int(r)) + ")"
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}
