package mr

import (
	"math/rand/v2"
	"testing"
)

// TestSpeckVector checks the Speck32/64 test vector of Beaulieu et al., appendix C.
func TestSpeckVector(t *testing.T) {
	s := newSpeck([4]uint16{0x1918, 0x1110, 0x0908, 0x0100})
	const plain, cipher = 0x6574694c, 0xa86842f2
	if got := s.encrypt(plain); got != cipher {
		t.Errorf("encrypt(%#x) = %#x, want %#x", plain, got, cipher)
	}
	if got := s.decrypt(cipher); got != plain {
		t.Errorf("decrypt(%#x) = %#x, want %#x", cipher, got, plain)
	}
}

func TestSpeckRoundTrip(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	s := newSpeck([4]uint16{uint16(rng.Uint32()), uint16(rng.Uint32()), uint16(rng.Uint32()), uint16(rng.Uint32())})
	for range 100000 {
		v := rng.Uint32()
		if got := s.decrypt(s.encrypt(v)); got != v {
			t.Fatalf("seed %d: decrypt(encrypt(%#x)) = %#x", seed, v, got)
		}
	}
}

// TestKeysUnrelated checks that the keys of consecutive slots do not share the plain key's structure:
// no fixed XOR or difference links them, and lkeys differ from rkeys.
func TestKeysUnrelated(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	const n = 64
	var regions [n]*Region
	for i := range regions {
		regions[i] = mustRegister(t, tb, pd, make([]byte, 8), allRemote)
	}
	xors := map[uint32]bool{}
	diffs := map[uint32]bool{}
	for i := 1; i < n; i++ {
		a, b := uint32(regions[i-1].RKey()), uint32(regions[i].RKey())
		xors[a^b] = true
		diffs[b-a] = true
		if uint32(regions[i].LKey()) == uint32(regions[i].RKey()) {
			t.Errorf("region %d: lkey equals rkey %v", i, regions[i].RKey())
		}
	}
	// Plain keys of consecutive slots differ by exactly 1<<8 (apart from the key part); published keys
	// must show (almost) no repeated relation.
	if len(xors) < n-3 || len(diffs) < n-3 {
		t.Errorf("consecutive rkeys show structure: %d distinct XORs, %d distinct differences of %d", len(xors), len(diffs), n-1)
	}
}
