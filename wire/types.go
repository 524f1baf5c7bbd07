package wire

import "fmt"

// psnBits is the width of a packet sequence number. IBTA Vol 1 9.7.1 (PSN).
const psnBits = 24

// PSNMask keeps the low 24 bits of a value: PSNs, QPNs and MSNs are all 24-bit fields.
const PSNMask = 1<<psnBits - 1

// PSN is a 24-bit packet sequence number. Arithmetic wraps modulo 2^24 and comparisons use serial number
// arithmetic over a window of ±2^23, as rxe's psn_compare does. IBTA Vol 1 9.7.1 (PSN).
type PSN uint32

// Add returns the PSN n packets after p, wrapping modulo 2^24.
func (p PSN) Add(n uint32) PSN { return PSN((uint32(p) + n) & PSNMask) }

// Sub returns the PSN n packets before p, wrapping modulo 2^24.
func (p PSN) Sub(n uint32) PSN { return PSN((uint32(p) - n) & PSNMask) }

// Diff returns the signed distance p - q in packets, in the range [-2^23, 2^23). A positive result means p
// comes after q.
func (p PSN) Diff(q PSN) int32 { return int32((uint32(p)-uint32(q))<<(32-psnBits)) >> (32 - psnBits) }

// Before reports whether p comes strictly before q in serial number order.
func (p PSN) Before(q PSN) bool { return p.Diff(q) < 0 }

// After reports whether p comes strictly after q in serial number order.
func (p PSN) After(q PSN) bool { return p.Diff(q) > 0 }

// InWindow reports whether p lies in the n PSNs starting at start: start <= p < start+n, modulo 2^24.
// n above 2^24 is treated as the whole space.
func (p PSN) InWindow(start PSN, n uint32) bool { return (uint32(p)-uint32(start))&PSNMask < n }

// Valid reports whether p fits in 24 bits.
func (p PSN) Valid() bool { return uint32(p) <= PSNMask }

func (p PSN) String() string { return fmt.Sprintf("%#06x", uint32(p)) }

// QPN is a 24-bit queue pair number. QPN 0 is the SMI (unused on RoCE), QPN 1 the GSI that carries
// management datagrams such as the CM's. IBTA Vol 1 chapter 3 (queue pairs).
type QPN uint32

// Well-known queue pair numbers. IBTA Vol 1 chapter 13 (QP0, QP1).
const (
	QPNSMI QPN = 0 // subnet management; not used on RoCE
	QPNGSI QPN = 1 // general services: CM and other MADs
)

// Valid reports whether q fits in 24 bits.
func (q QPN) Valid() bool { return uint32(q) <= PSNMask }

func (q QPN) String() string { return fmt.Sprintf("%#06x", uint32(q)) }

// MSN is the 24-bit message sequence number a responder returns in AETH: the count of messages it has
// completed. IBTA Vol 1 9.7.5 (MSN).
type MSN uint32

// Add returns the MSN n messages after m, wrapping modulo 2^24.
func (m MSN) Add(n uint32) MSN { return MSN((uint32(m) + n) & PSNMask) }

// PKey is the 16-bit partition key in the BTH. RoCE peers use the default full-member key 0xFFFF.
// IBTA Vol 1 10.9 (Partitioning).
type PKey uint16

// DefaultPKey is the default partition key: full membership of the default partition.
const DefaultPKey PKey = 0xFFFF

// QKey is the 32-bit queue key a UD datagram carries in its DETH. IBTA Vol 1 10.2 (Q_Keys).
type QKey uint32

// GSIQKey is the Q_Key of QP1; rxe forces it on send and checks it on receive. IBTA Vol 1 chapter 13 (GSI).
const GSIQKey QKey = 0x80010000

// RKey is the 32-bit remote key that names a memory region to a remote peer in RETH, AtomicETH and
// IETH. IBTA Vol 1 10.6 (memory keys).
type RKey uint32

func (k RKey) String() string { return fmt.Sprintf("%#08x", uint32(k)) }

// LKey is the 32-bit local key a work request's scatter/gather elements name a memory region with.
// It never appears on the wire. IBTA Vol 1 10.6 (memory keys).
type LKey uint32

func (k LKey) String() string { return fmt.Sprintf("%#08x", uint32(k)) }

// MTU is a path MTU in the enumeration libibverbs uses (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5): the largest
// payload one packet carries. IBTA Vol 1 chapter 7 (MTU).
type MTU uint8

// The path MTUs InfiniBand defines.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// MaxPayload is the largest payload a single packet may carry: the largest MTU, 4096 bytes.
const MaxPayload = 4096

// Bytes returns the payload size of m in bytes, or 0 if m is not a valid MTU.
func (m MTU) Bytes() int {
	if !m.Valid() {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is one of the five defined MTUs.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// MTUFromBytes returns the MTU whose payload size is n bytes, and false if n is not one of 256, 512,
// 1024, 2048 and 4096.
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

func (m MTU) String() string {
	if !m.Valid() {
		return fmt.Sprintf("MTU(%d)", uint8(m))
	}
	return fmt.Sprintf("%d", m.Bytes())
}
