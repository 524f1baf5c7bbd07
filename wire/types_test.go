package wire

import "testing"

func TestPSNArithmetic(t *testing.T) {
	const top = PSN(PSNMask)
	for _, tc := range []struct {
		a, b   PSN
		diff   int32
		before bool
	}{
		{0, 0, 0, false},
		{1, 0, 1, false},
		{0, 1, -1, true},
		{0, top, 1, false}, // 0 follows 0xFFFFFF
		{top, 0, -1, true},
		{0x800000, 0, -0x800000, true}, // exactly half way: treated as before, like rxe's psn_compare
		{0x7FFFFF, 0, 0x7FFFFF, false},
		{5, top - 4, 10, false},
	} {
		if d := tc.a.Diff(tc.b); d != tc.diff {
			t.Errorf("%v.Diff(%v) = %d, want %d", tc.a, tc.b, d, tc.diff)
		}
		if got := tc.a.Before(tc.b); got != tc.before {
			t.Errorf("%v.Before(%v) = %v", tc.a, tc.b, got)
		}
		if tc.diff > 0 && !tc.a.After(tc.b) {
			t.Errorf("%v.After(%v) = false", tc.a, tc.b)
		}
	}
	if got := top.Add(1); got != 0 {
		t.Errorf("wrap Add: %v", got)
	}
	if got := PSN(2).Add(PSNMask + 1); got != 2 {
		t.Errorf("Add of 2^24: %v", got)
	}
	if got := PSN(0).Sub(1); got != top {
		t.Errorf("wrap Sub: %v", got)
	}
	for _, tc := range []struct {
		p, start PSN
		n        uint32
		in       bool
	}{
		{10, 10, 1, true}, {11, 10, 1, false}, {9, 10, 5, false},
		{1, top - 1, 4, true}, {2, top - 1, 4, false}, {top, top - 1, 4, true},
		{0, 0, 0, false},
	} {
		if got := tc.p.InWindow(tc.start, tc.n); got != tc.in {
			t.Errorf("%v.InWindow(%v, %d) = %v", tc.p, tc.start, tc.n, got)
		}
	}
}

func TestMTU(t *testing.T) {
	for m, n := range map[MTU]int{MTU256: 256, MTU512: 512, MTU1024: 1024, MTU2048: 2048, MTU4096: 4096, 0: 0, 6: 0} {
		if m.Bytes() != n {
			t.Errorf("%d.Bytes() = %d, want %d", m, m.Bytes(), n)
		}
		if got, ok := MTUFromBytes(n); ok != (n != 0) || (ok && got != m) {
			t.Errorf("MTUFromBytes(%d) = %v %v", n, got, ok)
		}
	}
	if _, ok := MTUFromBytes(1500); ok {
		t.Error("1500 is not an IB MTU")
	}
}
