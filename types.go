package goroce

import (
	"fmt"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// The types of the verbs API. They mirror libibverbs' structures and enumerations, with their values,
// under Go names; a program needs only this package. The engines (package qp) have types of their own,
// which the device converts to.

// Identifiers and keys on the wire. IBTA Vol 1 9.2 (BTH), 9.3 (RETH, DETH).
type (
	// QPN is a queue pair number: 24 bits.
	QPN = wire.QPN
	// PSN is a packet sequence number: 24 bits, compared modulo 2^24.
	PSN = wire.PSN
	// RKey is a memory region's remote key, which a peer names the region by in RDMA and atomics.
	RKey = wire.RKey
	// LKey is a memory region's local key, which scatter/gather elements name it by.
	LKey = wire.LKey
	// QKey is a UD queue pair's Q_Key: a datagram is taken only with the receiver's.
	QKey = wire.QKey
	// MTU is a path MTU as IBTA encodes it (enum ibv_mtu): MTU256 to MTU4096.
	MTU = wire.MTU
)

// Path MTUs. IBTA Vol 1 9.6.2; RoCEv2 uses up to 4096 bytes of payload per packet.
const (
	MTU256  = wire.MTU256
	MTU512  = wire.MTU512
	MTU1024 = wire.MTU1024
	MTU2048 = wire.MTU2048
	MTU4096 = wire.MTU4096
)

// MTUFromBytes returns the MTU of n bytes of payload (256, 512, 1024, 2048 or 4096), and false for
// any other n.
func MTUFromBytes(n int) (MTU, bool) { return wire.MTUFromBytes(n) }

// QPType is a queue pair's transport service, as enum ibv_qp_type. IBTA Vol 1 chapter 9.
type QPType uint8

// Queue pair types.
const (
	RC QPType = QPType(qp.RC) // reliable connection: acknowledged, retransmitted, in order
	UC QPType = QPType(qp.UC) // unreliable connection: SEND and WRITE, no acknowledgements
	UD QPType = QPType(qp.UD) // unreliable datagram: SENDs of at most one MTU to any UD QP
)

func (t QPType) String() string { return qp.Type(t).String() }

// QPState is a queue pair's state, as enum ibv_qp_state. IBTA Vol 1 10.3.1.
type QPState uint8

// Queue pair states.
const (
	StateReset QPState = QPState(qp.StateReset) // just created: no packets in or out
	StateInit  QPState = QPState(qp.StateInit)  // receives may be posted; no packets in or out
	StateRTR   QPState = QPState(qp.StateRTR)   // ready to receive: the responder runs
	StateRTS   QPState = QPState(qp.StateRTS)   // ready to send
	StateSQD   QPState = QPState(qp.StateSQD)   // send queue drain: no new send starts
	StateSQE   QPState = QPState(qp.StateSQE)   // send queue error (UC, UD): sends flushed
	StateErr   QPState = QPState(qp.StateErr)   // error: everything outstanding is flushed
)

func (s QPState) String() string { return qp.State(s).String() }

// Access is a memory region's or a queue pair's access rights, as enum ibv_access_flags.
type Access uint32

// Access rights.
const (
	LocalWrite   Access = Access(mr.LocalWrite)   // the device may write the region: receives, READ responses, atomics' results
	RemoteWrite  Access = Access(mr.RemoteWrite)  // a peer may RDMA WRITE it (needs LocalWrite)
	RemoteRead   Access = Access(mr.RemoteRead)   // a peer may RDMA READ it
	RemoteAtomic Access = Access(mr.RemoteAtomic) // a peer may run atomics on it (needs LocalWrite)
)

func (a Access) String() string { return mr.Access(a).String() }

// WROpcode is what a send work request asks for, as enum ibv_wr_opcode.
type WROpcode uint8

// Send work request opcodes. IBTA Vol 1 10.7.
const (
	WRRDMAWrite    WROpcode = WROpcode(qp.WRWrite)       // RDMA WRITE into the peer's memory
	WRRDMAWriteImm WROpcode = WROpcode(qp.WRWriteImm)    // RDMA WRITE with immediate: also completes a receive at the peer
	WRSend         WROpcode = WROpcode(qp.WRSend)        // SEND into the peer's next receive
	WRSendImm      WROpcode = WROpcode(qp.WRSendImm)     // SEND with immediate
	WRRDMARead     WROpcode = WROpcode(qp.WRRead)        // RDMA READ from the peer's memory
	WRCompareSwap  WROpcode = WROpcode(qp.WRCompareSwap) // 64-bit compare and swap on the peer's memory
	WRFetchAdd     WROpcode = WROpcode(qp.WRFetchAdd)    // 64-bit fetch and add on the peer's memory
	WRSendInv      WROpcode = WROpcode(qp.WRSendInv)     // SEND with invalidate: the peer invalidates InvalidateRKey

	// Deprecated: use WRRDMAWrite, as ibverbs names it (IBV_WR_RDMA_WRITE).
	WRWrite = WRRDMAWrite
	// Deprecated: use WRRDMAWriteImm.
	WRWriteImm = WRRDMAWriteImm
	// Deprecated: use WRRDMARead.
	WRRead = WRRDMARead
)

func (o WROpcode) String() string { return qp.WROpcode(o).String() }

// SendFlags modify a send work request, as enum ibv_send_flags.
type SendFlags uint8

// Send flags.
const (
	Fence     SendFlags = SendFlags(qp.Fence)     // wait for earlier READs and atomics to complete before starting
	Signaled  SendFlags = SendFlags(qp.Signaled)  // produce a completion on success (errors always complete)
	Solicited SendFlags = SendFlags(qp.Solicited) // ask the peer to notify a solicited-only waiter (BTH SE bit)
	Inline    SendFlags = SendFlags(qp.Inline)    // the data is InlineData, copied when posted; no region is involved
)

// Status is the outcome of a work request, as enum ibv_wc_status. Completion.Err turns it into a
// matchable error.
type Status uint8

// Completion statuses.
const (
	StatusSuccess        Status = Status(qp.StatusSuccess)
	StatusLocLenErr      Status = Status(qp.StatusLocLenErr)      // a receive buffer too small, or a response of the wrong length
	StatusLocQPOpErr     Status = Status(qp.StatusLocQPOpErr)     // an operation the QP cannot perform
	StatusLocProtErr     Status = Status(qp.StatusLocProtErr)     // a bad lkey, or a local buffer outside its region
	StatusWRFlushErr     Status = Status(qp.StatusWRFlushErr)     // flushed: the QP entered the error state
	StatusBadRespErr     Status = Status(qp.StatusBadRespErr)     // an unexpected response opcode
	StatusLocAccessErr   Status = Status(qp.StatusLocAccessErr)   // a local protection error found on the responder side
	StatusRemInvReqErr   Status = Status(qp.StatusRemInvReqErr)   // the peer NAKed: invalid request
	StatusRemAccessErr   Status = Status(qp.StatusRemAccessErr)   // the peer NAKed: remote access error
	StatusRemOpErr       Status = Status(qp.StatusRemOpErr)       // the peer NAKed: remote operational error
	StatusRetryExcErr    Status = Status(qp.StatusRetryExcErr)    // the transport retry counter ran out
	StatusRNRRetryExcErr Status = Status(qp.StatusRNRRetryExcErr) // the RNR retry counter ran out
	StatusRemAbortErr    Status = Status(qp.StatusRemAbortErr)
	StatusFatalErr       Status = Status(qp.StatusFatalErr)
	StatusGeneralErr     Status = Status(qp.StatusGeneralErr)
)

// String returns the text ibv_wc_status_str gives for s.
func (s Status) String() string { return qp.Status(s).String() }

// CompletionOpcode says what a completed work request did, as enum ibv_wc_opcode.
type CompletionOpcode uint8

// Completion opcodes.
const (
	CompSend            CompletionOpcode = CompletionOpcode(qp.CompSend)
	CompRDMAWrite       CompletionOpcode = CompletionOpcode(qp.CompRDMAWrite)
	CompRDMARead        CompletionOpcode = CompletionOpcode(qp.CompRDMARead)
	CompCompareSwap     CompletionOpcode = CompletionOpcode(qp.CompCompareSwap)
	CompFetchAdd        CompletionOpcode = CompletionOpcode(qp.CompFetchAdd)
	CompRecv            CompletionOpcode = CompletionOpcode(qp.CompRecv)            // a SEND arrived
	CompRecvRDMAWithImm CompletionOpcode = CompletionOpcode(qp.CompRecvRDMAWithImm) // a WRITE with immediate arrived
)

func (o CompletionOpcode) String() string { return qp.CompletionOpcode(o).String() }

// CompletionFlags qualify a completion, as enum ibv_wc_flags.
type CompletionFlags uint8

// Completion flags.
const (
	// WithGRH: a UD receive's buffer starts with the 40-byte GRH: the IPv6 header, or for IPv4 20 zero
	// bytes and then the IPv4 header (IBTA Annex A17.4.5.2, as rxe fills it).
	WithGRH CompletionFlags = CompletionFlags(qp.WithGRH)
	WithImm CompletionFlags = CompletionFlags(qp.WithImm) // Imm is valid
	WithInv CompletionFlags = CompletionFlags(qp.WithInv) // InvalidatedRKey is valid
)

// SGE is a scatter/gather element: Length bytes at Addr of the region whose local key is LKey. It
// mirrors struct ibv_sge; MR.SGE builds one.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   LKey
}

// AddressHandle says where a UD datagram goes, and with which IP header fields: the destination GID
// (an IPv6 address or an IPv4-mapped one) and the GRH fields RoCEv2 maps onto the IP header. It mirrors
// struct ibv_ah_attr's GRH part; AH builds one.
type AddressHandle struct {
	DGID         GID
	TrafficClass uint8 // IPv4 TOS or IPv6 traffic class: DSCP and ECN bits
	HopLimit     uint8
	FlowLabel    uint32
	// Port is the UDP port of the destination device, a goroce addition for devices not on
	// DefaultPort (4791), which 0 stands for.
	Port uint16
}

// SendWR is a send work request. It mirrors struct ibv_send_wr; the SGL and InlineData are copied when
// posted, so the caller may reuse the SendWR at once.
type SendWR struct {
	WRID   uint64 // returned in the completion
	Opcode WROpcode
	Flags  SendFlags
	SGL    []SGE // the local data: sent, or the destination of a READ or of an atomic's original value

	// InlineData is the message of an Inline request, copied when posted (up to QPInit.MaxInlineData
	// bytes). libibverbs takes inline data from SGEs holding process addresses; in Go the bytes
	// themselves are the natural form.
	InlineData []byte

	Imm            uint32 // immediate data of SEND or RDMA WRITE with immediate
	InvalidateRKey RKey   // the key the peer invalidates, for WRSendInv
	RemoteAddr     uint64 // RDMA and atomic target address in the peer's region
	RKey           RKey   // RDMA and atomic target region's key
	// CompareAdd is the compare value of a compare-and-swap, the addend of a fetch-and-add; Swap the
	// swap value. The peer's 8 bytes (8-byte aligned) are a uint64 in the host's byte order, as in
	// libibverbs and rxe, and the value they held before lands in the SGL's 8 bytes the same way: read
	// it with binary.NativeEndian.
	CompareAdd uint64
	Swap       uint64

	// UD only: where the datagram goes.
	AH         *AddressHandle
	RemoteQPN  QPN
	RemoteQKey QKey // a value with the top bit set means the QP's own Q_Key (IBTA Vol 1 10.2)
}

// RecvWR is a receive work request. It mirrors struct ibv_recv_wr; the SGL is copied when posted.
type RecvWR struct {
	WRID uint64 // returned in the completion
	SGL  []SGE  // where an incoming SEND's data goes; a UD receive starts with 40 bytes of GRH (WithGRH)
}

// Completion is a work completion. It mirrors struct ibv_wc. For an error completion only WRID,
// Status, Opcode and QPN are meaningful, as in libibverbs; Err turns Status into an error.
type Completion struct {
	WRID            uint64
	Status          Status
	Opcode          CompletionOpcode
	QPN             QPN    // the local QP
	ByteLen         uint32 // bytes received (receives), or moved by a READ
	Imm             uint32 // with WithImm: the immediate data
	InvalidatedRKey RKey   // with WithInv: the key the peer invalidated
	SrcQP           QPN    // UD receives: the sender's QP
	Flags           CompletionFlags
}

func completionFrom(c *qp.Completion) Completion {
	return Completion{WRID: c.WRID, Status: Status(c.Status), Opcode: CompletionOpcode(c.Opcode), QPN: c.QPN,
		ByteLen: c.ByteLen, Imm: c.Imm, InvalidatedRKey: c.InvalidatedRKey, SrcQP: c.SrcQP, Flags: CompletionFlags(c.Flags)}
}

// Attr is a queue pair's attributes, as struct ibv_qp_attr: Modify sets those its AttrMask names,
// Query returns them all.
type Attr struct {
	State           QPState
	AccessFlags     Access // what the peer may do on this QP: RemoteWrite, RemoteRead, RemoteAtomic
	PKey            uint16
	QKey            QKey          // UD
	AV              AddressHandle // the peer (RC, UC)
	PathMTU         MTU
	Timeout         uint8 // local ACK timeout: 4.096 us * 2^Timeout; 0 waits forever (0..31)
	RetryCnt        uint8 // transport retries before failing (0..7)
	RNRRetry        uint8 // RNR retries before failing; 7 retries forever (0..7)
	RQPSN           PSN   // the first PSN expected from the peer
	SQPSN           PSN   // the first PSN sent
	MaxRdAtomic     uint8 // READs and atomics this QP may have outstanding as requester
	MaxDestRdAtomic uint8 // READs and atomics this QP accepts outstanding as responder
	MinRNRTimer     uint8 // the RNR NAK timer code this QP's responder asks the peer to wait (0..31)
	DestQPN         QPN   // the peer (RC, UC)
}

// AttrMask names the fields of an Attr that Modify sets, as enum ibv_qp_attr_mask.
type AttrMask uint32

// Attribute masks.
const (
	AttrState           AttrMask = AttrMask(qp.AttrState)
	AttrAccessFlags     AttrMask = AttrMask(qp.AttrAccessFlags)
	AttrPKey            AttrMask = AttrMask(qp.AttrPKey)
	AttrPort            AttrMask = AttrMask(qp.AttrPort) // accepted and ignored: a device has one port
	AttrQKey            AttrMask = AttrMask(qp.AttrQKey)
	AttrAV              AttrMask = AttrMask(qp.AttrAV)
	AttrPathMTU         AttrMask = AttrMask(qp.AttrPathMTU)
	AttrTimeout         AttrMask = AttrMask(qp.AttrTimeout)
	AttrRetryCnt        AttrMask = AttrMask(qp.AttrRetryCnt)
	AttrRNRRetry        AttrMask = AttrMask(qp.AttrRNRRetry)
	AttrRQPSN           AttrMask = AttrMask(qp.AttrRQPSN)
	AttrMaxQPRdAtomic   AttrMask = AttrMask(qp.AttrMaxQPRdAtomic)
	AttrMinRNRTimer     AttrMask = AttrMask(qp.AttrMinRNRTimer)
	AttrSQPSN           AttrMask = AttrMask(qp.AttrSQPSN)
	AttrMaxDestRdAtomic AttrMask = AttrMask(qp.AttrMaxDestRdAtomic)
	AttrDestQPN         AttrMask = AttrMask(qp.AttrDestQPN)
)

func (m AttrMask) String() string { return qp.AttrMask(m).String() }

func (h AddressHandle) engine() qp.AddressHandle {
	return qp.AddressHandle{DGID: h.DGID, TrafficClass: h.TrafficClass, HopLimit: h.HopLimit, FlowLabel: h.FlowLabel, Port: h.Port}
}

func ahFrom(h qp.AddressHandle) AddressHandle {
	return AddressHandle{DGID: h.DGID, TrafficClass: h.TrafficClass, HopLimit: h.HopLimit, FlowLabel: h.FlowLabel, Port: h.Port}
}

func (a *Attr) engine() qp.Attr {
	return qp.Attr{State: qp.State(a.State), AccessFlags: mr.Access(a.AccessFlags), PKey: wire.PKey(a.PKey), QKey: a.QKey,
		AV: a.AV.engine(), PathMTU: a.PathMTU, Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry,
		RQPSN: a.RQPSN, SQPSN: a.SQPSN, MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic,
		MinRNRTimer: a.MinRNRTimer, DestQPN: a.DestQPN}
}

func attrFrom(a qp.Attr) Attr {
	return Attr{State: QPState(a.State), AccessFlags: Access(a.AccessFlags), PKey: uint16(a.PKey), QKey: a.QKey,
		AV: ahFrom(a.AV), PathMTU: a.PathMTU, Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry,
		RQPSN: a.RQPSN, SQPSN: a.SQPSN, MaxRdAtomic: a.MaxRdAtomic, MaxDestRdAtomic: a.MaxDestRdAtomic,
		MinRNRTimer: a.MinRNRTimer, DestQPN: a.DestQPN}
}

// Counters are a queue pair's statistics (QP.Counters; Stats.QP sums them over a device). Where rxe has
// a hardware counter for the same event (drivers/infiniband/sw/rxe/rxe_hw_counters.c, shown by
// `rdma statistic`), the field's tag says its name, and where only mlx5 has one, mlx5's; Each reports
// those names. The comments give mlx5's name for a counter rxe names differently.
type Counters struct {
	SentPkts            uint64 `rxe:"sent_pkts"`
	RcvdPkts            uint64 `rxe:"rcvd_pkts"`
	DuplicateRequest    uint64 `rxe:"duplicate_request"`      // responder: requests behind the expected PSN
	OutOfSeqRequest     uint64 `rxe:"out_of_seq_request"`     // responder: requests ahead of the expected PSN (mlx5: out_of_sequence)
	RcvdRNRErr          uint64 `rxe:"rcvd_rnr_err"`           // requester: RNR NAKs received (mlx5: rnr_nak_retry_err)
	SendRNRErr          uint64 `rxe:"send_rnr_err"`           // responder: RNR NAKs sent
	RcvdSeqErr          uint64 `rxe:"rcvd_seq_err"`           // requester: PSN sequence error NAKs received (mlx5: packet_seq_err)
	CompleterRetryErr   uint64 `rxe:"completer_retry_err"`    // requester: go-back-N retransmissions started
	RetryExceededErr    uint64 `rxe:"retry_exceeded_err"`     // requester: retry_cnt ran out
	RetryRNRExceededErr uint64 `rxe:"retry_rnr_exceeded_err"` // requester: rnr_retry ran out
	AckDeferred         uint64 `rxe:"ack_deferred"`           // responder: in-order requests without AckReq
	SendErr             uint64 `rxe:"send_err"`               // requester: requests failed before the wire

	Timeouts      uint64    `mlx5:"local_ack_timeout_err"` // local ACK timeouts that started a retransmission
	TailProbes    uint64    // tail-loss probes sent (Config.TailProbe)
	ProbeRetries  uint64    // go-back-N resends a probe's answer started
	ImpliedNAKs   uint64    `mlx5:"implied_nak_seq_err"` // responses past a READ or atomic whose response is missing
	RetryIgnored  uint64    // NAKs and implied NAKs that arrived while a retry was already under way
	CQOverflow    uint64    // completions lost to a full CQ
	InvalidateErr uint64    // SEND_WITH_INV naming a key that could not be invalidated
	FatalNAKs     uint64    // NAKs sent that ended the connection
	NAKsSent      [8]uint64 // NAKs sent, by NAK code (PSN sequence error, invalid request, ...)
	RcvdCE        uint64    `mlx5:"np_ecn_marked_roce_packets"` // packets that arrived marked Congestion Experienced
	RcvdCNP       uint64    `mlx5:"rp_cnp_handled"`             // congestion notification packets received (the reaction point's)

	Dropped               uint64 // every packet dropped, whatever the reason below
	DropState             uint64 // the QP's state does not take the packet
	DropWrongTransport    uint64 // an opcode of another service than the QP's
	DropPKey              uint64 // P_Key mismatch
	DropGhostResponse     uint64 // a response for a PSN never sent
	DropStaleResponse     uint64 // a response for a PSN already acknowledged
	DropBadResponse       uint64 // a response of the wrong kind for what is outstanding
	DropResponseQueueFull uint64 // a request that would queue more responses than the ring holds
	DropDuplicate         uint64 // a duplicate with nothing to answer it with
	DropUCMessage         uint64 // UC packets of a message lost to a gap or an error
	DropNoRecv            uint64 // UC or UD messages with no receive posted
	DropQKey              uint64 // UD Q_Key mismatch
	DropRecvTooSmall      uint64 // UD datagrams larger than the posted receive
}

// Each calls fn with every counter's name and value: rxe's name where it has one, else mlx5's, else the
// Go field name (and the NAK code for NAKsSent).
func (c *Counters) Each(fn func(name string, v uint64)) { (*qp.Counters)(c).Each(fn) }

// Add adds o's counts to c.
func (c *Counters) Add(o *Counters) { (*qp.Counters)(c).Add((*qp.Counters)(o)) }

// maxStackSGEs is how many SGEs a work request converts without allocating.
const maxStackSGEs = 8

// engineSGL returns sgl as the engines' type, in buf when it fits.
func engineSGL(sgl []SGE, buf *[maxStackSGEs]mr.SGE) []mr.SGE {
	if len(sgl) == 0 {
		return nil
	}
	out := buf[:0]
	if len(sgl) > maxStackSGEs {
		out = make([]mr.SGE, 0, len(sgl))
	}
	for _, s := range sgl {
		out = append(out, mr.SGE(s))
	}
	return out
}

// engineSendWR converts wr for the engine; the result points into sgl and ah, which the caller owns.
func engineSendWR(wr *SendWR, sgl *[maxStackSGEs]mr.SGE, ah *qp.AddressHandle) qp.SendWR {
	e := qp.SendWR{ID: wr.WRID, Opcode: qp.WROpcode(wr.Opcode), Flags: qp.SendFlags(wr.Flags), SGL: engineSGL(wr.SGL, sgl),
		InlineData: wr.InlineData, Imm: wr.Imm, InvalidateRKey: wr.InvalidateRKey, RemoteAddr: wr.RemoteAddr,
		RKey: wr.RKey, CompareAdd: wr.CompareAdd, Swap: wr.Swap, RemoteQPN: wr.RemoteQPN, RemoteQKey: wr.RemoteQKey}
	if wr.AH != nil {
		*ah = wr.AH.engine()
		e.AH = ah
	}
	return e
}

// GoString shows a completion in Go syntax with its names, for test failures.
func (c Completion) GoString() string {
	return fmt.Sprintf("goroce.Completion{WRID: %d, Status: %v, Opcode: %v, QPN: %v, ByteLen: %d, Imm: %#x, SrcQP: %v, Flags: %#x}",
		c.WRID, c.Status, c.Opcode, c.QPN, c.ByteLen, c.Imm, c.SrcQP, uint8(c.Flags))
}
