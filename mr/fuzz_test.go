package mr

import (
	"bytes"
	"encoding/binary"
	"math"
	"sync"
	"testing"

	"github.com/goroce/goroce/wire"
)

// fuzzFixture is a table whose regions all live in one arena with guard gaps between them, so a fuzz
// iteration can snapshot all memory, predict exactly what an operation may change, and compare.
type fuzzFixture struct {
	tb      *Table
	pds     []*PD
	arena   []byte
	regions []*modelRegion // every region ever registered: live, invalidated and deregistered
	live    []*modelRegion // what the model's check may hit
	offsets map[*modelRegion]int
}

var (
	fuzzOnce sync.Once
	fuzzFix  *fuzzFixture
)

func newFuzzFixture() *fuzzFixture {
	f := &fuzzFixture{tb: NewTable(), offsets: map[*modelRegion]int{}}
	f.pds = []*PD{f.tb.AllocPD(), f.tb.AllocPD()}
	f.arena = make([]byte, 1024)
	for i := range f.arena {
		f.arena[i] = guardByte(i)
	}
	add := func(pd *PD, off, size int, access Access, opts ...Option) *modelRegion {
		r, err := f.tb.Register(pd, f.arena[off:off+size:off+size], access, opts...)
		if err != nil {
			panic(err)
		}
		m := &modelRegion{r: r, pd: pd, iova: r.IOVA(), size: uint64(size), access: access,
			lkey: uint32(r.LKey()), rkey: uint32(r.RKey()), invalidatable: true}
		f.offsets[m] = off
		f.regions = append(f.regions, m)
		return m
	}
	pd, pd2 := f.pds[0], f.pds[1]
	live := []*modelRegion{
		add(pd, 64, 64, allRemote),                                     // aligned, default IOVA
		add(pd, 192, 32, RemoteRead, WithIOVA(0x1000)),                 // read only
		add(pd, 292, 64, allRemote, WithIOVA(0x2000)),                  // real address 4 mod 8: locked atomics
		add(pd, 416, 64, allRemote, WithIOVA(math.MaxUint64-64)),       // ends at 2^64-1
		add(pd2, 544, 48, LocalWrite, WithIOVA(0x3000)),                // another PD, local only
		add(pd, 656, 40, allRemote, WithIOVA(0x1010), Invalidatable()), // overlaps r1's IOVAs
	}
	dead := add(pd, 768, 64, allRemote, WithIOVA(0x4000))
	if err := f.tb.Deregister(dead.r); err != nil {
		panic(err)
	}
	inv := add(pd, 896, 64, allRemote, WithIOVA(0x5000), Invalidatable())
	if err := f.tb.LocalInvalidate(pd, wire.LKey(inv.lkey)); err != nil {
		panic(err)
	}
	// Reuse the dead region's slot so its stale keys meet a live region.
	live = append(live, add(pd, 832, 32, allRemote, WithIOVA(0x4000)))
	f.live = live
	return f
}

// inRegion reports whether arena byte i belongs to a region that may be written.
func (f *fuzzFixture) inRegion(i int) bool {
	for m, off := range f.offsets {
		if i >= off && i < off+int(m.size) {
			return true
		}
	}
	return false
}

const (
	fuzzCheck = iota
	fuzzWrite
	fuzzRead
	fuzzCAS
	fuzzFAA
	fuzzScatter
	fuzzGather
	fuzzOps
)

// FuzzAccess feeds arbitrary keys (near the real ones, or any), VAs (relative to a region or absolute),
// lengths, rights and operations to the data path. Every result must equal the reference model's, and
// memory must change exactly as the model predicts: never outside a region, never on a failed access.
func FuzzAccess(f *testing.F) {
	fuzzOnce.Do(func() { fuzzFix = newFuzzFixture() })
	fx := fuzzFix
	for sel := range len(fx.regions) {
		for op := range uint8(fuzzOps) {
			f.Add(uint8(sel), uint32(0), op%2 == 0, int64(8), uint32(8), op, uint64(0x1f), uint8(0))
		}
	}
	f.Add(uint8(3), uint32(0), false, int64(56), uint32(16), uint8(fuzzWrite), uint64(1), uint8(0))
	f.Add(uint8(0), uint32(1), false, int64(0), uint32(0), uint8(fuzzGather), uint64(1), uint8(1))

	f.Fuzz(func(t *testing.T, sel uint8, keyXor uint32, local bool, vaDelta int64, length uint32, op uint8, val uint64, pdSel uint8) {
		m := fx.regions[int(sel)%len(fx.regions)]
		key := m.rkey
		if local {
			key = m.lkey
		}
		key ^= keyXor
		va := m.iova + uint64(vaDelta)
		pd := fx.pds[int(pdSel)%len(fx.pds)]
		op %= fuzzOps
		n := uint64(length % 300) // bytes copied by copying operations

		before := append([]byte{}, fx.arena...)
		want := append([]byte{}, before...)
		var err error
		var hit *modelRegion
		var off uint64
		var merr error
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(val) + byte(i)
		}
		var orig uint64
		switch op {
		case fuzzCheck:
			access := Access(val) & accessKnown
			err = fx.tb.CheckRemote(pd, wire.RKey(key), va, length, access)
			_, _, merr = modelCheck(fx.live, pd, key, true, va, uint64(length), access)
		case fuzzWrite:
			err = fx.tb.WriteRemote(pd, wire.RKey(key), va, buf)
			if hit, off, merr = modelCheck(fx.live, pd, key, true, va, n, RemoteWrite); hit != nil {
				copy(want[fx.offsets[hit]+int(off):], buf)
			}
		case fuzzRead:
			err = fx.tb.ReadRemote(pd, wire.RKey(key), va, buf)
			if hit, off, merr = modelCheck(fx.live, pd, key, true, va, n, RemoteRead); hit != nil {
				p := fx.offsets[hit] + int(off)
				if !bytes.Equal(buf, before[p:p+int(n)]) {
					t.Fatalf("ReadRemote returned %x, memory holds %x", buf, before[p:p+int(n)])
				}
			}
		case fuzzCAS, fuzzFAA:
			if op == fuzzCAS {
				orig, err = fx.tb.CompareSwap(pd, wire.RKey(key), va, val, ^val)
			} else {
				orig, err = fx.tb.FetchAdd(pd, wire.RKey(key), va, val)
			}
			if hit, off, merr = modelCheck(fx.live, pd, key, true, va, 8, RemoteAtomic); hit != nil {
				p := fx.offsets[hit] + int(off)
				old := binary.NativeEndian.Uint64(before[p:])
				if orig != old {
					t.Fatalf("atomic returned %#x, memory held %#x", orig, old)
				}
				switch {
				case op == fuzzFAA:
					binary.NativeEndian.PutUint64(want[p:], old+val)
				case old == val:
					binary.NativeEndian.PutUint64(want[p:], ^val)
				}
			}
		case fuzzScatter, fuzzGather:
			sgl := []SGE{{Addr: va, Length: uint32(n), LKey: wire.LKey(key)}}
			access := Access(0)
			if op == fuzzScatter {
				access = LocalWrite
				err = fx.tb.Scatter(pd, sgl, 0, buf)
			} else {
				err = fx.tb.Gather(pd, sgl, 0, buf)
			}
			if _, ok := checkedEnd(va, n); !ok && n > 0 {
				merr = ErrBounds
			} else if hit, off, merr = modelCheck(fx.live, pd, key, false, va, n, access); hit != nil {
				p := fx.offsets[hit] + int(off)
				if op == fuzzScatter {
					copy(want[p:], buf)
				} else if !bytes.Equal(buf, before[p:p+int(n)]) {
					t.Fatalf("Gather returned %x, memory holds %x", buf, before[p:p+int(n)])
				}
			}
		}
		if err != merr {
			t.Fatalf("op %d key %#x va %#x len %d: err %v, model %v", op, key, va, length, err, merr)
		}
		if !bytes.Equal(fx.arena, want) {
			for i := range want {
				if fx.arena[i] != want[i] {
					t.Fatalf("op %d: arena byte %d (in a region: %v) is %#x, want %#x", op, i, fx.inRegion(i), fx.arena[i], want[i])
				}
			}
		}
	})
}
