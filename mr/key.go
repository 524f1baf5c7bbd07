package mr

import (
	"crypto/rand"
	"math/bits"
	"sync/atomic"
)

// A published key (lkey or rkey) is a keyed 32-bit permutation of a plain key:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  slot index                   |    key part   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// the same layout rxe uses for its keys (index << 8 | key). The key part starts at a random value for a
// fresh slot and advances by one on every reuse and every revalidation, so a stale key finds its slot
// but not its key part. The permutation is the Speck32/64 block cipher under a per-table random key,
// one for lkeys and another for rkeys: keys reveal nothing about each other, an rkey is no lkey, and a
// peer holding some rkeys cannot derive the next one. A 32-bit key can still be guessed by brute force
// (one in 2^32 per try for a single region), as with any RDMA device.
const (
	keyPartBits = 8
	keyPartMask = 1<<keyPartBits - 1
	slotBits    = 32 - keyPartBits

	// maxSlots is the number of region slots in a table: every index a plain key can hold.
	maxSlots = 1 << slotBits
)

// plainKey builds the plain key of slot index with key part k.
func plainKey(index uint32, k uint8) uint32 { return index<<keyPartBits | uint32(k) }

// speck is Speck32/64: a 32-bit block, a 64-bit key, 22 rounds of 16-bit add-rotate-xor. Beaulieu et
// al., "The SIMON and SPECK Families of Lightweight Block Ciphers", NSA 2013, section 4.
type speck struct {
	rk [speckRounds]uint16
}

// Speck32/64 parameters: 22 rounds, rotations alpha=7 and beta=2, four 16-bit key words.
const (
	speckRounds = 22
	speckAlpha  = 7
	speckBeta   = 2
)

// newSpeck expands the key words (l2, l1, l0, k0), in the order the paper's test vectors list them.
func newSpeck(key [4]uint16) speck {
	var s speck
	var l [speckRounds + 2]uint16
	l[2], l[1], l[0], s.rk[0] = key[0], key[1], key[2], key[3]
	for i := 0; i < speckRounds-1; i++ {
		l[i+3] = (s.rk[i] + bits.RotateLeft16(l[i], -speckAlpha)) ^ uint16(i)
		s.rk[i+1] = bits.RotateLeft16(s.rk[i], speckBeta) ^ l[i+3]
	}
	return s
}

// encrypt maps a plain key to a published key. The block's high half is the cipher's x word.
func (s *speck) encrypt(v uint32) uint32 {
	x, y := uint16(v>>16), uint16(v)
	for _, k := range s.rk {
		x = (bits.RotateLeft16(x, -speckAlpha) + y) ^ k
		y = bits.RotateLeft16(y, speckBeta) ^ x
	}
	return uint32(x)<<16 | uint32(y)
}

// decrypt maps a published key back to its plain key.
func (s *speck) decrypt(v uint32) uint32 {
	x, y := uint16(v>>16), uint16(v)
	for i := speckRounds - 1; i >= 0; i-- {
		y = bits.RotateLeft16(y^x, -speckBeta)
		x = bits.RotateLeft16((x^s.rk[i])-y, speckAlpha)
	}
	return uint32(x)<<16 | uint32(y)
}

// keyCipher is one key permutation (lkeys or rkeys) with a memo of its recent decryptions.
type keyCipher struct {
	speck
	memo keyMemo
}

func newKeyCipher(s speck) *keyCipher {
	c := &keyCipher{speck: s}
	c.memo.init()
	return c
}

// keyMemoSize is the number of entries in a keyMemo: a power of two.
const keyMemoSize = 256

// keyMemo remembers recent decryptions of one keyCipher. The data path names the same few keys packet
// after packet (a WRITE stream checks one rkey at the responder and one lkey at the requester for every
// packet), and the cipher's 22 dependent rounds cost about as much as the rest of the check: with the
// memo they are paid once per key, not once per packet. It is direct-mapped on the published key's low
// bits (the cipher spreads them). Each entry holds a published key in its high half and its plain key in
// its low half, loaded and stored as one word, so a reader sees a whole pair, hit or miss; a wrong plain
// key can never come out of it.
type keyMemo [keyMemoSize]atomic.Uint64

// init fills every entry with a published key that cannot be looked up in it: entry i holds key
// i+1 (mod keyMemoSize), which maps to entry i+1.
func (m *keyMemo) init() {
	for i := range m {
		m[i].Store(uint64((i+1)%keyMemoSize) << 32)
	}
}

// decrypt maps a published key back to its plain key, as c.speck.decrypt does.
func (c *keyCipher) decrypt(key uint32) uint32 {
	e := &c.memo[key%keyMemoSize]
	if v := e.Load(); uint32(v>>32) == key {
		return uint32(v)
	}
	p := c.speck.decrypt(key)
	e.Store(uint64(key)<<32 | uint64(p))
	return p
}

// randomBytes fills b from crypto/rand.
func randomBytes(b []byte) {
	rand.Read(b) // never fails since Go 1.24
}
