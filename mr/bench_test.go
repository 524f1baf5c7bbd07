package mr

import (
	"testing"
)

// benchFixture is one 64 KiB region with every right and an SGE list of four 1 KiB elements in it.
type benchFixture struct {
	tb  *Table
	pd  *PD
	r   *Region
	buf []byte
	sgl []SGE
}

func newBenchFixture(tb testing.TB) *benchFixture {
	f := &benchFixture{tb: NewTable()}
	f.pd = f.tb.AllocPD()
	// Other regions so the lookup is not into a one-entry table.
	for range 1000 {
		mustRegister(tb, f.tb, f.pd, make([]byte, 64), allRemote)
	}
	f.buf = make([]byte, 64<<10)
	f.r = mustRegister(tb, f.tb, f.pd, f.buf, allRemote)
	for i := range 4 {
		f.sgl = append(f.sgl, SGE{Addr: f.r.IOVA() + uint64(i)*4096, Length: 1024, LKey: f.r.LKey()})
	}
	return f
}

// TestDataPathAllocs asserts that every data-path operation, and its common failures, allocate
// nothing.
func TestDataPathAllocs(t *testing.T) {
	f := newBenchFixture(t)
	tb, pd, key, va := f.tb, f.pd, f.r.RKey(), f.r.IOVA()
	page := make([]byte, 4096)
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"CheckRemote", func() { _ = tb.CheckRemote(pd, key, va, 4096, RemoteWrite) }},
		{"CheckRemote bad key", func() { _ = tb.CheckRemote(pd, key^1, va, 4096, RemoteWrite) }},
		{"CheckRemote bounds", func() { _ = tb.CheckRemote(pd, key, va-1, 4096, RemoteWrite) }},
		{"WriteRemote", func() { _ = tb.WriteRemote(pd, key, va, page) }},
		{"ReadRemote", func() { _ = tb.ReadRemote(pd, key, va, page) }},
		{"CompareSwap", func() { _, _ = tb.CompareSwap(pd, key, va, 1, 2) }},
		{"FetchAdd", func() { _, _ = tb.FetchAdd(pd, key, va, 1) }},
		{"FetchAdd misaligned", func() { _, _ = tb.FetchAdd(pd, key, va+4, 1) }},
		{"Scatter", func() { _ = tb.Scatter(pd, f.sgl, 512, page[:2048]) }},
		{"Gather", func() { _ = tb.Gather(pd, f.sgl, 512, page[:2048]) }},
		{"SGLength", func() { _, _ = SGLength(f.sgl) }},
	} {
		if n := testing.AllocsPerRun(100, tc.fn); n != 0 {
			t.Errorf("%s: %v allocs/op, want 0", tc.name, n)
		}
	}
}

func BenchmarkCheckRemote(b *testing.B) {
	f := newBenchFixture(b)
	key, va := f.r.RKey(), f.r.IOVA()
	b.ReportAllocs()
	for b.Loop() {
		if err := f.tb.CheckRemote(f.pd, key, va, 4096, RemoteWrite); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheckRemoteParallel(b *testing.B) {
	f := newBenchFixture(b)
	key, va := f.r.RKey(), f.r.IOVA()
	b.ReportAllocs()
	b.ResetTimer() // RunParallel, unlike b.Loop, counts the fixture's setup otherwise
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := f.tb.CheckRemote(f.pd, key, va, 4096, RemoteWrite); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkCheckRemoteBadKey(b *testing.B) {
	f := newBenchFixture(b)
	key, va := f.r.RKey()^0x100, f.r.IOVA()
	b.ReportAllocs()
	for b.Loop() {
		if err := f.tb.CheckRemote(f.pd, key, va, 4096, RemoteWrite); err != ErrBadKey {
			b.Fatal(err)
		}
	}
}

func BenchmarkWriteRemote4K(b *testing.B) {
	f := newBenchFixture(b)
	key, va := f.r.RKey(), f.r.IOVA()
	// The payload of a received packet starts 8-byte aligned (the datapath's rxSkew); a plain
	// make([]byte, 4096) need not, and a copy from a source 4 bytes off into an aligned region
	// takes Go's REP MOVSB path, 5 to 8 times slower here (360 against 80 ns).
	src := alignedBytes(4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.tb.WriteRemote(f.pd, key, va, src); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadRemote4K(b *testing.B) {
	f := newBenchFixture(b)
	key, va := f.r.RKey(), f.r.IOVA()
	dst := make([]byte, 4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.tb.ReadRemote(f.pd, key, va, dst); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFetchAdd(b *testing.B) {
	f := newBenchFixture(b)
	key, va := f.r.RKey(), f.r.IOVA()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.tb.FetchAdd(f.pd, key, va, 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFetchAddLocked(b *testing.B) {
	tb := NewTable()
	pd := tb.AllocPD()
	buf := make([]byte, 64)
	r := mustRegister(b, tb, pd, buf[4:], allRemote, WithIOVA(0x1000)) // real address 4 mod 8
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tb.FetchAdd(pd, r.RKey(), 0x1000, 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompareSwap(b *testing.B) {
	f := newBenchFixture(b)
	key, va := f.r.RKey(), f.r.IOVA()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.tb.CompareSwap(f.pd, key, va, 0, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkScatter4K(b *testing.B) {
	f := newBenchFixture(b)
	src := make([]byte, 4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.tb.Scatter(f.pd, f.sgl, 0, src); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGather4K(b *testing.B) {
	f := newBenchFixture(b)
	dst := make([]byte, 4096)
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.tb.Gather(f.pd, f.sgl, 0, dst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKeyDecrypt measures the cipher alone: a key the memo has not seen.
func BenchmarkKeyDecrypt(b *testing.B) {
	s := NewTable().rkeys.speck
	var v uint32
	for b.Loop() {
		v = s.decrypt(v)
	}
	sinkKey = v
}

// BenchmarkKeyDecryptMemo measures a key the memo holds, as every packet after a message's first finds
// it.
func BenchmarkKeyDecryptMemo(b *testing.B) {
	c := NewTable().rkeys
	var v uint32
	for b.Loop() {
		v += c.decrypt(0x12345678)
	}
	sinkKey = v
}

var sinkKey uint32
