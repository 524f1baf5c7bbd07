package mr

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/goroce/goroce/wire"
)

func TestErrorCategories(t *testing.T) {
	for _, tc := range []struct {
		err, category, not error
	}{
		{ErrBadKey, ErrRemoteAccess, ErrInvalidRequest},
		{ErrWrongPD, ErrRemoteAccess, ErrInvalidRequest},
		{ErrPermission, ErrRemoteAccess, ErrInvalidRequest},
		{ErrBounds, ErrRemoteAccess, ErrInvalidRequest},
		{ErrMisaligned, ErrInvalidRequest, ErrRemoteAccess},
		{ErrLength, ErrInvalidRequest, ErrRemoteAccess},
		{ErrNotInvalidatable, ErrInvalidRequest, ErrRemoteAccess},
	} {
		if !errors.Is(tc.err, tc.category) || errors.Is(tc.err, tc.not) {
			t.Errorf("%v: want category %v only", tc.err, tc.category)
		}
	}
	if errors.Is(ErrBadKey, ErrBounds) {
		t.Error("fine sentinels match each other")
	}
}

// boundaryFixture is a table with regions at chosen IOVAs inside guarded buffers.
type boundaryFixture struct {
	tb       *Table
	pd, pd2  *PD
	rw       *Region // allRemote at 0x10000, 4096 bytes
	ro       *Region // RemoteRead only at 0x20000, 64 bytes
	wo       *Region // LocalWrite|RemoteWrite at 0x30000, 64 bytes
	top      *Region // allRemote, last byte at 2^64-2
	local    *Region // no rights at all
	rwBuf    []byte
	topStart uint64
}

func newBoundaryFixture(t *testing.T) *boundaryFixture {
	f := &boundaryFixture{tb: NewTable()}
	f.pd, f.pd2 = f.tb.AllocPD(), f.tb.AllocPD()
	f.rwBuf = guardedBuf(t, 4096, 0)
	f.rw = mustRegister(t, f.tb, f.pd, f.rwBuf, allRemote, WithIOVA(0x10000))
	f.ro = mustRegister(t, f.tb, f.pd, guardedBuf(t, 64, 0), RemoteRead, WithIOVA(0x20000))
	f.wo = mustRegister(t, f.tb, f.pd, guardedBuf(t, 64, 0), LocalWrite|RemoteWrite, WithIOVA(0x30000))
	f.topStart = math.MaxUint64 - 64
	f.top = mustRegister(t, f.tb, f.pd, guardedBuf(t, 64, 0), allRemote, WithIOVA(f.topStart))
	f.local = mustRegister(t, f.tb, f.pd, guardedBuf(t, 64, 0), 0, WithIOVA(0x40000))
	return f
}

func TestCheckRemoteBoundaries(t *testing.T) {
	f := newBoundaryFixture(t)
	rw, ro, wo, top := f.rw, f.ro, f.wo, f.top
	for _, tc := range []struct {
		name   string
		pd     *PD
		key    wire.RKey
		va     uint64
		length uint32
		want   Access
		err    error
	}{
		{"first byte", f.pd, rw.RKey(), 0x10000, 1, RemoteWrite, nil},
		{"last byte", f.pd, rw.RKey(), 0x10000 + 4095, 1, RemoteRead, nil},
		{"whole region", f.pd, rw.RKey(), 0x10000, 4096, RemoteWrite | RemoteRead, nil},
		{"one past the end", f.pd, rw.RKey(), 0x10000 + 4096, 1, RemoteRead, ErrBounds},
		{"one byte too long", f.pd, rw.RKey(), 0x10000, 4097, RemoteRead, ErrBounds},
		{"ends one past", f.pd, rw.RKey(), 0x10001, 4096, RemoteRead, ErrBounds},
		{"one before the start", f.pd, rw.RKey(), 0x10000 - 1, 2, RemoteRead, ErrBounds},
		{"va zero", f.pd, rw.RKey(), 0, 1, RemoteRead, ErrBounds},
		{"length 0, valid key", f.pd, rw.RKey(), 0x10000, 0, RemoteWrite, nil},
		{"length 0, garbage key, va, pd", nil, 0xdeadbeef, math.MaxUint64, 0, RemoteAtomic, nil},
		{"length 0 past the end", f.pd, ro.RKey(), 0x20000 + 1000, 0, RemoteWrite, nil},
		{"top region last byte", f.pd, top.RKey(), f.topStart + 63, 1, RemoteRead, nil},
		{"top region to 2^64-1", f.pd, top.RKey(), f.topStart, 64, RemoteRead, nil},
		{"wraps past 2^64", f.pd, top.RKey(), f.topStart + 32, math.MaxUint32, RemoteRead, ErrLength},
		{"wraps past 2^64 within MaxMessage", f.pd, top.RKey(), math.MaxUint64 - 1, 1 << 30, RemoteRead, ErrBounds},
		{"va 2^64-1", f.pd, top.RKey(), math.MaxUint64, 1, RemoteRead, ErrBounds},
		{"above MaxMessage", f.pd, rw.RKey(), 0x10000, MaxMessage + 1, RemoteRead, ErrLength},
		{"wrong PD", f.pd2, rw.RKey(), 0x10000, 1, RemoteRead, ErrWrongPD},
		{"nil PD", nil, rw.RKey(), 0x10000, 1, RemoteRead, ErrWrongPD},
		{"read-only region written", f.pd, ro.RKey(), 0x20000, 1, RemoteWrite, ErrPermission},
		{"read-only region atomic", f.pd, ro.RKey(), 0x20000, 8, RemoteAtomic, ErrPermission},
		{"write-only region read", f.pd, wo.RKey(), 0x30000, 1, RemoteRead, ErrPermission},
		{"write-only region atomic", f.pd, wo.RKey(), 0x30000, 8, RemoteAtomic, ErrPermission},
		{"no-rights region read", f.pd, f.local.RKey(), 0x40000, 1, RemoteRead, ErrPermission},
		{"lkey as rkey", f.pd, wire.RKey(rw.LKey()), 0x10000, 1, RemoteRead, ErrBadKey},
		{"rkey plus one", f.pd, rw.RKey() + 1, 0x10000, 1, RemoteRead, ErrBadKey},
		{"atomic aligned", f.pd, rw.RKey(), 0x10000 + 4088, 8, RemoteAtomic, nil},
		{"atomic misaligned", f.pd, rw.RKey(), 0x10000 + 4, 8, RemoteAtomic, ErrMisaligned},
		{"atomic past the end", f.pd, rw.RKey(), 0x10000 + 4096, 8, RemoteAtomic, ErrBounds},
		{"atomic of 4 bytes", f.pd, rw.RKey(), 0x10000, 4, RemoteAtomic, ErrLength},
	} {
		err := f.tb.CheckRemote(tc.pd, tc.key, tc.va, tc.length, tc.want)
		if err != tc.err {
			t.Errorf("%s: CheckRemote(key %v, va %#x, len %d, %v) = %v, want %v", tc.name, tc.key, tc.va, tc.length, tc.want, err, tc.err)
		}
	}
}

// TestDataPathBoundaries runs the operations themselves at the boundaries and checks what they changed.
func TestDataPathBoundaries(t *testing.T) {
	f := newBoundaryFixture(t)
	tb, pd, rw := f.tb, f.pd, f.rw
	key := rw.RKey()

	src := bytes.Repeat([]byte{0x11}, 4096)
	if err := tb.WriteRemote(pd, key, 0x10000, src); err != nil {
		t.Fatalf("WriteRemote whole region: %v", err)
	}
	if !bytes.Equal(f.rwBuf, src) {
		t.Fatal("WriteRemote did not write the whole region")
	}
	if err := tb.WriteRemote(pd, key, 0x10000+1, src); err != ErrBounds {
		t.Fatalf("WriteRemote one past: %v, want ErrBounds", err)
	}
	if err := tb.WriteRemote(pd, key, 0x10000+4095, []byte{0x22}); err != nil {
		t.Fatalf("WriteRemote last byte: %v", err)
	}
	if err := tb.WriteRemote(pd, key, 0x10000+4095, []byte{0x33, 0x33}); err != ErrBounds {
		t.Fatalf("WriteRemote straddling the end: %v", err)
	}
	if f.rwBuf[4095] != 0x22 || f.rwBuf[4094] != 0x11 {
		t.Fatalf("last bytes %#x %#x, want 0x11 0x22", f.rwBuf[4094], f.rwBuf[4095])
	}
	if err := tb.WriteRemote(nil, 0, 0, nil); err != nil {
		t.Fatalf("zero-length WriteRemote: %v", err)
	}

	dst := make([]byte, 2)
	if err := tb.ReadRemote(pd, key, 0x10000+4094, dst); err != nil || dst[0] != 0x11 || dst[1] != 0x22 {
		t.Fatalf("ReadRemote last two bytes = %x, %v", dst, err)
	}
	if err := tb.ReadRemote(pd, f.wo.RKey(), 0x30000, dst); err != ErrPermission {
		t.Fatalf("ReadRemote of write-only region: %v", err)
	}
	// ReadRemoteRef gives the region's own bytes, after the same checks.
	if ref, err := tb.ReadRemoteRef(pd, key, 0x10000+4094, 2); err != nil || &ref[0] != &f.rwBuf[4094] || len(ref) != 2 || cap(ref) != 2 {
		t.Fatalf("ReadRemoteRef last two bytes = %x (cap %d), %v; want the region's own", ref, cap(ref), err)
	}
	if _, err := tb.ReadRemoteRef(pd, key, 0x10000+4095, 2); err != ErrBounds {
		t.Fatalf("ReadRemoteRef straddling the end: %v", err)
	}
	if _, err := tb.ReadRemoteRef(pd, f.wo.RKey(), 0x30000, 2); err != ErrPermission {
		t.Fatalf("ReadRemoteRef of write-only region: %v", err)
	}
	if err := tb.WriteRemote(pd, f.ro.RKey(), 0x20000, dst); err != ErrPermission {
		t.Fatalf("WriteRemote of read-only region: %v", err)
	}

	// Atomics in host byte order at the last word.
	clear(f.rwBuf)
	const last = 0x10000 + 4088
	if orig, err := tb.FetchAdd(pd, key, last, 5); err != nil || orig != 0 {
		t.Fatalf("FetchAdd = %d, %v", orig, err)
	}
	if orig, err := tb.CompareSwap(pd, key, last, 4, 9); err != nil || orig != 5 {
		t.Fatalf("failing CompareSwap = %d, %v", orig, err)
	}
	if orig, err := tb.CompareSwap(pd, key, last, 5, 0x0102030405060708); err != nil || orig != 5 {
		t.Fatalf("CompareSwap = %d, %v", orig, err)
	}
	var want [8]byte
	putNative(want[:], 0x0102030405060708)
	if !bytes.Equal(f.rwBuf[4088:], want[:]) {
		t.Fatalf("word = %x, want %x (host order)", f.rwBuf[4088:], want)
	}
	if _, err := tb.FetchAdd(pd, key, last-4, 1); err != ErrMisaligned {
		t.Fatalf("misaligned FetchAdd: %v", err)
	}
	if _, err := tb.CompareSwap(pd, key, last+8, 0, 1); err != ErrBounds {
		t.Fatalf("CompareSwap past the end: %v", err)
	}
	if _, err := tb.FetchAdd(pd, f.wo.RKey(), 0x30000, 1); err != ErrPermission {
		t.Fatalf("FetchAdd without RemoteAtomic: %v", err)
	}
	if _, err := tb.FetchAdd(f.pd2, key, last, 1); err != ErrWrongPD {
		t.Fatalf("FetchAdd from another PD: %v", err)
	}
	if !bytes.Equal(f.rwBuf[4088:], want[:]) {
		t.Fatalf("failed atomics changed the word to %x", f.rwBuf[4088:])
	}
}

func TestRegisterErrors(t *testing.T) {
	tb, other := NewTable(), NewTable()
	pd := tb.AllocPD()
	gone := tb.AllocPD()
	if err := tb.DeallocPD(gone); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pd   *PD
		buf  []byte
		opts []Option
		err  error
	}{
		{"empty", pd, nil, nil, ErrEmpty},
		{"end past 2^64-1", pd, make([]byte, 2), []Option{WithIOVA(math.MaxUint64 - 1)}, ErrIOVARange},
		{"end at 2^64-1", pd, make([]byte, 2), []Option{WithIOVA(math.MaxUint64 - 2)}, nil},
		{"nil PD", nil, make([]byte, 2), nil, ErrBadPD},
		{"foreign PD", other.AllocPD(), make([]byte, 2), nil, ErrBadPD},
		{"deallocated PD", gone, make([]byte, 2), nil, ErrBadPD},
	} {
		if _, err := tb.Register(tc.pd, tc.buf, LocalWrite, tc.opts...); err != tc.err {
			t.Errorf("%s: Register = %v, want %v", tc.name, err, tc.err)
		}
	}
	if _, err := tb.Alloc(pd, 0, LocalWrite); err != ErrEmpty {
		t.Errorf("Alloc(0) = %v", err)
	}
}

func TestDefaultIOVA(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	buf := guardedBuf(t, 100, 3)
	r := mustRegister(t, tb, pd, buf, allRemote)
	if got, want := r.IOVA(), addrOf(buf); got != want {
		t.Fatalf("IOVA = %#x, want the buffer's address %#x", got, want)
	}
	if err := tb.WriteRemote(pd, r.RKey(), addrOf(buf[99:]), []byte{7}); err != nil || buf[99] != 7 {
		t.Fatalf("WriteRemote at the last byte's address: %v", err)
	}
}

func TestPDLifecycle(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	r := mustRegister(t, tb, pd, make([]byte, 8), 0)
	if err := tb.DeallocPD(pd); err != ErrPDBusy {
		t.Fatalf("DeallocPD with a region = %v, want ErrPDBusy", err)
	}
	if err := tb.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if err := tb.DeallocPD(pd); err != nil {
		t.Fatalf("DeallocPD = %v", err)
	}
	if err := tb.DeallocPD(pd); err != ErrBadPD {
		t.Fatalf("second DeallocPD = %v, want ErrBadPD", err)
	}
}

func TestDeregisterRevokes(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	buf := guardedBuf(t, 64, 0)
	r := mustRegister(t, tb, pd, buf, allRemote)
	rkey, lkey, va := r.RKey(), r.LKey(), r.IOVA()
	if err := tb.WriteRemote(pd, rkey, va, []byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := tb.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if err := tb.Deregister(r); err != ErrNotRegistered {
		t.Fatalf("second Deregister = %v", err)
	}
	if err := NewTable().Deregister(r); err != ErrNotRegistered {
		t.Fatalf("Deregister in another table = %v", err)
	}
	if err := tb.WriteRemote(pd, rkey, va, []byte{2}); err != ErrBadKey {
		t.Fatalf("WriteRemote after Deregister = %v", err)
	}
	if err := tb.Scatter(pd, []SGE{{va, 1, lkey}}, 0, []byte{3}); err != ErrBadKey {
		t.Fatalf("Scatter after Deregister = %v", err)
	}
	if buf[0] != 1 {
		t.Fatalf("memory changed after Deregister: %d", buf[0])
	}

	// The slot is reused by the next registration; the stale keys must not reach the new memory.
	buf2 := guardedBuf(t, 64, 0)
	r2 := mustRegister(t, tb, pd, buf2, allRemote, WithIOVA(va))
	if r2.index != r.index {
		t.Fatalf("slot %d not reused (got %d): the test needs reuse", r.index, r2.index)
	}
	if err := tb.WriteRemote(pd, rkey, va, []byte{4}); err != ErrBadKey {
		t.Fatalf("stale rkey on reused slot = %v", err)
	}
	if err := tb.Gather(pd, []SGE{{va, 1, lkey}}, 0, make([]byte, 1)); err != ErrBadKey {
		t.Fatalf("stale lkey on reused slot = %v", err)
	}
	if err := tb.WriteRemote(pd, r2.RKey(), va, []byte{5}); err != nil || buf2[0] != 5 {
		t.Fatalf("new rkey: %v", err)
	}
}

// TestStaleKeyGuarantee pins the documented guarantee exactly: a stale key fails through 255 reuses of
// its slot and matches again at the 256th, when the 8-bit key part has wrapped.
func TestStaleKeyGuarantee(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	r := mustRegister(t, tb, pd, make([]byte, 8), allRemote, WithIOVA(0x1000))
	stale, staleL := r.RKey(), r.LKey()
	for reuse := 1; reuse <= 256; reuse++ {
		if err := tb.Deregister(r); err != nil {
			t.Fatal(err)
		}
		r = mustRegister(t, tb, pd, make([]byte, 8), allRemote, WithIOVA(0x1000))
		err := tb.CheckRemote(pd, stale, 0x1000, 1, RemoteRead)
		if reuse < 256 && (err != ErrBadKey || r.RKey() == stale || r.LKey() == staleL) {
			t.Fatalf("reuse %d: stale key %v: %v (new key %v)", reuse, stale, err, r.RKey())
		}
		if reuse == 256 && (err != nil || r.RKey() != stale) {
			t.Fatalf("reuse 256: key part should have wrapped: %v", err)
		}
	}
}

// TestFreeSlotsFIFO checks that freed slots are reused oldest first.
func TestFreeSlotsFIFO(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	var rs []*Region
	for range 200 {
		rs = append(rs, mustRegister(t, tb, pd, make([]byte, 8), 0))
	}
	order := []int{5, 199, 0, 17, 100}
	for _, i := range order {
		if err := tb.Deregister(rs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range order {
		if r := mustRegister(t, tb, pd, make([]byte, 8), 0); r.index != rs[i].index {
			t.Fatalf("reused slot %d, want %d (oldest free)", r.index, rs[i].index)
		}
	}
	if r := mustRegister(t, tb, pd, make([]byte, 8), 0); r.index != 200 {
		t.Fatalf("fresh slot %d, want 200", r.index)
	}
}

func TestInvalidate(t *testing.T) {
	tb := NewTable()
	pd, pd2 := tb.AllocPD(), tb.AllocPD()
	buf := guardedBuf(t, 64, 0)
	plain := mustRegister(t, tb, pd, make([]byte, 64), allRemote)
	inv := mustRegister(t, tb, pd, buf, allRemote, Invalidatable(), WithIOVA(0x5000))
	rkey, lkey := inv.RKey(), inv.LKey()

	if err := tb.RemoteInvalidate(pd, plain.RKey()); err != ErrNotInvalidatable {
		t.Fatalf("RemoteInvalidate of an ordinary region = %v", err)
	}
	if err := tb.LocalInvalidate(pd, plain.LKey()); err != ErrNotInvalidatable {
		t.Fatalf("LocalInvalidate of an ordinary region = %v", err)
	}
	if err := tb.RemoteInvalidate(pd2, rkey); err != ErrWrongPD {
		t.Fatalf("RemoteInvalidate from another PD = %v", err)
	}
	if err := tb.RemoteInvalidate(pd, wire.RKey(lkey)); err != ErrBadKey {
		t.Fatalf("RemoteInvalidate with the lkey = %v", err)
	}
	if err := tb.CheckRemote(pd, rkey, 0x5000, 8, RemoteRead); err != nil {
		t.Fatalf("before invalidation: %v", err)
	}
	if err := tb.RemoteInvalidate(pd, rkey); err != nil {
		t.Fatalf("RemoteInvalidate = %v", err)
	}
	if err := tb.WriteRemote(pd, rkey, 0x5000, []byte{1}); err != ErrBadKey {
		t.Fatalf("WriteRemote after invalidation = %v", err)
	}
	if err := tb.Scatter(pd, []SGE{{0x5000, 1, lkey}}, 0, []byte{1}); err != ErrBadKey {
		t.Fatalf("Scatter with the lkey after invalidation = %v", err)
	}
	if buf[0] != 0 {
		t.Fatal("invalidated region written")
	}
	if err := tb.LocalInvalidate(pd, lkey); err != nil {
		t.Fatalf("invalidating again = %v, want success as in rxe", err)
	}
	if err := tb.Revalidate(plain); err != ErrStillValid {
		t.Fatalf("Revalidate of a valid region = %v", err)
	}
	if err := tb.Revalidate(inv); err != nil {
		t.Fatal(err)
	}
	if inv.RKey() == rkey || inv.LKey() == lkey {
		t.Fatal("Revalidate kept the old keys")
	}
	if err := tb.CheckRemote(pd, rkey, 0x5000, 1, RemoteRead); err != ErrBadKey {
		t.Fatalf("old rkey after Revalidate = %v", err)
	}
	if err := tb.WriteRemote(pd, inv.RKey(), 0x5000, []byte{9}); err != nil || buf[0] != 9 {
		t.Fatalf("new rkey after Revalidate: %v", err)
	}
	if err := tb.Deregister(inv); err != nil {
		t.Fatal(err)
	}
	if err := tb.Revalidate(inv); err != ErrNotRegistered {
		t.Fatalf("Revalidate after Deregister = %v", err)
	}
	if err := tb.LocalInvalidate(pd, inv.LKey()); err != ErrBadKey {
		t.Fatalf("LocalInvalidate after Deregister = %v", err)
	}
}

func TestAlloc(t *testing.T) {
	tb := NewTable()
	pd := tb.AllocPD()
	r, err := tb.Alloc(pd, 10000, allRemote)
	if err != nil {
		t.Fatal(err)
	}
	mem := r.Bytes()
	if len(mem) != 10000 || r.Len() != 10000 {
		t.Fatalf("Alloc length %d", len(mem))
	}
	if a := addrOf(mem); a%4096 != 0 || r.IOVA() != a {
		t.Fatalf("Alloc address %#x, IOVA %#x: want page-aligned and equal", a, r.IOVA())
	}
	for i, b := range mem {
		if b != 0 {
			t.Fatalf("byte %d = %#x, want zeroed memory", i, b)
		}
	}
	if err := tb.WriteRemote(pd, r.RKey(), r.IOVA()+9999, []byte{0xEE}); err != nil || mem[9999] != 0xEE {
		t.Fatalf("WriteRemote to the last byte: %v", err)
	}
	if err := tb.WriteRemote(pd, r.RKey(), r.IOVA()+10000, []byte{1}); err != ErrBounds {
		t.Fatalf("WriteRemote into the page tail beyond the region = %v", err)
	}
	if err := tb.Deregister(r); err != nil {
		t.Fatal(err)
	}
	if err := tb.ReadRemote(pd, r.RKey(), r.IOVA(), make([]byte, 1)); err != ErrBadKey {
		t.Fatalf("ReadRemote after Deregister of mapped memory = %v", err)
	}
}
