package mr

import "math"

// MaxMessage is the largest message, and so the largest single access, InfiniBand allows: 2^31 bytes.
// IBTA Vol 1 chapter 9 (transport layer).
const MaxMessage = 1 << 31

// atomicSize is the operand size of compare-and-swap and fetch-and-add. IBTA Vol 1 chapter 9
// (transport layer, atomic operations).
const atomicSize = 8

// check is the one access check every path uses. It finds the region that key (an rkey when remote,
// else an lkey) names and verifies, in this order:
//
//  1. length 0: success with no region and no key check (IBTA Vol 1 C9-88);
//  2. length above MaxMessage, or an atomic (want has RemoteAtomic) not 8 bytes long: ErrLength;
//  3. the key names a valid region with that exact key: else ErrBadKey;
//  4. the region is in pd: else ErrWrongPD;
//  5. the region grants every right in want: else ErrPermission;
//  6. [va, va+length) lies inside [IOVA, IOVA+Len), with no wrap past 2^64: else ErrBounds;
//  7. an atomic's va is 8-byte aligned: else ErrMisaligned.
//
// On success with length > 0 it returns the region read-locked, and the offset of va in its buffer;
// the caller must r.mu.RUnlock() once its copy or atomic is done. It does not allocate.
func (t *Table) check(pd *PD, key uint32, remote bool, va, length uint64, want Access) (*Region, int, error) {
	if length == 0 {
		return nil, 0, nil
	}
	if length > MaxMessage || (want&RemoteAtomic != 0 && length != atomicSize) {
		return nil, 0, ErrLength
	}
	r := t.lookup(key, remote)
	if r == nil {
		return nil, 0, ErrBadKey
	}
	r.mu.RLock()
	var err error
	switch {
	case r.state != stateValid || !r.hasKey(key, remote):
		err = ErrBadKey
	case r.pd != pd:
		err = ErrWrongPD
	case want&^r.access != 0:
		err = ErrPermission
	case !inBounds(r.iova, uint64(len(r.buf)), va, length):
		err = ErrBounds
	case want&RemoteAtomic != 0 && va%atomicSize != 0:
		err = ErrMisaligned
	default:
		return r, int(va - r.iova), nil
	}
	r.mu.RUnlock()
	return nil, 0, err
}

// inBounds reports whether [va, va+length) lies inside [base, base+size), where base+size does not
// wrap. Written with subtractions only, so no sum can wrap into a false hit.
func inBounds(base, size, va, length uint64) bool {
	if va < base {
		return false
	}
	off := va - base
	return off <= size && length <= size-off
}

// checkedEnd returns addr+n and whether it stays at or below 2^64-1.
func checkedEnd(addr, n uint64) (uint64, bool) {
	return addr + n, addr <= math.MaxUint64-n
}
