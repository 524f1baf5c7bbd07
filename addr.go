package goroce

import (
	"encoding/hex"
	"net/netip"
)

// GID is a global identifier: on RoCEv2 an IPv6 address, or for IPv4 the IPv4-mapped IPv6 address
// ::ffff:a.b.c.d, as rxe puts in its GID table. IBTA Annex A17.4.5.1.
type GID [16]byte

// GIDFromAddr returns the GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// Addr returns the IP address a GID stands for, IPv4 for an IPv4-mapped GID.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// String returns the GID as an IP address.
func (g GID) String() string { return g.Addr().String() }

// Hex returns the GID as 32 hex digits in wire order, as ibv_rc_pingpong exchanges it.
func (g GID) Hex() string { return hex.EncodeToString(g[:]) }

// ParseGIDHex parses 32 hex digits in wire order.
func ParseGIDHex(s string) (GID, bool) {
	var g GID
	if len(s) != 32 {
		return g, false
	}
	if _, err := hex.Decode(g[:], []byte(s)); err != nil {
		return g, false
	}
	return g, true
}

// AH returns an address handle for the peer at addr, for UD sends and RC/UC connections.
func AH(addr netip.Addr) *AddressHandle {
	return &AddressHandle{DGID: GIDFromAddr(addr), HopLimit: 64}
}
