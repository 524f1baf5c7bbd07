package wire

import (
	"encoding/binary"
	"hash/crc32"
	"sync"
)

// Verifying the ICRC of a RoCEv2 packet that arrived on a plain UDP socket.
//
// The ICRC covers the IPv4 identification field and the DF flag (IBTA Annex A17 masks only TOS, TTL and
// the header checksum of an IPv4 header), but a UDP socket shows neither. rxe numbers the identification
// per packet; ConnectX and rxe set DF; a Linux sender with IP_PMTUDISC_DO sends identification 0 with DF,
// which is what goroce itself sends. The missing 16 bits (17 with DF) are reconstructed from the received
// ICRC instead of guessed.
//
// CRC-32 is affine over GF(2). For packets of one length, changing the bytes at IPv4 offsets 4..6
// (identification, flags) by δ changes the ICRC by L_T(δ) = Z^T · raw(δ), where raw(δ) is the CRC
// register (init 0, no final inversion) after the three bytes of δ, Z is the 32x32 matrix of one zero
// byte (s ↦ table[s&0xFF] ^ s>>8) and T is the number of bytes the ICRC covers after IPv4 offset 6.
// Z is invertible (the polynomial has a constant term). So with c the ICRC of the caller's template and
// r the received one, the identification and flags that produced r satisfy
//
//	Z^-T · (c ⊕ r) = raw(δ)
//
// The 16 vectors raw(δ) of the identification bits are independent: a nonzero δ confined to 16 bits is a
// burst of at most 16 bits, which CRC-32 always detects, so raw(δ) ≠ 0. Extended by unit vectors to a
// basis Q of GF(2)^32, Q^-1 · Z^-T · (c ⊕ r) gives the identification delta in its low 16 bits and a
// 16-bit syndrome in its high bits that is zero exactly when some identification matches. Toggling DF
// adds the constant Q^-1 · raw(0, 0, 0x40). At most one (identification, DF) pair can match: two would
// differ by a nonzero δ confined to 24 bits, again a burst CRC-32 detects.
//
// Only Z^-(2^i) for i < 16 is precomputed (T < 2^16 for any IPv4 packet). Z^-T for a length is built on
// first use from one column, Z^-T · e31 (the polynomial x^(-8T) mod G in the reflected representation):
// the others follow by multiplying by x, which commutes with Z. The product Q^-1 · Z^-T is kept, as
// nibble tables, for the last few lengths seen.

// ipv4DFBit is the Don't Fragment flag in byte 6 of an IPv4 header. RFC 791 3.1.
const ipv4DFBit = 0x40

// ipv4IDOff is the offset of the 16-bit identification field in an IPv4 header. RFC 791 3.1.
const ipv4IDOff = 4

// ipv4FlagsOff is the offset of the byte holding the flags (reserved, DF, MF) of an IPv4 header.
const ipv4FlagsOff = 6

// ipv4MaxLen is the largest IPv4 packet the total length field can describe.
const ipv4MaxLen = 0xFFFF

// idPowers is the number of precomputed powers Z^-(2^i): enough for any T below ipv4MaxLen.
const idPowers = 16

// idCacheSize is how many per-length solvers an IDRecovery keeps. RoCE traffic on a QP has few distinct
// lengths: full-MTU packets, ACKs, read requests and the last packet of each message.
const idCacheSize = 8

// crcPoly is the reflected CRC-32 (IEEE 802.3) polynomial.
const crcPoly = 0xEDB88320

var errICRCNoID = detail(ErrICRC, "wire: ICRC matches no IPv4 identification and DF flag")

// gf2Mat is a 32x32 matrix over GF(2) stored by columns: column j is the image of bit j.
type gf2Mat [32]uint32

// mul returns m·v.
func (m *gf2Mat) mul(v uint32) uint32 {
	var r uint32
	for j := range 32 {
		r ^= m[j] & -(v >> j & 1)
	}
	return r
}

// times returns m·b.
func (m *gf2Mat) times(b *gf2Mat) (p gf2Mat) {
	for j := range 32 {
		p[j] = m.mul(b[j])
	}
	return p
}

// inverse returns m^-1 by Gauss-Jordan elimination on columns, and false if m is singular.
func (m gf2Mat) inverse() (inv gf2Mat, ok bool) {
	// Column operations on m, mirrored on inv (starting at I), turn m into I and inv into m^-1.
	for j := range 32 {
		inv[j] = 1 << j
	}
	for row := range 32 {
		p := -1
		for j := row; j < 32; j++ {
			if m[j]>>row&1 != 0 {
				p = j
				break
			}
		}
		if p < 0 {
			return inv, false
		}
		m[row], m[p] = m[p], m[row]
		inv[row], inv[p] = inv[p], inv[row]
		for j := range 32 {
			if j != row && m[j]>>row&1 != 0 {
				m[j] ^= m[row]
				inv[j] ^= inv[row]
			}
		}
	}
	return inv, true
}

// nibbleMap is a gf2Mat as eight 16-entry tables, one per input nibble: eight loads per product.
type nibbleMap [8][16]uint32

func newNibbleMap(m *gf2Mat) (t nibbleMap) {
	for i := range 8 {
		for n := 1; n < 16; n++ {
			low := n & -n // lowest set bit; t[i][n] = t[i][n without it] ^ its column
			t[i][n] = t[i][n^low] ^ m[4*i+bitIndex(low)]
		}
	}
	return t
}

func bitIndex(b int) int {
	i := 0
	for b > 1 {
		b >>= 1
		i++
	}
	return i
}

// apply returns the product of the matrix with v.
func (t *nibbleMap) apply(v uint32) uint32 {
	return t[0][v&15] ^ t[1][v>>4&15] ^ t[2][v>>8&15] ^ t[3][v>>12&15] ^
		t[4][v>>16&15] ^ t[5][v>>20&15] ^ t[6][v>>24&15] ^ t[7][v>>28]
}

// rawCRC continues a CRC register without the pre- and post-inversion crc32.Update applies: the linear
// part of the ICRC.
func rawCRC(s uint32, p ...byte) uint32 {
	for _, b := range p {
		s = crc32.IEEETable[byte(s)^b] ^ s>>8
	}
	return s
}

// zeroByte is Z: the CRC register after one zero byte.
func zeroByte(s uint32) uint32 { return rawCRC(s, 0) }

// mulX multiplies a reflected CRC register by x modulo the polynomial.
func mulX(s uint32) uint32 { return s>>1 ^ crcPoly&-(s&1) }

// idTables are the constants of identification recovery, shared by every IDRecovery.
type idTables struct {
	zinvPow [idPowers]nibbleMap // Z^-(2^i)
	solve   nibbleMap           // Q^-1: coordinates in the basis whose first 16 vectors are raw(ID bit i)
	basis   [16]uint32          // raw(δ) of identification bit i, for the tests
	dfCoord uint32              // Q^-1 · raw(0, 0, DF)
}

var idTablesOnce = sync.OnceValue(func() *idTables {
	t := new(idTables)
	var z gf2Mat
	for j := range 32 {
		z[j] = zeroByte(1 << j)
	}
	p, ok := z.inverse()
	if !ok {
		panic("wire: zero-byte CRC step is singular")
	}
	for i := range idPowers {
		t.zinvPow[i] = newNibbleMap(&p)
		p = p.times(&p)
	}

	// Q: the identification basis, completed with unit vectors.
	var q gf2Mat
	var echelon [32]uint32 // reduced vectors by leading bit, to test independence
	add := func(v uint32) bool {
		for b := 31; b >= 0; b-- {
			if v>>b&1 == 0 {
				continue
			}
			if echelon[b] == 0 {
				echelon[b] = v
				return true
			}
			v ^= echelon[b]
		}
		return false
	}
	n := 0
	for i := range 16 {
		id := uint16(1) << i
		t.basis[i] = rawCRC(0, byte(id>>8), byte(id), 0)
		if !add(t.basis[i]) {
			panic("wire: identification basis is dependent")
		}
		q[n] = t.basis[i]
		n++
	}
	for j := 0; n < 32; j++ {
		if add(1 << j) {
			q[n] = 1 << j
			n++
		}
	}
	qinv, ok := q.inverse()
	if !ok {
		panic("wire: identification basis is singular")
	}
	t.solve = newNibbleMap(&qinv)
	t.dfCoord = t.solve.apply(rawCRC(0, 0, 0, ipv4DFBit))
	return t
})

// zinv returns Z^-n · v.
func (t *idTables) zinv(n int, v uint32) uint32 {
	for i := 0; n != 0; i, n = i+1, n>>1 {
		if n&1 != 0 {
			v = t.zinvPow[i].apply(v)
		}
	}
	return v
}

// solver returns Q^-1 · Z^-n as nibble tables.
func (t *idTables) solver(n int) (m nibbleMap) {
	var c gf2Mat
	c[31] = t.zinv(n, 1<<31)
	for j := 31; j > 0; j-- {
		c[j-1] = mulX(c[j])
	}
	for j := range 32 {
		c[j] = t.solve.apply(c[j])
	}
	return newNibbleMap(&c)
}

// IDRecovery verifies the ICRC of IPv4 RoCEv2 packets whose IPv4 identification and DF flag the receiver
// cannot see, as on a plain UDP socket, by solving for them. Its zero value is ready to use. It caches
// per-length tables, so it is not safe for concurrent use: keep one per receive goroutine.
//
// What it guarantees, compared with a full ICRC check (VerifyICRC over the header the packet came in):
//
//   - Every packet a full check accepts is accepted, with the identification and DF flag it was sent
//     with (at most one pair matches).
//   - An error confined to the identification and DF bits is undetectable: the packet is accepted with
//     the corrupted values. The kernel drops IPv4 packets whose header checksum fails, and that checksum
//     covers both fields.
//   - Any other error is missed when it equals the ICRC contribution of some identification and DF pair.
//     17 of the 32 check bits (16 with RequireDF) are spent on solving, so a random error gets through
//     with probability 2^17/2^32 = 2^-15 (2^-16) instead of 2^-32.
//   - CRC-32's burst guarantee (every error burst of up to 32 bits detected) holds only for bursts that,
//     together with the identification and flags bytes, still span at most 32 bits. Far from them even
//     single-bit errors can be missed: a flip at distance k is missed when x^k mod the CRC polynomial
//     falls in the space the identification and DF span, which happens at fixed distances. The first is
//     bit 3 of the byte 194 bytes after the flags byte (transport offset 173 behind a 20-byte IPv4
//     header; or the ICRC itself for transport packets of 170 to 173 bytes before the ICRC), then bit 6
//     at 1855 bytes; both match only with DF toggled. With DF fixed the first is at 26765 bytes, beyond
//     any RoCE packet, so with RequireDF every single-bit error is detected.
//
// Other header fields the ICRC covers (addresses, lengths, protocol, UDP ports, a zero fragment offset)
// are checked as in a full check, against the values the caller put in the template.
//
// RequireDF is the better choice whenever every peer sets DF, as rxe, ConnectX and goroce do.
type IDRecovery struct {
	// RequireDF accepts only packets sent with DF set: a template with DF clear never matches as given,
	// and the search does not try DF clear.
	RequireDF bool

	clock uint32 // ticks on every cache use, for least-recently-used replacement
	cache [idCacheSize]idSolver
}

// idSolver is Q^-1 · Z^-t for one t; t == 0 marks an empty slot (t is at least 13+8+12).
type idSolver struct {
	t    int
	used uint32
	m    nibbleMap
}

// VerifyIPv4 checks the ICRC at the end of pkt, a whole transport packet, against udp, its UDP header,
// and ip, a template of the IPv4 header it came in: version 4, IHL and options, total length, flags and
// fragment offset, protocol and addresses as the receiver knows or assumes them; TOS, TTL and checksum
// are arbitrary (the ICRC masks them); identification and DF are a first guess.
//
// It tries the template as given (the fast path: goroce peers send identification 0 with DF set, and a
// goroce receiver should guess that), then the one identification that matches with DF set, then, unless
// RequireDF, with DF clear. It returns the identification and DF flag that made the ICRC match, or an
// error matching ErrICRC if none does. ip is not modified. See IDRecovery for what this proves. IBTA Annex A17 (ICRC).
func (r *IDRecovery) VerifyIPv4(ip, udp, pkt []byte) (id uint16, df bool, err error) {
	if len(pkt) < BTHLen+ICRCLen {
		return 0, false, ErrTruncated
	}
	if len(ip) < ipv4MinHeaderLen || ip[0]>>4 != 4 || len(ip)+len(udp)+len(pkt) > ipv4MaxLen {
		return 0, false, ErrIPHeader
	}
	n := len(pkt) - ICRCLen
	c, err := ComputeICRC(ip, udp, pkt[:n])
	if err != nil {
		return 0, false, err
	}
	id = binary.BigEndian.Uint16(ip[ipv4IDOff:])
	df = ip[ipv4FlagsOff]&ipv4DFBit != 0
	d := c ^ binary.LittleEndian.Uint32(pkt[n:])
	if d == 0 && (df || !r.RequireDF) {
		return id, df, nil
	}

	tab := idTablesOnce()
	v := r.solver(tab, len(ip)-(ipv4FlagsOff+1)+len(udp)+n).apply(d)
	if !df {
		v ^= tab.dfCoord
	}
	if v>>16 == 0 {
		return id ^ uint16(v), true, nil
	}
	if r.RequireDF {
		return 0, false, errICRCNoID
	}
	v ^= tab.dfCoord
	if v>>16 == 0 {
		return id ^ uint16(v), false, nil
	}
	return 0, false, errICRCNoID
}

// solver returns the cached Q^-1 · Z^-t, building it in the least recently used slot on a miss.
func (r *IDRecovery) solver(tab *idTables, t int) *nibbleMap {
	r.clock++
	lru := 0
	for i := range r.cache {
		s := &r.cache[i]
		if s.t == t {
			s.used = r.clock
			return &s.m
		}
		if s.used < r.cache[lru].used {
			lru = i
		}
	}
	s := &r.cache[lru]
	s.t, s.used, s.m = t, r.clock, tab.solver(t)
	return &s.m
}
