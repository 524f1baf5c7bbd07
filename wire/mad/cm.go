package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/goroce/goroce/wire"
)

// The CM message views below cover the 232 data bytes after the MAD header; offsets are from the start
// of that data. IBTA Vol 1 12.6 (CM message formats); Linux include/rdma/ibta_vol1_c12.h, whose
// CM_FIELD*_LOC macros give each field as (byte offset, bit offset from the most significant bit,
// width). Their accessors do not check lengths: get them from a parsed MAD (MAD.REQ and friends), which
// is always whole. cmfields.go holds the matching Fields structs, Encode and Append.

// CMClassVersion is the communication manager's management class version. IBTA Vol 1 12.6
// (IB_CM_CLASS_VERSION in Linux include/rdma/ib_cm.h).
const CMClassVersion = 2

// Sizes of the CM messages' variable parts: private data, REJ's additional reject information and
// SIDR_REP's additional information. IBTA Vol 1 12.6 (Tables 106-120); Linux include/rdma/ib_cm.h (enum
// ib_cm_data_size).
const (
	REQPrivateDataLen     = 92
	MRAPrivateDataLen     = 222
	REJPrivateDataLen     = 148
	REJARILen             = 72
	REPPrivateDataLen     = 196
	RTUPrivateDataLen     = 224
	DREQPrivateDataLen    = 220
	DREPPrivateDataLen    = 224
	SIDRReqPrivateDataLen = 216
	SIDRRepPrivateDataLen = 136
	SIDRRepInfoLen        = 72
)

// The pair of communication IDs most CM messages start with: the sender's and the receiver's.
const (
	cmLocalCommID  = 0
	cmRemoteCommID = 4
)

func be16(b []byte, off int) uint16 { return binary.BigEndian.Uint16(b[off:]) }
func be32(b []byte, off int) uint32 { return binary.BigEndian.Uint32(b[off:]) }
func be64(b []byte, off int) uint64 { return binary.BigEndian.Uint64(b[off:]) }
func be24(b []byte, off int) uint32 {
	return uint32(b[off])<<16 | uint32(b[off+1])<<8 | uint32(b[off+2])
}

// bits returns the width-bit field that starts shift bits below the top of b[off]: IBTA's Byte[Bit]
// notation, as IBA_FIELD_BLOC in Linux include/rdma/iba.h.
func bits(b []byte, off int, shift, width uint) uint8 {
	return b[off] >> (8 - shift - width) & (1<<width - 1)
}

func gid(b []byte, off int) netip.Addr { return netip.AddrFrom16([16]byte(b[off : off+16])) }

// TransportType is the QP type a REQ asks for: its Transport Service Type field. IBTA Vol 1 12.6.5
// (Table 106); Linux cm_req_get_qp_type.
type TransportType uint8

// Transport service types.
const (
	TransportRC TransportType = 0 // reliable connection
	TransportUC TransportType = 1 // unreliable connection
	TransportRD TransportType = 2 // reliable datagram (goroce has none)
	// TransportExtended says the REQ's Extended Transport Type field holds the type: 1 is XRC.
	TransportExtended TransportType = 3
)

func (t TransportType) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportExtended:
		return "extended"
	}
	return "TransportType(" + strconv.Itoa(int(t)) + ")"
}

// MessageType names the message a REJ rejects or an MRA acknowledges. IBTA Vol 1 12.6.6 (Table 107),
// 12.6.7 (Table 108); Linux enum cm_msg_response.
type MessageType uint8

// Message types.
const (
	MsgREQ   MessageType = 0
	MsgREP   MessageType = 1
	MsgOther MessageType = 2 // an MRA of a LAP; a REJ of nothing in particular (a timeout, a late message)
)

func (t MessageType) String() string {
	switch t {
	case MsgREQ:
		return "REQ"
	case MsgREP:
		return "REP"
	case MsgOther:
		return "other"
	}
	return "reserved"
}

// Path is one of the two paths a REQ describes, primary and alternate. IBTA Vol 1 12.6.5 (Table 106).
// On RoCE the GIDs carry the IP addresses (IPv4-mapped for IPv4), the LIDs are 0 or the permissive
// 0xFFFF, and traffic class and hop limit are the IP header's.
type Path struct {
	LocalLID        uint16     // sender's LID
	RemoteLID       uint16     // receiver's LID
	LocalGID        netip.Addr // sender's GID; the zero Addr encodes as ::, which decodes as ::
	RemoteGID       netip.Addr // receiver's GID
	FlowLabel       uint32     // 20 bits
	PacketRate      uint8      // 6 bits, IBTA Vol 1 table 225 (static rate)
	TrafficClass    uint8      // the GRH's (RoCEv2: the IP header's DSCP and ECN byte)
	HopLimit        uint8      // the GRH's (RoCEv2: TTL or hop limit)
	SL              uint8      // service level, 4 bits
	SubnetLocal     bool       // both ends on one subnet: hop limit 0 or 1
	LocalACKTimeout uint8      // 5 bits: the local ACK timeout the sender's QP uses, 4.096 us * 2^t
}

// Offsets within a REQ path of 44 bytes: at 52 for the primary path, at 96 for the alternate.
const (
	pathLocalLID   = 0
	pathRemoteLID  = 2
	pathLocalGID   = 4
	pathRemoteGID  = 20
	pathFlowLabel  = 36 // 20 bits, then 6 reserved
	pathRate       = 39 // low 6 bits
	pathTClass     = 40
	pathHopLimit   = 41
	pathSL         = 42 // SL(4) SubnetLocal(1) reserved(3)
	pathACKTimeout = 43 // LocalACKTimeout(5), then SAP supported (alternate only) and 2 reserved
	pathLen        = 44
)

func decodePath(b []byte) Path {
	return Path{
		LocalLID:        be16(b, pathLocalLID),
		RemoteLID:       be16(b, pathRemoteLID),
		LocalGID:        gid(b, pathLocalGID),
		RemoteGID:       gid(b, pathRemoteGID),
		FlowLabel:       be32(b, pathFlowLabel) >> 12,
		PacketRate:      b[pathRate] & 0x3f,
		TrafficClass:    b[pathTClass],
		HopLimit:        b[pathHopLimit],
		SL:              bits(b, pathSL, 0, 4),
		SubnetLocal:     bits(b, pathSL, 4, 1) == 1,
		LocalACKTimeout: bits(b, pathACKTimeout, 0, 5),
	}
}

// REQ is a view of a ConnectRequest: the active side asks to connect a QP to a service.
// IBTA Vol 1 12.6.5 (Table 106).
//
//	  0 LocalCommID            4 reserved
//	  8 ServiceID (64)
//	 16 LocalCAGUID (64)
//	 24 reserved               28 LocalQKey
//	 32 LocalQPN(24) ResponderResources(8)
//	 36 LocalEECN(24) InitiatorDepth(8)
//	 40 RemoteEECN(24) RemoteCMResponseTimeout(5) TransportServiceType(2) EndToEndFlowControl(1)
//	 44 StartingPSN(24) LocalCMResponseTimeout(5) RetryCount(3)
//	 48 PKey(16) PathMTU(4) RDCExists(1) RNRRetryCount(3) MaxCMRetries(4) SRQ(1) ExtendedTransportType(3)
//	 52 primary path (44 bytes)
//	 96 alternate path (44 bytes; SAPSupported is bit 5 of its last byte)
//	140 PrivateData (92)
type REQ []byte

const (
	reqServiceID   = 8
	reqLocalCAGUID = 16
	reqLocalQKey   = 28
	reqLocalQPN    = 32 // 24 bits, then ResponderResources
	reqRespRes     = 35
	reqLocalEECN   = 36 // 24 bits, then InitiatorDepth
	reqInitDepth   = 39
	reqRemoteEECN  = 40 // 24 bits
	reqTransport   = 43 // RemoteCMResponseTimeout(5) TransportServiceType(2) E2EFlowControl(1)
	reqStartingPSN = 44 // 24 bits, then LocalCMResponseTimeout(5) RetryCount(3)
	reqRetry       = 47
	reqPKey        = 48
	reqPathMTU     = 50 // PathMTU(4) RDCExists(1) RNRRetryCount(3)
	reqMaxRetries  = 51 // MaxCMRetries(4) SRQ(1) ExtendedTransportType(3)
	reqPrimary     = 52
	reqLocalGID    = reqPrimary + pathLocalGID
	reqRemoteGID   = reqPrimary + pathRemoteGID
	reqAlternate   = 96
	reqSAP         = reqAlternate + pathACKTimeout // bit 5
	reqPrivateData = 140
)

// LocalCommID returns the active side's communication ID, which every later message of the connection
// carries.
func (r REQ) LocalCommID() uint32 { return be32(r, cmLocalCommID) }

// ServiceID returns the service the request is for. rdma_cm encodes (port space << 16) + port: rping's
// default, RDMA_PS_TCP port 7174, is 0x0000000001061c06. See ServiceID and ParseServiceID.
func (r REQ) ServiceID() uint64 { return be64(r, reqServiceID) }

// LocalCAGUID returns the active side's channel adapter GUID.
func (r REQ) LocalCAGUID() uint64 { return be64(r, reqLocalCAGUID) }

// LocalQKey returns the active side's Q_Key (meaningful for RD only).
func (r REQ) LocalQKey() wire.QKey { return wire.QKey(be32(r, reqLocalQKey)) }

// LocalQPN returns the QP the active side connects: the destination QP of the passive side's packets.
func (r REQ) LocalQPN() wire.QPN { return wire.QPN(be24(r, reqLocalQPN)) }

// ResponderResources returns how many RDMA READs and atomics the active side accepts in flight: the
// most the passive side may issue (its initiator depth).
func (r REQ) ResponderResources() uint8 { return r[reqRespRes] }

// LocalEECN returns the active side's EE context (RD only).
func (r REQ) LocalEECN() uint32 { return be24(r, reqLocalEECN) }

// InitiatorDepth returns how many RDMA READs and atomics the active side issues in flight.
func (r REQ) InitiatorDepth() uint8 { return r[reqInitDepth] }

// RemoteEECN returns the passive side's EE context (RD only).
func (r REQ) RemoteEECN() uint32 { return be24(r, reqRemoteEECN) }

// RemoteCMResponseTimeout returns the 5-bit code of how long the active side expects the passive CM to
// take to answer the REQ: 4.096 us * 2^t (rdma_cm: 20, 4.3 s).
func (r REQ) RemoteCMResponseTimeout() uint8 { return bits(r, reqTransport, 0, 5) }

// TransportServiceType returns the QP type asked for: RC, UC, RD, or extended (see
// ExtendedTransportType).
func (r REQ) TransportServiceType() TransportType { return TransportType(bits(r, reqTransport, 5, 2)) }

// EndToEndFlowControl reports whether the active side's receive queue generates end-to-end credits.
func (r REQ) EndToEndFlowControl() bool { return bits(r, reqTransport, 7, 1) == 1 }

// StartingPSN returns the PSN the passive side's first packet carries: the active side's expected PSN
// (Linux gives it to the active QP's rq_psn and the passive QP's sq_psn; rping.pcap shows the passive
// side sending from the REQ's PSN).
func (r REQ) StartingPSN() wire.PSN { return wire.PSN(be24(r, reqStartingPSN)) }

// LocalCMResponseTimeout returns the 5-bit code of how long the active CM takes to answer a REP:
// the passive side's REP timeout, 4.096 us * 2^t.
func (r REQ) LocalCMResponseTimeout() uint8 { return bits(r, reqRetry, 0, 5) }

// RetryCount returns the transport retry count both QPs use.
func (r REQ) RetryCount() uint8 { return r[reqRetry] & 0x7 }

// PKey returns the partition key.
func (r REQ) PKey() wire.PKey { return wire.PKey(be16(r, reqPKey)) }

// PathMTU returns the path MTU the connection will use.
func (r REQ) PathMTU() wire.MTU { return wire.MTU(r[reqPathMTU] >> 4) }

// RDCExists reports whether an RD channel exists (RD only).
func (r REQ) RDCExists() bool { return bits(r, reqPathMTU, 4, 1) == 1 }

// RNRRetryCount returns the RNR retry count the passive side's QP uses; 7 means retry forever.
func (r REQ) RNRRetryCount() uint8 { return r[reqPathMTU] & 0x7 }

// MaxCMRetries returns how many times each side resends a CM message that gets no answer (rdma_cm: 15).
func (r REQ) MaxCMRetries() uint8 { return bits(r, reqMaxRetries, 0, 4) }

// SRQ reports whether the active side's QP takes its receives from a shared receive queue.
func (r REQ) SRQ() bool { return bits(r, reqMaxRetries, 4, 1) == 1 }

// ExtendedTransportType returns the transport type when TransportServiceType is TransportExtended
// (1: XRC).
func (r REQ) ExtendedTransportType() uint8 { return r[reqMaxRetries] & 0x7 }

// PrimaryPath returns the primary path.
func (r REQ) PrimaryPath() Path { return decodePath(r[reqPrimary : reqPrimary+pathLen]) }

// AlternatePath returns the alternate path; all zero when there is none (RoCE never has one).
func (r REQ) AlternatePath() Path { return decodePath(r[reqAlternate : reqAlternate+pathLen]) }

// SAPSupported reports whether the active side supports the Service Access Point extension.
func (r REQ) SAPSupported() bool { return bits(r, reqSAP, 5, 1) == 1 }

// LocalGID returns the primary path's GID of the active side; on RoCEv2 over IPv4 an IPv4-mapped address.
func (r REQ) LocalGID() netip.Addr { return gid(r, reqLocalGID) }

// RemoteGID returns the primary path's GID of the passive side.
func (r REQ) RemoteGID() netip.Addr { return gid(r, reqRemoteGID) }

// PrivateData returns the 92 bytes of private data; rdma_cm puts its 36-byte CMA header first.
func (r REQ) PrivateData() []byte { return r[reqPrivateData : reqPrivateData+REQPrivateDataLen] }

// REP is a view of a ConnectReply: the passive side accepts and names its QP. IBTA Vol 1 12.6.8 (Table 110).
//
//	 0 LocalCommID             4 RemoteCommID
//	 8 LocalQKey              12 LocalQPN(24) reserved(8)
//	16 LocalEECN(24) reserved 20 StartingPSN(24) reserved(8)
//	24 ResponderResources(8) InitiatorDepth(8) TargetACKDelay(5) FailoverAccepted(2) EndToEndFlowControl(1)
//	   RNRRetryCount(3) SRQ(1) reserved(4)
//	28 LocalCAGUID (64)
//	36 PrivateData (196)
type REP []byte

const (
	repLocalQKey   = 8
	repLocalQPN    = 12
	repLocalEECN   = 16
	repStartingPSN = 20
	repRespRes     = 24
	repInitDepth   = 25
	repAckDelay    = 26 // TargetACKDelay(5) FailoverAccepted(2) EndToEndFlowControl(1)
	repRNRRetry    = 27 // RNRRetryCount(3) SRQ(1) reserved(4)
	repLocalCAGUID = 28
	repPrivateData = 36
)

// LocalCommID returns the passive side's communication ID.
func (r REP) LocalCommID() uint32 { return be32(r, cmLocalCommID) }

// RemoteCommID returns the active side's communication ID, from its REQ.
func (r REP) RemoteCommID() uint32 { return be32(r, cmRemoteCommID) }

// LocalQKey returns the passive side's Q_Key (meaningful for RD only).
func (r REP) LocalQKey() wire.QKey { return wire.QKey(be32(r, repLocalQKey)) }

// LocalQPN returns the passive side's QP: the destination QP of the active side's packets.
func (r REP) LocalQPN() wire.QPN { return wire.QPN(be24(r, repLocalQPN)) }

// LocalEECN returns the passive side's EE context (RD only).
func (r REP) LocalEECN() uint32 { return be24(r, repLocalEECN) }

// StartingPSN returns the PSN the active side's first packet carries: the passive side's expected PSN.
func (r REP) StartingPSN() wire.PSN { return wire.PSN(be24(r, repStartingPSN)) }

// ResponderResources returns how many RDMA READs and atomics the passive side accepts in flight.
func (r REP) ResponderResources() uint8 { return r[repRespRes] }

// InitiatorDepth returns how many RDMA READs and atomics the passive side issues in flight.
func (r REP) InitiatorDepth() uint8 { return r[repInitDepth] }

// TargetACKDelay returns the 5-bit code of the passive side's CA ACK delay, which the active side adds
// into its QP's local ACK timeout (Linux cm_ack_timeout).
func (r REP) TargetACKDelay() uint8 { return bits(r, repAckDelay, 0, 5) }

// FailoverAccepted returns the answer to an alternate path: 0 accepted, 1 rejected, 2 unsupported.
func (r REP) FailoverAccepted() uint8 { return bits(r, repAckDelay, 5, 2) }

// EndToEndFlowControl reports whether the passive side's receive queue generates end-to-end credits.
func (r REP) EndToEndFlowControl() bool { return bits(r, repAckDelay, 7, 1) == 1 }

// RNRRetryCount returns the RNR retry count the passive side asks the active QP to use.
func (r REP) RNRRetryCount() uint8 { return r[repRNRRetry] >> 5 }

// SRQ reports whether the passive side's QP takes its receives from a shared receive queue.
func (r REP) SRQ() bool { return bits(r, repRNRRetry, 3, 1) == 1 }

// LocalCAGUID returns the passive side's channel adapter GUID.
func (r REP) LocalCAGUID() uint64 { return be64(r, repLocalCAGUID) }

// PrivateData returns the 196 bytes of private data.
func (r REP) PrivateData() []byte { return r[repPrivateData : repPrivateData+REPPrivateDataLen] }

// Comm is a view of a CM message that carries only the two communication IDs and private data:
// ReadyToUse, DisconnectReply (and the start of every connected-mode message). IBTA Vol 1 12.6.9
// (Table 111), 12.6.11 (Table 113).
//
//	0 LocalCommID  4 RemoteCommID  8 PrivateData (224)
type Comm []byte

const commPrivateData = 8

// LocalCommID returns the sender's communication ID.
func (c Comm) LocalCommID() uint32 { return be32(c, cmLocalCommID) }

// RemoteCommID returns the receiver's communication ID.
func (c Comm) RemoteCommID() uint32 { return be32(c, cmRemoteCommID) }

// PrivateData returns the 224 bytes of private data.
func (c Comm) PrivateData() []byte { return c[commPrivateData : commPrivateData+RTUPrivateDataLen] }

// DREQ is a view of a DisconnectRequest. IBTA Vol 1 12.6.10 (Table 112).
//
//	0 LocalCommID  4 RemoteCommID  8 RemoteQPN(24) reserved(8)  12 PrivateData (220)
type DREQ []byte

const (
	dreqRemoteQPN   = 8
	dreqPrivateData = 12
)

// LocalCommID returns the sender's communication ID.
func (d DREQ) LocalCommID() uint32 { return be32(d, cmLocalCommID) }

// RemoteCommID returns the receiver's communication ID.
func (d DREQ) RemoteCommID() uint32 { return be32(d, cmRemoteCommID) }

// RemoteQPN returns the receiver's QP the disconnect is for.
func (d DREQ) RemoteQPN() wire.QPN { return wire.QPN(be24(d, dreqRemoteQPN)) }

// PrivateData returns the 220 bytes of private data.
func (d DREQ) PrivateData() []byte { return d[dreqPrivateData : dreqPrivateData+DREQPrivateDataLen] }

// REJ is a view of a ConnectReject. IBTA Vol 1 12.6.7 (Table 108).
//
//	 0 LocalCommID  4 RemoteCommID
//	 8 MessageRejected(2) reserved(6) RejectedInfoLength(7) reserved(1) Reason(16)
//	12 ARI (72)
//	84 PrivateData (148)
type REJ []byte

const (
	rejMessageRejected = 8  // top 2 bits
	rejInfoLen         = 9  // top 7 bits
	rejReason          = 10 // 16 bits
	rejARI             = 12
	rejPrivateData     = 84
)

// LocalCommID returns the sender's communication ID; 0 when a passive side rejects a REQ before it
// assigned one (Linux cm_format_rej in IB_CM_REQ_RCVD).
func (r REJ) LocalCommID() uint32 { return be32(r, cmLocalCommID) }

// RemoteCommID returns the receiver's communication ID.
func (r REJ) RemoteCommID() uint32 { return be32(r, cmRemoteCommID) }

// MessageRejected returns which message is rejected: REQ, REP, or other (a timeout on an MRA'd
// message, a connection torn down).
func (r REJ) MessageRejected() MessageType { return MessageType(r[rejMessageRejected] >> 6) }

// RejectedInfoLength returns the length field of the additional reject information (0..127; only 72
// bytes exist).
func (r REJ) RejectedInfoLength() uint8 { return r[rejInfoLen] >> 1 }

// Reason returns why.
func (r REJ) Reason() RejectReason { return RejectReason(be16(r, rejReason)) }

// ARI returns the additional reject information, as long as its length field says (at most 72 bytes).
// Its meaning depends on the reason: the GUID of the CM that timed out for RejTimeout, the GID the
// sender would accept for RejInvalidGID (IBTA Vol 1 12.6.7, Table 109).
func (r REJ) ARI() []byte {
	n := min(int(r.RejectedInfoLength()), REJARILen)
	return r[rejARI : rejARI+n]
}

// PrivateData returns the 148 bytes of private data.
func (r REJ) PrivateData() []byte { return r[rejPrivateData : rejPrivateData+REJPrivateDataLen] }

// MRA is a view of a message receipt acknowledgement: "got it, answer comes later". IBTA Vol 1 12.6.6
// (Table 107).
//
//	0 LocalCommID  4 RemoteCommID  8 MessageMRAed(2) reserved(6) ServiceTimeout(5) reserved(3)
//	10 PrivateData (222)
type MRA []byte

const (
	mraMessage     = 8
	mraTimeout     = 9
	mraPrivateData = 10
)

// LocalCommID returns the sender's communication ID.
func (m MRA) LocalCommID() uint32 { return be32(m, cmLocalCommID) }

// RemoteCommID returns the receiver's communication ID.
func (m MRA) RemoteCommID() uint32 { return be32(m, cmRemoteCommID) }

// MessageMRAed returns which message is acknowledged: REQ, REP, or other (a LAP).
func (m MRA) MessageMRAed() MessageType { return MessageType(m[mraMessage] >> 6) }

// ServiceTimeout returns the 5-bit timeout code the receiver should wait: 4.096 µs × 2^code.
func (m MRA) ServiceTimeout() uint8 { return m[mraTimeout] >> 3 }

// PrivateData returns the 222 bytes of private data.
func (m MRA) PrivateData() []byte { return m[mraPrivateData : mraPrivateData+MRAPrivateDataLen] }

// SIDRReq is a view of a SIDR_REQ: a UD client asks which QP serves a service ID. IBTA Vol 1 12.11.1
// (Table 119).
//
//	0 RequestID  4 PKey(16) reserved(16)  8 ServiceID (64)  16 PrivateData (216)
type SIDRReq []byte

const (
	sidrReqPKey        = 4
	sidrReqServiceID   = 8
	sidrReqPrivateData = 16
)

// RequestID returns the request ID the reply echoes.
func (s SIDRReq) RequestID() uint32 { return be32(s, 0) }

// PKey returns the partition key of the UD QP the client will send from.
func (s SIDRReq) PKey() wire.PKey { return wire.PKey(be16(s, sidrReqPKey)) }

// ServiceID returns the service asked for.
func (s SIDRReq) ServiceID() uint64 { return be64(s, sidrReqServiceID) }

// PrivateData returns the 216 bytes of private data; rdma_cm puts its CMA header first.
func (s SIDRReq) PrivateData() []byte {
	return s[sidrReqPrivateData : sidrReqPrivateData+SIDRReqPrivateDataLen]
}

// SIDRStatus is the outcome a SIDR_REP reports. IBTA Vol 1 12.11.2 (Table 120); Linux enum
// ib_cm_sidr_status.
type SIDRStatus uint8

// SIDR statuses.
const (
	SIDRSuccess            SIDRStatus = 0 // the QP and Q_Key are valid
	SIDRUnsupported        SIDRStatus = 1 // no such service ID
	SIDRReject             SIDRStatus = 2 // the service refused
	SIDRNoQP               SIDRStatus = 3 // no QP available
	SIDRRedirect           SIDRStatus = 4 // ask elsewhere (the additional information says where)
	SIDRUnsupportedVersion SIDRStatus = 5 // the class version is not supported
)

var sidrStatusNames = [...]string{"success", "unsupported", "reject", "no-qp", "redirect", "unsupported-version"}

func (s SIDRStatus) String() string {
	if int(s) < len(sidrStatusNames) {
		return sidrStatusNames[s]
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// SIDRRep is a view of a SIDR_REP. IBTA Vol 1 12.11.2 (Table 120).
//
//	 0 RequestID  4 Status(8) AdditionalInfoLength(8) reserved(16)
//	 8 QPN(24) reserved(8)  12 ServiceID (64)  20 QKey
//	24 AdditionalInfo (72)  96 PrivateData (136)
type SIDRRep []byte

const (
	sidrRepStatus      = 4
	sidrRepInfoLen     = 5
	sidrRepQPN         = 8
	sidrRepServiceID   = 12
	sidrRepQKey        = 20
	sidrRepInfo        = 24
	sidrRepPrivateData = 96
)

// RequestID returns the request ID of the SIDR_REQ this answers.
func (s SIDRRep) RequestID() uint32 { return be32(s, 0) }

// Status returns the outcome.
func (s SIDRRep) Status() SIDRStatus { return SIDRStatus(s[sidrRepStatus]) }

// AdditionalInfoLength returns the length field of the additional information (only 72 bytes exist).
func (s SIDRRep) AdditionalInfoLength() uint8 { return s[sidrRepInfoLen] }

// QPN returns the QP that serves the service.
func (s SIDRRep) QPN() wire.QPN { return wire.QPN(be24(s, sidrRepQPN)) }

// ServiceID returns the service resolved.
func (s SIDRRep) ServiceID() uint64 { return be64(s, sidrRepServiceID) }

// QKey returns the Q_Key to send to the QP with.
func (s SIDRRep) QKey() wire.QKey { return wire.QKey(be32(s, sidrRepQKey)) }

// AdditionalInfo returns the additional information, as long as its length field says (at most 72
// bytes): the redirection for SIDRRedirect.
func (s SIDRRep) AdditionalInfo() []byte {
	n := min(int(s.AdditionalInfoLength()), SIDRRepInfoLen)
	return s[sidrRepInfo : sidrRepInfo+n]
}

// PrivateData returns the 136 bytes of private data.
func (s SIDRRep) PrivateData() []byte {
	return s[sidrRepPrivateData : sidrRepPrivateData+SIDRRepPrivateDataLen]
}

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
			r.RemoteCommID(), r.Reason(), r.MessageRejected())
	case AttrMRA:
		r := MRA(d)
		return fmt.Sprintf("comm=%#08x remote-comm=%#08x mraed=%s timeout=%d", r.LocalCommID(),
			r.RemoteCommID(), r.MessageMRAed(), r.ServiceTimeout())
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

// RejectReason is the reason code of a ConnectReject. IBTA Vol 1 12.6.7 (Table 109); Linux
// include/rdma/ib_cm.h (enum ib_cm_rej_reason).
type RejectReason uint16

// Reject reasons.
const (
	RejNoQP                     RejectReason = 1
	RejNoEEC                    RejectReason = 2
	RejNoResources              RejectReason = 3
	RejTimeout                  RejectReason = 4 // ARI: the GUID of the CA whose CM timed out
	RejUnsupportedRequest       RejectReason = 5
	RejInvalidCommID            RejectReason = 6
	RejInvalidCommInstance      RejectReason = 7
	RejInvalidServiceID         RejectReason = 8 // no one listens on the REQ's service ID
	RejInvalidTransportType     RejectReason = 9
	RejStaleConnection          RejectReason = 10
	RejRDCNotExist              RejectReason = 11
	RejInvalidGID               RejectReason = 12 // ARI: a GID the sender would accept
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
	RejConsumerReject           RejectReason = 28 // the application said no: rdma_reject
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

// Errors of ParseCM, besides Parse's. They match with errors.Is.
var (
	ErrNotCM            = errors.New("mad: not a communication manager Send")
	ErrCMClassVersion   = errors.New("mad: unsupported CM class version")
	ErrUnknownAttribute = errors.New("mad: unknown CM attribute")
)

// ParseCM validates a MAD as a CM message: Parse's checks, then management class CM with method Send
// (the only method chapter 12 uses), class version 2, and one of the attributes of IBTA Vol 1 12.6
// (Table 103: ConnectRequest through AlternatePathResponse). Every field of every CM message lies inside
// the 232 data bytes, so after it the message views need no further check. It never allocates and never
// panics.
func ParseCM(b []byte) (MAD, error) {
	m, err := Parse(b)
	if err != nil {
		return nil, err
	}
	h := m.Header()
	switch {
	case h.MgmtClass() != ClassCM || h.Method() != MethodSend:
		return nil, ErrNotCM
	case h.ClassVersion() != CMClassVersion:
		return nil, ErrCMClassVersion
	case h.AttributeID() < AttrConnectRequest || h.AttributeID() > AttrAlternatePathResp:
		return nil, ErrUnknownAttribute
	}
	return m, nil
}
