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

// TestKeyMemo checks that the memo gives what the cipher gives: for keys never seen (the low ones
// included, which the memo's initial entries sit next to), for a key seen before, and for keys that
// share a memo entry and evict each other.
func TestKeyMemo(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	c := newKeyCipher(newSpeck([4]uint16{uint16(rng.Uint32()), uint16(rng.Uint32()), uint16(rng.Uint32()), uint16(rng.Uint32())}))
	check := func(key uint32) {
		t.Helper()
		if got, want := c.decrypt(key), c.speck.decrypt(key); got != want {
			t.Fatalf("seed %d: memo decrypt(%#x) = %#x, the cipher gives %#x", seed, key, got, want)
		}
	}
	for key := range uint32(2 * keyMemoSize) {
		check(key)
		check(key)
	}
	for range 100000 {
		a := rng.Uint32()
		b := a ^ rng.Uint32()<<8 // the same entry, another key
		check(a)
		check(b)
		check(a)
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

// A seeded table hands out the same keys for the same registrations, and different seeds different
// keys: simulations replay bit for bit.
func TestSeededTable(t *testing.T) {
	keys := func(seed byte) (lk []uint32, rk []uint32) {
		tb := NewTableSeeded([32]byte{seed})
		pd := tb.AllocPD()
		for i := 0; i < 8; i++ {
			r, err := tb.Register(pd, make([]byte, 64), LocalWrite|RemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			lk, rk = append(lk, uint32(r.LKey())), append(rk, uint32(r.RKey()))
		}
		return lk, rk
	}
	l1, r1 := keys(1)
	l2, r2 := keys(1)
	_, r3 := keys(2)
	for i := range l1 {
		if l1[i] != l2[i] || r1[i] != r2[i] {
			t.Fatalf("same seed, key %d differs: %#x/%#x vs %#x/%#x", i, l1[i], r1[i], l2[i], r2[i])
		}
	}
	same := 0
	for i := range r1 {
		if r1[i] == r3[i] {
			same++
		}
	}
	if same > 1 {
		t.Fatalf("%d of 8 rkeys equal under different seeds", same)
	}
}
