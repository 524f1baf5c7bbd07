// Package mr implements memory regions for goroce: protection domains, registration, lkeys and rkeys,
// the access check, and the copies and atomics that the RDMA engines perform on registered memory.
// RDMA lets a remote peer read and write this process's memory, so this package is the security
// boundary: every byte a peer or a work request reaches passes through one check.
//
// # API
//
// A Table holds one device's domains and regions:
//
//	func NewTable() *Table
//	func (t *Table) AllocPD() *PD
//	func (t *Table) DeallocPD(pd *PD) error
//	func (t *Table) Register(pd *PD, buf []byte, access Access, opts ...Option) (*Region, error)
//	func (t *Table) Alloc(pd *PD, length int, access Access, opts ...Option) (*Region, error)
//	func (t *Table) Deregister(r *Region) error
//	func (t *Table) LocalInvalidate(pd *PD, key wire.LKey) error
//	func (t *Table) RemoteInvalidate(pd *PD, key wire.RKey) error
//	func (t *Table) Revalidate(r *Region) error
//	func WithIOVA(iova uint64) Option   // like ibv_reg_mr_iova2
//	func Invalidatable() Option
//
// The data path, for the responder (remote keys) and for the requester's and receiver's scatter/gather
// lists (local keys):
//
//	func (t *Table) CheckRemote(pd *PD, key wire.RKey, va uint64, length uint32, want Access) error
//	func (t *Table) WriteRemote(pd *PD, key wire.RKey, va uint64, src []byte) error
//	func (t *Table) ReadRemote(pd *PD, key wire.RKey, va uint64, dst []byte) error
//	func (t *Table) CompareSwap(pd *PD, key wire.RKey, va, compare, swap uint64) (uint64, error)
//	func (t *Table) FetchAdd(pd *PD, key wire.RKey, va, add uint64) (uint64, error)
//	func (t *Table) Gather(pd *PD, sgl []SGE, offset uint64, dst []byte) error
//	func (t *Table) Scatter(pd *PD, sgl []SGE, offset uint64, src []byte) error
//	func SGLength(sgl []SGE) (uint32, error)
//
// None of them allocates, and none takes a table-wide lock.
//
// # The check
//
// Every data-path operation runs the same check on (key, VA, length, rights, PD), in this order: a
// zero-length access succeeds without looking at the key and touches nothing (IBTA Vol 1 C9-88); a
// length above MaxMessage, or an atomic that is not 8 bytes, is ErrLength; then the key must name a
// valid region (ErrBadKey), of the caller's PD (ErrWrongPD), with every right asked for (ErrPermission),
// that holds the whole range [VA, VA+length) with no wrap past 2^64 (ErrBounds); an atomic VA must be
// 8-byte aligned (ErrMisaligned). Gather and Scatter also refuse an element whose range wraps past 2^64
// (ErrBounds) and data that does not fit the list (ErrLength, checked before any copy); elements of
// length 0 are skipped without a key check.
//
// Each error errors.Is-matches one of two categories that name the NAK a responder sends:
// ErrRemoteAccess (bad key, wrong PD, permission, bounds) and ErrInvalidRequest (length, misaligned
// atomic, region not invalidatable). The errors are package-level values, so failing is free too.
//
// # Keys
//
// A plain key is slot index<<8 | key part, as in rxe. The key part of a fresh slot starts at a random
// value and advances by one whenever the slot is reused and whenever its region is revalidated; free
// slots are reused oldest first. The published lkey and rkey are the plain key under Speck32/64 with two
// independent random keys per table, so keys reveal nothing about one another and an lkey is not an
// rkey. A lookup decrypts, finds the slot and compares the region's current key. Guarantee: a key that
// was deregistered or invalidated fails until its slot's key part has advanced 256 times (256 reuses
// or revalidations of that one slot), after which it matches the slot's region again; TestStaleKeyGuarantee
// pins this bound. Across different slots no stale key ever matches.
//
// # Deregistration and invalidation
//
// Each access holds its region's RWMutex for reading for the length of its copy or atomic; Deregister,
// LocalInvalidate, RemoteInvalidate and Revalidate take it for writing. So when they return, accesses
// through the old keys that had passed the check have finished, and every later one fails, including
// one that raced with the call. Memory from Alloc is unmapped only after that point. The Bytes slice of
// an Alloc region must not be used after Deregister.
//
// rxe (drivers/infiniband/sw/rxe/rxe_mr.c, rxe_invalidate_mr) invalidates only MRs of type
// IB_MR_TYPE_MEM_REG (fast-registration MRs); for an MR registered with ibv_reg_mr it returns EINVAL, as
// it does for a key mismatch or an MR with bound memory windows; it sets the MR's state to FREE without
// checking that the state was valid, and a failed remote invalidation completes the receive with
// IBV_WC_REM_INV_REQ_ERR and moves the QP to the error state. goroce does the same: only regions
// registered with the Invalidatable option can be invalidated, other regions answer ErrNotInvalidatable;
// invalidating an invalidated region succeeds. goroce also checks the PD on both local and remote
// invalidation (ErrWrongPD), which rxe leaves out. An invalidated region stays registered; Revalidate
// makes it valid under new keys, as a fast-register work request after ib_inc_rkey does, and
// Deregister frees it.
//
// # Atomics
//
// CompareSwap and FetchAdd work on 8 bytes at an 8-byte aligned VA of a region with RemoteAtomic, in
// host byte order as rxe does. When the real address is 8-byte aligned (always so with the default
// IOVA) they use sync/atomic; otherwise (a chosen IOVA can map an aligned VA to an unaligned address)
// they take one of 64 locks picked by the address. The path depends only on the address, so goroce's
// atomics on the same 8 bytes are atomic with respect to each other, from any table, QP or goroutine.
// They are not atomic with respect to plain copies of the same bytes, as IBTA does not require.
package mr
