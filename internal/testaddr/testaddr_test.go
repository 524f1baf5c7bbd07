package testaddr

import (
	"net/netip"
	"testing"
)

func TestPairDistinct(t *testing.T) {
	seen := make(map[netip.Addr]bool)
	for range 10000 {
		a, b := Pair()
		if !a.IsLoopback() || !b.IsLoopback() || a == b {
			t.Fatalf("Pair = %v, %v", a, b)
		}
		if a.As4()[1] == 0 {
			t.Fatalf("Pair = %v: 127.0.0.0/16 is the named tests'", a)
		}
		if seen[a] || seen[b] {
			t.Fatalf("Pair returned %v, %v twice", a, b)
		}
		seen[a], seen[b] = true, true
	}
}
