package mr

import (
	"strconv"
	"strings"
)

// Access is a set of access rights on a memory region, with the bit values and meaning of libibverbs'
// enum ibv_access_flags. Local read access is always granted and has no bit. IBTA Vol 1 10.6 (Memory
// Management).
type Access uint32

// The access rights a region can be registered with.
const (
	// LocalWrite lets receives (Scatter) and local work requests write the region (IBV_ACCESS_LOCAL_WRITE).
	LocalWrite Access = 1 << 0
	// RemoteWrite lets peers write the region with RDMA WRITE (IBV_ACCESS_REMOTE_WRITE).
	RemoteWrite Access = 1 << 1
	// RemoteRead lets peers read the region with RDMA READ (IBV_ACCESS_REMOTE_READ).
	RemoteRead Access = 1 << 2
	// RemoteAtomic lets peers run compare-and-swap and fetch-and-add on the region
	// (IBV_ACCESS_REMOTE_ATOMIC).
	RemoteAtomic Access = 1 << 3
	// MWBind allows memory windows to be bound to the region (IBV_ACCESS_MW_BIND). goroce has no memory
	// windows yet: the bit is recorded and has no effect.
	MWBind Access = 1 << 4

	// accessKnown is every bit Register accepts.
	accessKnown = LocalWrite | RemoteWrite | RemoteRead | RemoteAtomic | MWBind
)

var accessNames = [...]struct {
	bit  Access
	name string
}{
	{LocalWrite, "LocalWrite"},
	{RemoteWrite, "RemoteWrite"},
	{RemoteRead, "RemoteRead"},
	{RemoteAtomic, "RemoteAtomic"},
	{MWBind, "MWBind"},
}

// String returns the rights joined by "|", for example "LocalWrite|RemoteRead", "None" for the empty set,
// and unknown bits in hex.
func (a Access) String() string {
	if a == 0 {
		return "None"
	}
	var parts []string
	for _, n := range accessNames {
		if a&n.bit != 0 {
			parts = append(parts, n.name)
			a &^= n.bit
		}
	}
	if a != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(uint64(a), 16))
	}
	return strings.Join(parts, "|")
}

// validate reports whether a is acceptable at registration: only known bits, and no remote write or
// atomic right without LocalWrite, which ibv_reg_mr refuses with EINVAL (a peer must not be able to
// write memory the owner cannot).
func (a Access) validate() error {
	if a&^accessKnown != 0 {
		return ErrUnknownAccess
	}
	if a&(RemoteWrite|RemoteAtomic) != 0 && a&LocalWrite == 0 {
		return ErrInvalidAccess
	}
	return nil
}
