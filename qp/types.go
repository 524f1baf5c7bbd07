package qp

import (
	"fmt"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// Type is a queue pair's transport service. IBTA Vol 1 chapter 9 (transport services).
type Type uint8

// Queue pair types. The values are those of enum ibv_qp_type.
const (
	RC Type = 2 // reliable connection
	UC Type = 3 // unreliable connection
	UD Type = 4 // unreliable datagram
)

func (t Type) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

func (t Type) valid() bool { return t == RC || t == UC || t == UD }

// transport returns the opcode class of t's packets.
func (t Type) transport() wire.Transport {
	switch t {
	case UC:
		return wire.TransportUC
	case UD:
		return wire.TransportUD
	}
	return wire.TransportRC
}

// WROpcode is what a send work request asks for. The values are those of enum ibv_wr_opcode.
type WROpcode uint8

// Send work request opcodes.
const (
	WRWrite       WROpcode = 0 // RDMA WRITE
	WRWriteImm    WROpcode = 1 // RDMA WRITE with immediate: also consumes a receive at the peer
	WRSend        WROpcode = 2 // SEND
	WRSendImm     WROpcode = 3 // SEND with immediate
	WRRead        WROpcode = 4 // RDMA READ
	WRCompareSwap WROpcode = 5 // ATOMIC compare and swap
	WRFetchAdd    WROpcode = 6 // ATOMIC fetch and add
	WRSendInv     WROpcode = 9 // SEND with invalidate: the peer invalidates InvalidateRKey
)

// wrOpcodeNames names the opcodes goroce knows, indexed by value; "" marks the values it does not (as
// ibv_wr_opcode's 7 and 8, bind and local invalidate, which it does not take).
var wrOpcodeNames = [...]string{
	WRWrite: "RDMA_WRITE", WRWriteImm: "RDMA_WRITE_WITH_IMM", WRSend: "SEND", WRSendImm: "SEND_WITH_IMM",
	WRRead: "RDMA_READ", WRCompareSwap: "ATOMIC_CMP_AND_SWP", WRFetchAdd: "ATOMIC_FETCH_AND_ADD",
	WRSendInv: "SEND_WITH_INV",
}

// known reports whether goroce knows o.
func (o WROpcode) known() bool { return int(o) < len(wrOpcodeNames) && wrOpcodeNames[o] != "" }

func (o WROpcode) String() string {
	if o.known() {
		return wrOpcodeNames[o]
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

func (o WROpcode) isAtomic() bool { return o == WRCompareSwap || o == WRFetchAdd }

// isReadAtomic reports whether o needs a responder resource and an initiator depth credit.
func (o WROpcode) isReadAtomic() bool { return o == WRRead || o.isAtomic() }

func (o WROpcode) isWrite() bool { return o == WRWrite || o == WRWriteImm }

// allowedOn reports whether a QP of type t can carry o. IBTA Vol 1 chapter 10 (work requests per
// service); rxe_opcode.c rxe_wr_opcode_info.
func (o WROpcode) allowedOn(t Type) bool {
	switch t {
	case RC:
		return o.known()
	case UC:
		return o == WRSend || o == WRSendImm || o == WRWrite || o == WRWriteImm
	case UD:
		return o == WRSend || o == WRSendImm
	}
	return false
}

// SendFlags modify a send work request. The values are those of enum ibv_send_flags.
type SendFlags uint8

// Send flags.
const (
	Fence     SendFlags = 1 << 0 // wait for earlier READs and atomics to complete before starting
	Signaled  SendFlags = 1 << 1 // produce a completion on success (errors always complete)
	Solicited SendFlags = 1 << 2 // set the BTH SE bit on the last packet
	Inline    SendFlags = 1 << 3 // the data is InlineData, copied at post time; no memory region is involved
)

// AddressHandle says where a packet goes: the destination GID (an IPv6 address, or an IPv4-mapped one)
// and the GRH fields RoCEv2 maps onto the IP header. It mirrors struct ibv_ah_attr's GRH part.
type AddressHandle struct {
	DGID         [16]byte
	TrafficClass uint8 // IPv4 TOS or IPv6 traffic class: DSCP and ECN bits
	HopLimit     uint8
	FlowLabel    uint32
	// Port is the destination UDP port, a goroce extension for devices on ports other than 4791: 0
	// sends to the sending device's own port.
	Port uint16
}

// SendWR is a send work request. It mirrors struct ibv_send_wr; the SGL is copied when posted.
type SendWR struct {
	ID     uint64
	Opcode WROpcode
	Flags  SendFlags
	SGL    []mr.SGE

	// InlineData is the message of an Inline request, copied when posted (up to max_inline_data
	// bytes). libibverbs takes inline data from SGEs holding process addresses; in Go the bytes
	// themselves are the natural form.
	InlineData []byte

	Imm            uint32    // immediate data of SEND/WRITE with immediate
	InvalidateRKey wire.RKey // rkey the peer invalidates, for WRSendInv
	RemoteAddr     uint64    // RDMA and atomic target address
	RKey           wire.RKey // RDMA and atomic target key
	CompareAdd     uint64    // compare value of a compare-and-swap, addend of a fetch-and-add
	Swap           uint64    // swap value of a compare-and-swap

	// UD only.
	AH         *AddressHandle
	RemoteQPN  wire.QPN
	RemoteQKey wire.QKey // a value with the top bit set means the QP's own Q_Key (IBTA Vol 1 10.2)
}

// RecvWR is a receive work request. It mirrors struct ibv_recv_wr; the SGL is copied when posted.
type RecvWR struct {
	ID  uint64
	SGL []mr.SGE
}

// Status is the outcome of a work request. The values are those of enum ibv_wc_status.
type Status uint8

// Completion statuses.
const (
	StatusSuccess        Status = 0
	StatusLocLenErr      Status = 1  // a receive buffer too small, or a response of the wrong length
	StatusLocQPOpErr     Status = 2  // an operation the QP cannot perform
	StatusLocProtErr     Status = 4  // a bad lkey or a local buffer outside its region
	StatusWRFlushErr     Status = 5  // flushed: the QP entered the error state
	StatusBadRespErr     Status = 7  // an unexpected response opcode
	StatusLocAccessErr   Status = 8  // a local protection error detected on the responder side
	StatusRemInvReqErr   Status = 9  // the peer NAKed with invalid request
	StatusRemAccessErr   Status = 10 // the peer NAKed with remote access error
	StatusRemOpErr       Status = 11 // the peer NAKed with remote operational error
	StatusRetryExcErr    Status = 12 // the transport retry counter ran out
	StatusRNRRetryExcErr Status = 13 // the RNR retry counter ran out
	StatusRemAbortErr    Status = 16
	StatusFatalErr       Status = 19
	StatusGeneralErr     Status = 21
)

var statusNames = map[Status]string{
	StatusSuccess: "success", StatusLocLenErr: "local length error", StatusLocQPOpErr: "local QP operation error",
	StatusLocProtErr: "local protection error", StatusWRFlushErr: "WR flushed", StatusBadRespErr: "bad response",
	StatusLocAccessErr: "local access error", StatusRemInvReqErr: "remote invalid request error",
	StatusRemAccessErr: "remote access error", StatusRemOpErr: "remote operation error",
	StatusRetryExcErr: "transport retry counter exceeded", StatusRNRRetryExcErr: "RNR retry counter exceeded",
	StatusRemAbortErr: "remote aborted error", StatusFatalErr: "fatal error", StatusGeneralErr: "general error",
}

// String returns the text ibv_wc_status_str gives for s.
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// CompletionOpcode says what a completed work request did. The values are those of enum ibv_wc_opcode.
type CompletionOpcode uint8

// Completion opcodes.
const (
	CompSend            CompletionOpcode = 0
	CompRDMAWrite       CompletionOpcode = 1
	CompRDMARead        CompletionOpcode = 2
	CompCompareSwap     CompletionOpcode = 3
	CompFetchAdd        CompletionOpcode = 4
	CompRecv            CompletionOpcode = 128
	CompRecvRDMAWithImm CompletionOpcode = 129
)

func (o CompletionOpcode) String() string {
	switch o {
	case CompSend:
		return "SEND"
	case CompRDMAWrite:
		return "RDMA_WRITE"
	case CompRDMARead:
		return "RDMA_READ"
	case CompCompareSwap:
		return "COMP_SWAP"
	case CompFetchAdd:
		return "FETCH_ADD"
	case CompRecv:
		return "RECV"
	case CompRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("CompletionOpcode(%d)", uint8(o))
}

func (o WROpcode) completionOpcode() CompletionOpcode {
	switch o {
	case WRWrite, WRWriteImm:
		return CompRDMAWrite
	case WRRead:
		return CompRDMARead
	case WRCompareSwap:
		return CompCompareSwap
	case WRFetchAdd:
		return CompFetchAdd
	}
	return CompSend
}

// CompletionFlags qualify a completion. The values are those of enum ibv_wc_flags.
type CompletionFlags uint8

// Completion flags.
const (
	WithGRH CompletionFlags = 1 << 0 // a UD receive: the first 40 bytes of the buffer hold the GRH
	WithImm CompletionFlags = 1 << 1 // Imm is valid
	WithInv CompletionFlags = 1 << 3 // InvalidatedRKey is valid
)

// Completion is a work completion. It mirrors struct ibv_wc. For an error completion only WRID, Status,
// Opcode and QPN are meaningful, as in libibverbs.
type Completion struct {
	WRID            uint64
	Status          Status
	Opcode          CompletionOpcode
	QPN             wire.QPN
	ByteLen         uint32
	Imm             uint32
	InvalidatedRKey wire.RKey
	SrcQP           wire.QPN // UD receives: the sender's QP
	Flags           CompletionFlags
}
