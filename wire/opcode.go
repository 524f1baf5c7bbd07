package wire

import "fmt"

// Opcode is the BTH OpCode: a transport service in bits 7..5 and an operation in bits 4..0.
// IBTA Vol 1 9.2 (OpCode); IBTA Annex A17 (RoCEv2) for the CNP.
type Opcode uint8

// Transport is the service an opcode belongs to: bits 7..5 of the opcode.
type Transport uint8

// The transport services of the opcode space. IBTA Vol 1 9.2 (OpCode); Annex A17.9.3 for CNP.
const (
	TransportRC  Transport = 0x00 // reliable connection
	TransportUC  Transport = 0x20 // unreliable connection
	TransportRD  Transport = 0x40 // reliable datagram (not used on RoCE)
	TransportUD  Transport = 0x60 // unreliable datagram
	TransportCNP Transport = 0x80 // RoCEv2 congestion notification
	TransportXRC Transport = 0xA0 // extended reliable connection
)

// Transport returns the service bits of o.
func (o Opcode) Transport() Transport { return Transport(o & 0xE0) }

func (t Transport) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportUD:
		return "UD"
	case TransportCNP:
		return "CNP"
	case TransportXRC:
		return "XRC"
	}
	return fmt.Sprintf("Transport(%#02x)", uint8(t))
}

// The opcodes goroce knows: RC, UC, UD and the RoCEv2 CNP. IBTA Vol 1 9.2 (OpCode) and, for FLUSH and
// ATOMIC_WRITE, the IBTA 1.5 Memory Placement Extensions as Linux implements them (include/rdma/ib_pack.h).
const (
	RCSendFirst          Opcode = 0x00
	RCSendMiddle         Opcode = 0x01
	RCSendLast           Opcode = 0x02
	RCSendLastImm        Opcode = 0x03
	RCSendOnly           Opcode = 0x04
	RCSendOnlyImm        Opcode = 0x05
	RCWriteFirst         Opcode = 0x06
	RCWriteMiddle        Opcode = 0x07
	RCWriteLast          Opcode = 0x08
	RCWriteLastImm       Opcode = 0x09
	RCWriteOnly          Opcode = 0x0A
	RCWriteOnlyImm       Opcode = 0x0B
	RCReadRequest        Opcode = 0x0C
	RCReadResponseFirst  Opcode = 0x0D
	RCReadResponseMiddle Opcode = 0x0E
	RCReadResponseLast   Opcode = 0x0F
	RCReadResponseOnly   Opcode = 0x10
	RCAcknowledge        Opcode = 0x11
	RCAtomicAcknowledge  Opcode = 0x12
	RCCompareSwap        Opcode = 0x13
	RCFetchAdd           Opcode = 0x14
	RCSendLastInvalidate Opcode = 0x16
	RCSendOnlyInvalidate Opcode = 0x17
	RCFlush              Opcode = 0x1C
	RCAtomicWrite        Opcode = 0x1D
	UCSendFirst          Opcode = 0x20
	UCSendMiddle         Opcode = 0x21
	UCSendLast           Opcode = 0x22
	UCSendLastImm        Opcode = 0x23
	UCSendOnly           Opcode = 0x24
	UCSendOnlyImm        Opcode = 0x25
	UCWriteFirst         Opcode = 0x26
	UCWriteMiddle        Opcode = 0x27
	UCWriteLast          Opcode = 0x28
	UCWriteLastImm       Opcode = 0x29
	UCWriteOnly          Opcode = 0x2A
	UCWriteOnlyImm       Opcode = 0x2B
	UDSendOnly           Opcode = 0x64
	UDSendOnlyImm        Opcode = 0x65
	CNP                  Opcode = 0x81
)

// Operation is what an opcode does, independent of its transport and its place in a message.
type Operation uint8

// The operations of the opcode table.
const (
	OpInvalid           Operation = iota
	OpSend                        // SEND, with or without immediate or invalidate
	OpWrite                       // RDMA WRITE
	OpReadRequest                 // RDMA READ request
	OpReadResponse                // RDMA READ response
	OpAcknowledge                 // ACK or NAK
	OpAtomicAcknowledge           // ATOMIC ACKNOWLEDGE carrying the original value
	OpCompareSwap                 // ATOMIC compare and swap
	OpFetchAdd                    // ATOMIC fetch and add
	OpFlush                       // FLUSH (memory placement extension)
	OpAtomicWrite                 // ATOMIC WRITE (memory placement extension)
	OpCNP                         // RoCEv2 congestion notification
)

var operationNames = [...]string{
	OpInvalid:           "INVALID",
	OpSend:              "SEND",
	OpWrite:             "RDMA_WRITE",
	OpReadRequest:       "RDMA_READ_REQUEST",
	OpReadResponse:      "RDMA_READ_RESPONSE",
	OpAcknowledge:       "ACKNOWLEDGE",
	OpAtomicAcknowledge: "ATOMIC_ACKNOWLEDGE",
	OpCompareSwap:       "COMPARE_SWAP",
	OpFetchAdd:          "FETCH_ADD",
	OpFlush:             "FLUSH",
	OpAtomicWrite:       "ATOMIC_WRITE",
	OpCNP:               "CNP",
}

func (o Operation) String() string {
	if int(o) < len(operationNames) {
		return operationNames[o]
	}
	return fmt.Sprintf("Operation(%d)", uint8(o))
}

// Position is where a packet stands in its message. IBTA Vol 1 9.4 (packet sequences).
type Position uint8

// Packet positions. Single-packet operations (READ request, atomics, ACKs, CNP) are PosOnly.
const (
	PosOnly Position = iota
	PosFirst
	PosMiddle
	PosLast
)

func (p Position) String() string {
	switch p {
	case PosOnly:
		return "only"
	case PosFirst:
		return "first"
	case PosMiddle:
		return "middle"
	case PosLast:
		return "last"
	}
	return fmt.Sprintf("Position(%d)", uint8(p))
}

// StartsMessage reports whether a packet at p begins a message (first or only).
func (p Position) StartsMessage() bool { return p == PosOnly || p == PosFirst }

// EndsMessage reports whether a packet at p ends a message (last or only).
func (p Position) EndsMessage() bool { return p == PosOnly || p == PosLast }

// AckPolicy says how a responder answers a request opcode.
type AckPolicy uint8

// Ack policies. IBTA Vol 1 9.7.5 (acknowledging requests).
const (
	AckNone   AckPolicy = iota // never answered: UC, UD, responses, CNP
	AckOnReq                   // RC SEND/WRITE: answered by an ACK when AckReq is set (or coalesced)
	AckAlways                  // RC READ, atomics, FLUSH, ATOMIC_WRITE: always answered by a response
)

// Header is one of the extension headers that may follow the BTH. The order of the constants is the order
// in which headers appear on the wire. IBTA Vol 1 9.2 (header order).
type Header uint8

// Extension headers, in wire order.
const (
	HdrDETH      Header = iota // datagram: Q_Key and source QP. IBTA Vol 1 9.3
	HdrFETH                    // flush: placement type and selectivity level, before RETH. IBTA 1.5 MPE
	HdrRETH                    // RDMA: VA, R_Key, DMA length. IBTA Vol 1 9.3
	HdrAtomicETH               // atomic: VA, R_Key, swap/add, compare. IBTA Vol 1 9.3
	HdrAETH                    // acknowledge: syndrome and MSN. IBTA Vol 1 9.3
	HdrAtomicAck               // atomic acknowledge: original remote data. IBTA Vol 1 9.3
	HdrImmDt                   // immediate data. IBTA Vol 1 9.3
	HdrIETH                    // invalidate: R_Key to invalidate. IBTA Vol 1 9.3
	HdrCNP                     // the CNP's 16 reserved bytes. IBTA Annex A17.9.3
	numHeaders
)

// headerLen is the size of each extension header in bytes.
var headerLen = [numHeaders]uint8{
	HdrDETH:      DETHLen,
	HdrRETH:      RETHLen,
	HdrAtomicETH: AtomicETHLen,
	HdrFETH:      FETHLen,
	HdrAETH:      AETHLen,
	HdrAtomicAck: AtomicAckETHLen,
	HdrImmDt:     ImmDtLen,
	HdrIETH:      IETHLen,
	HdrCNP:       CNPLen,
}

var headerNames = [numHeaders]string{
	HdrDETH: "DETH", HdrRETH: "RETH", HdrAtomicETH: "AtomicETH", HdrFETH: "FETH", HdrAETH: "AETH",
	HdrAtomicAck: "AtomicAckETH", HdrImmDt: "ImmDt", HdrIETH: "IETH", HdrCNP: "CNP",
}

func (h Header) String() string {
	if h < numHeaders {
		return headerNames[h]
	}
	return fmt.Sprintf("Header(%d)", uint8(h))
}

// Len returns the size of h in bytes.
func (h Header) Len() int {
	if h < numHeaders {
		return int(headerLen[h])
	}
	return 0
}

// HeaderSet is a set of extension headers.
type HeaderSet uint16

// Has reports whether h is in s.
func (s HeaderSet) Has(h Header) bool { return s&(1<<h) != 0 }

func hdrs(hs ...Header) HeaderSet {
	var s HeaderSet
	for _, h := range hs {
		s |= 1 << h
	}
	return s
}

// OpInfo describes one opcode: everything the parser, the builder and the engines need to know about it.
// The table holding it is the only description of the opcode space in goroce.
type OpInfo struct {
	Name       string // IBTA name without the transport, e.g. "SEND_FIRST"
	Transport  Transport
	Op         Operation
	Pos        Position
	Headers    HeaderSet // extension headers after the BTH
	Payload    bool      // whether a payload may follow the headers
	Imm        bool      // carries ImmDt
	Invalidate bool      // carries IETH
	Response   bool      // sent by a responder (ACK, READ response, atomic ACK)
	Ack        AckPolicy // how a responder answers it
	HeaderLen  uint8     // BTH plus extension headers, in bytes
	off        [numHeaders]uint8
	valid      bool
}

// Valid reports whether the opcode is defined.
func (i *OpInfo) Valid() bool { return i.valid }

// Offset returns the byte offset of extension header h from the start of the BTH, and false if the opcode
// does not carry h.
func (i *OpInfo) Offset(h Header) (int, bool) {
	if h >= numHeaders || !i.Headers.Has(h) {
		return 0, false
	}
	return int(i.off[h]), true
}

// opTable is indexed by opcode. Entries with valid == false are reserved or unsupported.
var opTable [256]OpInfo

// Info returns the table entry for o. It never returns nil; check Valid for reserved opcodes.
func (o Opcode) Info() *OpInfo { return &opTable[o] }

// Valid reports whether o is an opcode goroce understands.
func (o Opcode) Valid() bool { return opTable[o].valid }

func (o Opcode) String() string {
	i := &opTable[o]
	if !i.valid {
		return fmt.Sprintf("Opcode(%#02x)", uint8(o))
	}
	if i.Transport == TransportCNP {
		return i.Name // the CNP is a transport of one opcode: "CNP", as Wireshark names it
	}
	return i.Transport.String() + " " + i.Name
}

type opDef struct {
	code    Opcode
	name    string
	op      Operation
	pos     Position
	headers HeaderSet
	payload bool
}

// connectedOps are the operations RC and UC share, with their IBTA names (IBTA Vol 1 Table 38). The low 5
// bits of the code are the same for both transports.
var connectedOps = []opDef{
	{0x00, "SEND_FIRST", OpSend, PosFirst, 0, true},
	{0x01, "SEND_MIDDLE", OpSend, PosMiddle, 0, true},
	{0x02, "SEND_LAST", OpSend, PosLast, 0, true},
	{0x03, "SEND_LAST_WITH_IMMEDIATE", OpSend, PosLast, hdrs(HdrImmDt), true},
	{0x04, "SEND_ONLY", OpSend, PosOnly, 0, true},
	{0x05, "SEND_ONLY_WITH_IMMEDIATE", OpSend, PosOnly, hdrs(HdrImmDt), true},
	{0x06, "RDMA_WRITE_FIRST", OpWrite, PosFirst, hdrs(HdrRETH), true},
	{0x07, "RDMA_WRITE_MIDDLE", OpWrite, PosMiddle, 0, true},
	{0x08, "RDMA_WRITE_LAST", OpWrite, PosLast, 0, true},
	{0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", OpWrite, PosLast, hdrs(HdrImmDt), true},
	{0x0A, "RDMA_WRITE_ONLY", OpWrite, PosOnly, hdrs(HdrRETH), true},
	{0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpWrite, PosOnly, hdrs(HdrRETH, HdrImmDt), true},
}

// rcOnlyOps are the operations only RC has.
var rcOnlyOps = []opDef{
	{RCReadRequest, "RDMA_READ_REQUEST", OpReadRequest, PosOnly, hdrs(HdrRETH), false},
	{RCReadResponseFirst, "RDMA_READ_RESPONSE_FIRST", OpReadResponse, PosFirst, hdrs(HdrAETH), true},
	{RCReadResponseMiddle, "RDMA_READ_RESPONSE_MIDDLE", OpReadResponse, PosMiddle, 0, true},
	{RCReadResponseLast, "RDMA_READ_RESPONSE_LAST", OpReadResponse, PosLast, hdrs(HdrAETH), true},
	{RCReadResponseOnly, "RDMA_READ_RESPONSE_ONLY", OpReadResponse, PosOnly, hdrs(HdrAETH), true},
	{RCAcknowledge, "ACKNOWLEDGE", OpAcknowledge, PosOnly, hdrs(HdrAETH), false},
	{RCAtomicAcknowledge, "ATOMIC_ACKNOWLEDGE", OpAtomicAcknowledge, PosOnly, hdrs(HdrAETH, HdrAtomicAck), false},
	{RCCompareSwap, "COMPARE_SWAP", OpCompareSwap, PosOnly, hdrs(HdrAtomicETH), false},
	{RCFetchAdd, "FETCH_ADD", OpFetchAdd, PosOnly, hdrs(HdrAtomicETH), false},
	{RCSendLastInvalidate, "SEND_LAST_WITH_INVALIDATE", OpSend, PosLast, hdrs(HdrIETH), true},
	{RCSendOnlyInvalidate, "SEND_ONLY_WITH_INVALIDATE", OpSend, PosOnly, hdrs(HdrIETH), true},
	{RCFlush, "FLUSH", OpFlush, PosOnly, hdrs(HdrFETH, HdrRETH), false},
	{RCAtomicWrite, "ATOMIC_WRITE", OpAtomicWrite, PosOnly, hdrs(HdrRETH), true},
}

var udOps = []opDef{
	{UDSendOnly, "SEND_ONLY", OpSend, PosOnly, hdrs(HdrDETH), true},
	{UDSendOnlyImm, "SEND_ONLY_WITH_IMMEDIATE", OpSend, PosOnly, hdrs(HdrDETH, HdrImmDt), true},
}

var cnpOps = []opDef{
	{CNP, "CNP", OpCNP, PosOnly, hdrs(HdrCNP), false},
}

func init() {
	for _, d := range connectedOps {
		define(TransportRC, Opcode(TransportRC)|d.code, d)
		define(TransportUC, Opcode(TransportUC)|d.code, d)
	}
	for _, d := range rcOnlyOps {
		define(TransportRC, d.code, d)
	}
	for _, d := range udOps {
		define(TransportUD, d.code, d)
	}
	for _, d := range cnpOps {
		define(TransportCNP, d.code, d)
	}
	// The reserved RC opcodes keep valid false; their entries say only that they are RC requests with
	// nothing after the BTH, for ParseReserved.
	for code := Opcode(TransportRC); code < Opcode(TransportRC)+0x20; code++ {
		if i := &opTable[code]; !i.valid {
			*i = OpInfo{Name: "RESERVED", Transport: TransportRC, Op: OpInvalid, Pos: PosOnly, Payload: true, HeaderLen: BTHLen}
		}
	}
}

func define(t Transport, code Opcode, d opDef) {
	i := &opTable[code]
	*i = OpInfo{
		Name:       d.name,
		Transport:  t,
		Op:         d.op,
		Pos:        d.pos,
		Headers:    d.headers,
		Payload:    d.payload,
		Imm:        d.headers.Has(HdrImmDt),
		Invalidate: d.headers.Has(HdrIETH),
		Response:   d.op == OpReadResponse || d.op == OpAcknowledge || d.op == OpAtomicAcknowledge,
		valid:      true,
	}
	switch {
	case t != TransportRC || i.Response:
		i.Ack = AckNone
	case d.op == OpSend || d.op == OpWrite:
		i.Ack = AckOnReq
	default:
		i.Ack = AckAlways
	}
	off := BTHLen
	for h := Header(0); h < numHeaders; h++ {
		if d.headers.Has(h) {
			i.off[h] = uint8(off)
			off += int(headerLen[h])
		}
	}
	i.HeaderLen = uint8(off)
}
