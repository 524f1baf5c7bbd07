package wire

import "encoding/binary"

// Extension header sizes in bytes. IBTA Vol 1 9.3 (extended transport headers).
const (
	RETHLen         = 16
	AETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	DETHLen         = 8
	FETHLen         = 4
	CNPLen          = 16
)

// RETH is a view of an RDMA extended transport header: where an RDMA WRITE or READ goes in the
// responder's memory. IBTA Vol 1 9.3 (RETH).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                      Virtual Address (64)                     |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             R_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                          DMA Length                           |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type RETH []byte

// RETHFields holds every field of a RETH.
type RETHFields struct {
	VA     uint64
	RKey   RKey
	DMALen uint32 // length of the whole message, not of this packet
}

// VA returns the virtual address.
func (r RETH) VA() uint64 { return binary.BigEndian.Uint64(r[0:]) }

// RKey returns the remote key.
func (r RETH) RKey() RKey { return RKey(binary.BigEndian.Uint32(r[8:])) }

// DMALen returns the length of the whole RDMA message in bytes.
func (r RETH) DMALen() uint32 { return binary.BigEndian.Uint32(r[12:]) }

// Fields decodes the whole header.
func (r RETH) Fields() RETHFields { return RETHFields{VA: r.VA(), RKey: r.RKey(), DMALen: r.DMALen()} }

// Encode writes all of f into r.
func (r RETH) Encode(f *RETHFields) {
	binary.BigEndian.PutUint64(r[0:], f.VA)
	binary.BigEndian.PutUint32(r[8:], uint32(f.RKey))
	binary.BigEndian.PutUint32(r[12:], f.DMALen)
}

// Append appends the encoding of f to dst.
func (f *RETHFields) Append(dst []byte) []byte {
	dst, h := grow(dst, RETHLen)
	RETH(h).Encode(f)
	return dst
}

// AETH is a view of an ACK extended transport header: the responder's syndrome and message sequence
// number. IBTA Vol 1 9.3 (AETH).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|   Syndrome    |                      MSN                      |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type AETH []byte

// AETHFields holds every field of an AETH.
type AETHFields struct {
	Syndrome Syndrome
	MSN      MSN
}

// Syndrome returns the syndrome: ACK, RNR NAK or NAK with its code.
func (a AETH) Syndrome() Syndrome { return Syndrome(a[0]) }

// MSN returns the message sequence number.
func (a AETH) MSN() MSN { return MSN(get24(a[1:])) }

// Fields decodes the whole header.
func (a AETH) Fields() AETHFields { return AETHFields{Syndrome: a.Syndrome(), MSN: a.MSN()} }

// Encode writes all of f into a.
func (a AETH) Encode(f *AETHFields) {
	a[0] = byte(f.Syndrome)
	put24(a[1:], uint32(f.MSN))
}

// Append appends the encoding of f to dst.
func (f *AETHFields) Append(dst []byte) []byte {
	dst, h := grow(dst, AETHLen)
	AETH(h).Encode(f)
	return dst
}

// AtomicETH is a view of an atomic extended transport header: the target of a compare-and-swap or
// fetch-and-add and its operands. IBTA Vol 1 9.3 (AtomicETH).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Virtual Address (64)                       |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             R_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                Swap (compare-swap) or Add Data (64)           |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                      Compare Data (64)                        |
//	+                                                               +
//	|                                                               |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type AtomicETH []byte

// AtomicETHFields holds every field of an AtomicETH.
type AtomicETHFields struct {
	VA      uint64
	RKey    RKey
	SwapAdd uint64 // the swap value of a compare-and-swap, the addend of a fetch-and-add
	Compare uint64 // the compare value of a compare-and-swap; unused by fetch-and-add
}

// VA returns the virtual address of the 8-byte target.
func (a AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(a[0:]) }

// RKey returns the remote key.
func (a AtomicETH) RKey() RKey { return RKey(binary.BigEndian.Uint32(a[8:])) }

// SwapAdd returns the swap (compare-and-swap) or add (fetch-and-add) operand.
func (a AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(a[12:]) }

// Compare returns the compare operand of a compare-and-swap.
func (a AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(a[20:]) }

// Fields decodes the whole header.
func (a AtomicETH) Fields() AtomicETHFields {
	return AtomicETHFields{VA: a.VA(), RKey: a.RKey(), SwapAdd: a.SwapAdd(), Compare: a.Compare()}
}

// Encode writes all of f into a.
func (a AtomicETH) Encode(f *AtomicETHFields) {
	binary.BigEndian.PutUint64(a[0:], f.VA)
	binary.BigEndian.PutUint32(a[8:], uint32(f.RKey))
	binary.BigEndian.PutUint64(a[12:], f.SwapAdd)
	binary.BigEndian.PutUint64(a[20:], f.Compare)
}

// Append appends the encoding of f to dst.
func (f *AtomicETHFields) Append(dst []byte) []byte {
	dst, h := grow(dst, AtomicETHLen)
	AtomicETH(h).Encode(f)
	return dst
}

// AtomicAckETH is a view of an atomic acknowledge extended transport header: the value the target held
// before the atomic executed. IBTA Vol 1 9.3 (AtomicAckETH).
type AtomicAckETH []byte

// OrigData returns the original remote data.
func (a AtomicAckETH) OrigData() uint64 { return binary.BigEndian.Uint64(a) }

// SetOrigData sets the original remote data.
func (a AtomicAckETH) SetOrigData(v uint64) { binary.BigEndian.PutUint64(a, v) }

// ImmDt is a view of the immediate data header: 4 bytes the sender hands to the receiver's completion.
// libibverbs keeps it in network byte order (imm_data is __be32); goroce presents it as the big-endian
// integer. IBTA Vol 1 9.3 (ImmDt).
type ImmDt []byte

// Imm returns the immediate data.
func (i ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(i) }

// SetImm sets the immediate data.
func (i ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(i, v) }

// IETH is a view of the invalidate extended transport header of SEND_WITH_INVALIDATE: the rkey the
// responder invalidates. IBTA Vol 1 9.3 (IETH).
type IETH []byte

// RKey returns the remote key to invalidate.
func (i IETH) RKey() RKey { return RKey(binary.BigEndian.Uint32(i)) }

// SetRKey sets the remote key to invalidate.
func (i IETH) SetRKey(k RKey) { binary.BigEndian.PutUint32(i, uint32(k)) }

// DETH is a view of a datagram extended transport header: the queue key and the sender's QP of a UD
// datagram. IBTA Vol 1 9.3 (DETH).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                             Q_Key                             |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|    Resv8      |                     SrcQP                     |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type DETH []byte

// DETHFields holds every field of a DETH.
type DETHFields struct {
	QKey  QKey
	Resv8 uint8
	SrcQP QPN
}

// QKey returns the queue key.
func (d DETH) QKey() QKey { return QKey(binary.BigEndian.Uint32(d[0:])) }

// SrcQP returns the sender's queue pair number.
func (d DETH) SrcQP() QPN { return QPN(get24(d[5:])) }

// Fields decodes the whole header.
func (d DETH) Fields() DETHFields { return DETHFields{QKey: d.QKey(), Resv8: d[4], SrcQP: d.SrcQP()} }

// Encode writes all of f into d.
func (d DETH) Encode(f *DETHFields) {
	binary.BigEndian.PutUint32(d[0:], uint32(f.QKey))
	d[4] = f.Resv8
	put24(d[5:], uint32(f.SrcQP))
}

// Append appends the encoding of f to dst.
func (f *DETHFields) Append(dst []byte) []byte {
	dst, h := grow(dst, DETHLen)
	DETH(h).Encode(f)
	return dst
}

// FETH is a view of the flush extended transport header of a FLUSH request: which placement the flush
// asks for and over what range. IBTA 1.5 Memory Placement Extensions; Linux rxe_hdr.h (struct rxe_feth).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                     Reserved                      |SEL|  PLT  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
type FETH []byte

// Flush placement types and selectivity levels. Linux include/rdma/ib_verbs.h (IB_FLUSH_*).
const (
	FlushGlobal     = 1 // placement type: global visibility
	FlushPersistent = 2 // placement type: persistence
	FlushRange      = 0 // selectivity level: the RETH's range
	FlushMR         = 1 // selectivity level: the whole memory region
)

// Bits returns the whole 32-bit word.
func (f FETH) Bits() uint32 { return binary.BigEndian.Uint32(f) }

// PlacementType returns the placement type (bits 3..0).
func (f FETH) PlacementType() uint8 { return uint8(f.Bits() & 0xF) }

// SelectivityLevel returns the selectivity level (bits 5..4).
func (f FETH) SelectivityLevel() uint8 { return uint8(f.Bits()>>4) & 0x3 }

// SetBits sets the whole 32-bit word.
func (f FETH) SetBits(v uint32) { binary.BigEndian.PutUint32(f, v) }
