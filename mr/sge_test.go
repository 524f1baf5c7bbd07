package mr

import (
	"bytes"
	"math"
	"testing"

	"github.com/goroce/goroce/wire"
)

func TestSGLength(t *testing.T) {
	for _, tc := range []struct {
		sgl  []SGE
		want uint32
		err  error
	}{
		{nil, 0, nil},
		{[]SGE{{Length: 3}, {Length: 0}, {Length: 5}}, 8, nil},
		{[]SGE{{Length: MaxMessage}}, MaxMessage, nil},
		{[]SGE{{Length: MaxMessage}, {Length: 1}}, 0, ErrLength},
		{[]SGE{{Length: math.MaxUint32}, {Length: math.MaxUint32}}, 0, ErrLength},
	} {
		if got, err := SGLength(tc.sgl); got != tc.want || err != tc.err {
			t.Errorf("SGLength(%v) = %d, %v, want %d, %v", tc.sgl, got, err, tc.want, tc.err)
		}
	}
}

// sgFixture is three regions of 16 bytes in guarded buffers, one read-only, and an SGE list over them:
// 4 bytes of a, 0 bytes with a garbage key, 16 bytes of b, 6 bytes of ro.
type sgFixture struct {
	tb        *Table
	pd, pd2   *PD
	a, b, ro  []byte
	ra, rb    *Region
	rro       *Region
	sgl       []SGE
	writeable []SGE // the first three elements
}

func newSGFixture(t *testing.T) *sgFixture {
	f := &sgFixture{tb: NewTable()}
	f.pd, f.pd2 = f.tb.AllocPD(), f.tb.AllocPD()
	f.a, f.b, f.ro = guardedBuf(t, 16, 0), guardedBuf(t, 16, 1), guardedBuf(t, 16, 2)
	f.ra = mustRegister(t, f.tb, f.pd, f.a, LocalWrite, WithIOVA(0x1000))
	f.rb = mustRegister(t, f.tb, f.pd, f.b, LocalWrite)
	f.rro = mustRegister(t, f.tb, f.pd, f.ro, 0, WithIOVA(0x3000))
	f.sgl = []SGE{
		{0x1000 + 12, 4, f.ra.LKey()},
		{0xdead, 0, 0x1234},
		{f.rb.IOVA(), 16, f.rb.LKey()},
		{0x3000 + 10, 6, f.rro.LKey()},
	}
	f.writeable = f.sgl[:3]
	return f
}

func TestScatterGather(t *testing.T) {
	f := newSGFixture(t)
	tb, pd := f.tb, f.pd
	msg := []byte("0123456789abcdefghij") // 20 bytes: 4 into a, 16 into b

	// Scatter packet by packet at offsets, as a receive of several packets does.
	for _, cut := range [][2]int{{0, 3}, {3, 9}, {9, 20}} {
		if err := tb.Scatter(pd, f.writeable, uint64(cut[0]), msg[cut[0]:cut[1]]); err != nil {
			t.Fatalf("Scatter [%d,%d): %v", cut[0], cut[1], err)
		}
	}
	if !bytes.Equal(f.a[12:], msg[:4]) || !bytes.Equal(f.b, msg[4:]) {
		t.Fatalf("after Scatter a=%q b=%q", f.a, f.b)
	}
	if !bytes.Equal(f.a[:12], make([]byte, 12)) {
		t.Fatalf("Scatter wrote before the element: %q", f.a)
	}

	// Gather every window back, including the read-only tail (local read needs no right).
	copy(f.ro[10:], "KLMNOP")
	whole := append(append([]byte{}, msg...), "KLMNOP"...)
	for off := 0; off <= len(whole); off++ {
		for n := 0; off+n <= len(whole); n++ {
			dst := make([]byte, n)
			if err := tb.Gather(pd, f.sgl, uint64(off), dst); err != nil || !bytes.Equal(dst, whole[off:off+n]) {
				t.Fatalf("Gather(off %d, %d bytes) = %q, %v", off, n, dst, err)
			}
			refs, err := tb.GatherRefs(pd, f.sgl, uint64(off), n, nil)
			if got := bytes.Join(refs, nil); err != nil || !bytes.Equal(got, whole[off:off+n]) {
				t.Fatalf("GatherRefs(off %d, %d bytes) = %q, %v", off, n, got, err)
			}
		}
	}

	for _, tc := range []struct {
		name    string
		scatter bool
		pd      *PD
		sgl     []SGE
		off     uint64
		n       int
		err     error
	}{
		{"scatter past the list", true, pd, f.writeable, 10, 11, ErrLength},
		{"scatter offset past the list", true, pd, f.writeable, 21, 0, nil},
		{"scatter offset past the list, data", true, pd, f.writeable, 21, 1, ErrLength},
		{"gather past the list", false, pd, f.sgl, 0, 27, ErrLength},
		{"scatter into read-only", true, pd, f.sgl, 20, 1, ErrPermission},
		{"scatter from another PD", true, f.pd2, f.writeable, 0, 1, ErrWrongPD},
		{"gather from another PD", false, f.pd2, f.sgl, 4, 1, ErrWrongPD},
		{"gather with an rkey", false, pd, []SGE{{0x1000, 1, lkeyOf(f.ra.RKey())}}, 0, 1, ErrBadKey},
		{"element past the region", true, pd, []SGE{{0x1000 + 8, 9, f.ra.LKey()}}, 8, 1, ErrBounds},
		{"element before the region", false, pd, []SGE{{0x1000 - 1, 2, f.ra.LKey()}}, 0, 1, ErrBounds},
		{"element wrapping past 2^64", false, pd, []SGE{{math.MaxUint64 - 1, 4, f.ra.LKey()}}, 0, 1, ErrBounds},
		{"zero-length element, bad key", true, pd, []SGE{{0, 0, 1}, {0x1000, 1, f.ra.LKey()}}, 0, 1, nil},
	} {
		var err error
		buf := bytes.Repeat([]byte{0xFF}, tc.n)
		before := append(append([]byte{}, f.a...), f.b...)
		if tc.scatter {
			err = tb.Scatter(tc.pd, tc.sgl, tc.off, buf)
		} else {
			err = tb.Gather(tc.pd, tc.sgl, tc.off, buf)
			if _, rerr := tb.GatherRefs(tc.pd, tc.sgl, tc.off, tc.n, nil); rerr != err {
				t.Errorf("%s: GatherRefs %v, Gather %v", tc.name, rerr, err)
			}
		}
		if err != tc.err {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
		if tc.err == ErrLength && !bytes.Equal(before, append(append([]byte{}, f.a...), f.b...)) {
			t.Errorf("%s: a length error wrote memory", tc.name)
		}
		if tc.err == nil && tc.scatter && tc.n == 1 && f.a[0] != 0xFF {
			t.Errorf("%s: byte not written", tc.name)
		}
	}
}

// lkeyOf reinterprets an rkey as an lkey, for tests that cross them.
func lkeyOf[K ~uint32](k K) wire.LKey { return wire.LKey(k) }

// TestCheckSGL: a post's check of its gather or scatter list. Every element is checked whole, with
// the rights asked for; an element of length 0 is not checked at all (IBTA Vol 1 C9-88).
func TestCheckSGL(t *testing.T) {
	f := newSGFixture(t)
	tb, pd := f.tb, f.pd
	for _, tc := range []struct {
		name string
		pd   *PD
		sgl  []SGE
		want Access
		err  error
	}{
		{"gather list, a zero-length element with a bad key", pd, f.sgl, 0, nil},
		{"scatter list", pd, f.writeable, LocalWrite, nil},
		{"scatter into the read-only region", pd, f.sgl, LocalWrite, ErrPermission},
		{"another PD", f.pd2, f.writeable, 0, ErrWrongPD},
		{"element past its region", pd, []SGE{{0x1000 + 12, 5, f.ra.LKey()}}, 0, ErrBounds},
		{"element wrapping past 2^64", pd, []SGE{{math.MaxUint64 - 1, 4, f.ra.LKey()}}, 0, ErrBounds},
		{"unknown key", pd, []SGE{{0x1000, 1, 0x7777}}, 0, ErrBadKey},
		{"empty list", pd, nil, LocalWrite, nil},
	} {
		if err := tb.CheckSGL(tc.pd, tc.sgl, tc.want); err != tc.err {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
	}
}
