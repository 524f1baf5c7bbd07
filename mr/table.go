package mr

import (
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goroce/goroce/wire"
)

// Slots live in fixed-size chunks that are allocated on first use and never freed, so a lookup is two
// atomic loads with no lock and registration never copies the table.
const (
	chunkBits = 12
	chunkSize = 1 << chunkBits
	numChunks = maxSlots / chunkSize
)

type chunk struct {
	regions [chunkSize]atomic.Pointer[Region]
	key     [chunkSize]uint8 // last key part issued per slot; guarded by Table.mu
}

// Table holds the protection domains and memory regions of one device and checks every access to them.
// All methods are safe for concurrent use.
//
// Locking: Table.mu serializes the control path (PDs, registration, deregistration, invalidation) and
// guards the fields below it. The data path takes no table lock: it finds a region through atomic slot
// pointers and holds that region's mu for reading for the length of one copy or atomic. Lock order is
// Table.mu, then Region.mu.
type Table struct {
	lkeys *keyCipher // lkey permutation; immutable but for its memo
	rkeys *keyCipher // rkey permutation; immutable but for its memo

	chunks [numChunks]atomic.Pointer[chunk] // written under mu

	mu       sync.Mutex
	used     uint32     // slots ever handed out: indexes below it have a chunk
	free     []uint32   // deregistered slot indexes, reused oldest first
	freeHead int        // index in free of the oldest entry
	rng      *rand.Rand // first key part of fresh slots
	nextPD   uint32
}

// NewTable returns an empty table with fresh random key permutations.
func NewTable() *Table {
	var seed [32]byte
	randomBytes(seed[:])
	return NewTableSeeded(seed)
}

// NewTableSeeded returns an empty table whose key permutations and key parts all derive from seed, so
// that the same registrations give the same keys every time. It is for simulation and tests that must
// replay bit for bit; a device serving real peers uses NewTable, whose keys nobody can predict.
func NewTableSeeded(seed [32]byte) *Table {
	rng := rand.New(rand.NewChaCha8(seed))
	cipher := func() *keyCipher {
		return newKeyCipher(newSpeck([4]uint16{uint16(rng.Uint32()), uint16(rng.Uint32()), uint16(rng.Uint32()), uint16(rng.Uint32())}))
	}
	t := &Table{lkeys: cipher(), rkeys: cipher(), rng: rng}
	return t
}

// PD is a protection domain: a region is reachable only through a queue pair of the same domain.
// IBTA Vol 1 10.6 (Memory Management).
type PD struct {
	table *Table
	id    uint32
	// guarded by table.mu:
	regions int
	dead    bool
}

// ID returns the domain's number, unique within its table, for logs.
func (pd *PD) ID() uint32 { return pd.id }

// AllocPD returns a new protection domain.
func (t *Table) AllocPD() *PD {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextPD++
	return &PD{table: t, id: t.nextPD}
}

// DeallocPD releases pd. It fails with ErrPDBusy while regions are registered in it, as
// ibv_dealloc_pd fails with EBUSY.
func (t *Table) DeallocPD(pd *PD) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkPDLocked(pd); err != nil {
		return err
	}
	if pd.regions > 0 {
		return ErrPDBusy
	}
	pd.dead = true
	return nil
}

func (t *Table) checkPDLocked(pd *PD) error {
	if pd == nil || pd.table != t || pd.dead {
		return ErrBadPD
	}
	return nil
}

type regionState uint8

const (
	stateValid       regionState = iota // keys work
	stateInvalidated                    // invalidated, still registered; Revalidate makes it valid
	stateDead                           // deregistered
)

// Region is a registered memory region: a byte range of this process, the IOVA range peers name it by,
// its protection domain, rights and keys. IBTA Vol 1 10.6 (Memory Management).
type Region struct {
	table         *Table
	pd            *PD
	buf           []byte // the memory; immutable
	iova          uint64
	access        Access
	invalidatable bool
	index         uint32

	// mu is held for reading by each access for the duration of its copy or atomic, and for writing by
	// Deregister, LocalInvalidate, RemoteInvalidate and Revalidate, so that when those return no access
	// through the old keys is in flight and none can start.
	mu    sync.RWMutex
	race  raceGuard // serializes the device's accesses under the race detector (race.go)
	state regionState
	lkey  wire.LKey
	rkey  wire.RKey
}

// LKey returns the key local work requests name the region by.
func (r *Region) LKey() wire.LKey {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.lkey
}

// RKey returns the key a peer names the region by in RETH and AtomicETH.
func (r *Region) RKey() wire.RKey {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.rkey
}

// IOVA returns the I/O virtual address of the region's first byte: the VA a peer puts in RETH.
func (r *Region) IOVA() uint64 { return r.iova }

// Len returns the region's length in bytes.
func (r *Region) Len() int { return len(r.buf) }

// Access returns the rights the region was registered with.
func (r *Region) Access() Access { return r.access }

// PD returns the region's protection domain.
func (r *Region) PD() *PD { return r.pd }

// Bytes returns the region's memory, for its owner to fill and read. Peers may change it concurrently
// within their rights. For a region from Alloc the slice must not be used after Deregister: the memory
// is unmapped and touching it faults.
func (r *Region) Bytes() []byte { return r.buf }

// Option configures a registration.
type Option func(*regConfig)

type regConfig struct {
	iova          uint64
	hasIOVA       bool
	invalidatable bool
}

// WithIOVA sets the region's IOVA, as ibv_reg_mr_iova2 does. Without it the IOVA is the process
// address of the region's first byte, as ibv_reg_mr uses.
func WithIOVA(iova uint64) Option {
	return func(c *regConfig) { c.iova, c.hasIOVA = iova, true }
}

// Invalidatable makes the region subject to LocalInvalidate and RemoteInvalidate, like an MR of type
// IB_MR_TYPE_MEM_REG that a ULP registers and invalidates per I/O. Other regions refuse invalidation.
func Invalidatable() Option {
	return func(c *regConfig) { c.invalidatable = true }
}

// Register registers buf, which the caller keeps owning, as a region of pd with the given rights.
// The region keeps buf reachable until Deregister.
func (t *Table) Register(pd *PD, buf []byte, access Access, opts ...Option) (*Region, error) {
	if len(buf) == 0 {
		return nil, ErrEmpty
	}
	return t.register(pd, buf, access, opts)
}

// Alloc allocates length bytes of zeroed, page-aligned memory and registers it as a region of pd. The
// memory belongs to the Go heap: Deregister revokes the keys and leaves the memory to the program, which
// may go on using Bytes (a stale slice never faults), and the collector frees it once nothing refers to
// it.
func (t *Table) Alloc(pd *PD, length int, access Access, opts ...Option) (*Region, error) {
	if length <= 0 {
		return nil, ErrEmpty
	}
	if err := access.validate(); err != nil {
		return nil, err
	}
	return t.register(pd, alignedBytes(length), access, opts)
}

// alignedBytes returns n zeroed bytes that start on a page boundary, as ibv_reg_mr users get from
// posix_memalign and rxe's memory from its pages.
func alignedBytes(n int) []byte {
	page := os.Getpagesize()
	b := make([]byte, n+page)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) % uintptr(page)); r != 0 {
		off = page - r
	}
	return b[off : off+n : off+n]
}

func (t *Table) register(pd *PD, buf []byte, access Access, opts []Option) (*Region, error) {
	if err := access.validate(); err != nil {
		return nil, err
	}
	var cfg regConfig
	for _, o := range opts {
		o(&cfg)
	}
	iova := uint64(uintptr(unsafe.Pointer(&buf[0])))
	if cfg.hasIOVA {
		iova = cfg.iova
	}
	if iova > math.MaxUint64-uint64(len(buf)) {
		return nil, ErrIOVARange
	}
	r := &Region{
		pd:            pd,
		buf:           buf,
		iova:          iova,
		access:        access,
		invalidatable: cfg.invalidatable,
		table:         t,
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.checkPDLocked(pd); err != nil {
		return nil, err
	}
	index, ok := t.allocSlotLocked()
	if !ok {
		return nil, ErrTableFull
	}
	c := t.chunks[index>>chunkBits].Load()
	k := &c.key[index&(chunkSize-1)]
	*k++ // a fresh slot starts from a random key part; see allocSlotLocked
	r.index = index
	r.setKeys(t, *k)
	pd.regions++
	c.regions[index&(chunkSize-1)].Store(r)
	return r, nil
}

// allocSlotLocked returns the oldest free slot, or a never-used one. Reusing the oldest free slot first
// delays the reuse of each slot, and so the return of a stale key part, as long as possible.
func (t *Table) allocSlotLocked() (uint32, bool) {
	if t.freeHead < len(t.free) {
		index := t.free[t.freeHead]
		t.freeHead++
		if t.freeHead == len(t.free) {
			t.free, t.freeHead = t.free[:0], 0
		} else if t.freeHead > len(t.free)/2 && t.freeHead >= 64 {
			n := copy(t.free, t.free[t.freeHead:])
			t.free, t.freeHead = t.free[:n], 0
		}
		return index, true
	}
	if t.used == maxSlots {
		return 0, false
	}
	index := t.used
	t.used++
	ci := index >> chunkBits
	c := t.chunks[ci].Load()
	if c == nil {
		c = new(chunk)
		t.chunks[ci].Store(c)
	}
	c.key[index&(chunkSize-1)] = uint8(t.rng.Uint32())
	return index, true
}

// setKeys sets the keys for key part k. The caller holds r.mu for writing or has not published r.
func (r *Region) setKeys(t *Table, k uint8) {
	p := plainKey(r.index, k)
	r.lkey = wire.LKey(t.lkeys.encrypt(p))
	r.rkey = wire.RKey(t.rkeys.encrypt(p))
}

// Deregister removes r: when it returns, every access through r's keys has finished and every later one
// fails with ErrBadKey. The memory stays the program's. It fails with ErrNotRegistered if r is not
// registered in t.
func (t *Table) Deregister(r *Region) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r == nil || r.table != t {
		return ErrNotRegistered
	}
	r.mu.Lock() // waits for accesses in flight
	if r.state == stateDead {
		r.mu.Unlock()
		return ErrNotRegistered
	}
	r.state = stateDead
	r.mu.Unlock()

	t.chunks[r.index>>chunkBits].Load().regions[r.index&(chunkSize-1)].Store(nil)
	t.free = append(t.free, r.index)
	r.pd.regions--
	return nil
}

// lookup returns the region whose current key is published key key of the given kind, in any state,
// or nil. It does not lock r: the caller must check r's state and keys under r.mu.
func (t *Table) lookup(key uint32, remote bool) *Region {
	var p uint32
	if remote {
		p = t.rkeys.decrypt(key)
	} else {
		p = t.lkeys.decrypt(key)
	}
	index := p >> keyPartBits
	c := t.chunks[index>>chunkBits].Load()
	if c == nil {
		return nil
	}
	return c.regions[index&(chunkSize-1)].Load()
}

// LocalInvalidate invalidates the region whose lkey is key, as a Local Invalidate work request of a QP
// in pd does: when it returns, no access through the region's keys is in flight and every later one
// fails with ErrBadKey, until Revalidate. Invalidating an invalidated region succeeds, as in rxe.
func (t *Table) LocalInvalidate(pd *PD, key wire.LKey) error {
	return t.invalidate(pd, uint32(key), false)
}

// RemoteInvalidate invalidates the region whose rkey is key, as the IETH of a SEND with Invalidate
// arriving on a QP of pd asks. Its errors mean the same as LocalInvalidate's; rxe completes the receive
// with IBV_WC_REM_INV_REQ_ERR and moves the QP to the error state on any of them.
func (t *Table) RemoteInvalidate(pd *PD, key wire.RKey) error {
	return t.invalidate(pd, uint32(key), true)
}

func (t *Table) invalidate(pd *PD, key uint32, remote bool) error {
	t.mu.Lock() // keeps revalidation and reuse of the slot out while we decide
	defer t.mu.Unlock()
	r := t.lookup(key, remote)
	if r == nil {
		return ErrBadKey
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.state == stateDead || !r.hasKey(key, remote):
		return ErrBadKey
	case r.pd != pd:
		return ErrWrongPD
	case !r.invalidatable:
		return ErrNotInvalidatable
	}
	r.state = stateInvalidated
	return nil
}

func (r *Region) hasKey(key uint32, remote bool) bool {
	if remote {
		return uint32(r.rkey) == key
	}
	return uint32(r.lkey) == key
}

// Revalidate makes an invalidated region valid again under new keys, as a fast-register work request
// does after ib_inc_rkey: the key part advances, so the old keys stay dead. It fails with
// ErrStillValid if r is valid and ErrNotRegistered if r is deregistered.
func (t *Table) Revalidate(r *Region) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r == nil || r.table != t {
		return ErrNotRegistered
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.state {
	case stateDead:
		return ErrNotRegistered
	case stateValid:
		return ErrStillValid
	}
	k := &t.chunks[r.index>>chunkBits].Load().key[r.index&(chunkSize-1)]
	*k++
	r.setKeys(t, *k)
	r.state = stateValid
	return nil
}
