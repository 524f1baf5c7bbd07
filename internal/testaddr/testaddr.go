// Package testaddr hands tests pairs of loopback addresses on which to open goroce devices, which
// bind UDP port 4791 and so cannot share an address. Picking at random, as the tests did, let two
// tests that ran at once (in one process, or in two packages' test binaries) pick the same pair now
// and then: a perftest case failed in CI with "opening 127.36.114.2:4791: address already in use".
package testaddr

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"sync/atomic"
)

// pairs is how many pairs 127.a.b.1 and 127.a.b.2 there are with a from 1 to 254: 127.0.0.0/16 is left
// to the tests that name their addresses.
const pairs = 254 * 256

var (
	next  atomic.Uint32
	first = uint32(os.Getpid())*1021 + rand.Uint32N(256)
)

// Pair returns two addresses, 127.a.b.1 and 127.a.b.2, that no earlier call in this process returned
// (for 65,024 calls), and that another test binary running at the same time is unlikely to hold: each
// process starts at its own place, spread by its process ID.
func Pair() (netip.Addr, netip.Addr) {
	k := (first + next.Add(1)) % pairs
	a, b := byte(1+k/256), byte(k%256)
	return netip.AddrFrom4([4]byte{127, a, b, 1}), netip.AddrFrom4([4]byte{127, a, b, 2})
}
