package qp

import (
	"bytes"
	"encoding/binary"
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

var (
	randomSeed  = flag.Uint64("qp.seed", 0, "run TestRandomized with this seed only")
	randomSeeds = flag.Int("qp.seeds", 40, "how many seeds TestRandomized runs")
)

// TestRandomized runs a random mix of SENDs, WRITEs, READs and atomics over a link that drops,
// duplicates and reorders packets at random, and checks that every request completes once, in order,
// successfully, that every receive gets its message, that memory ends up as written and that every
// atomic executed exactly once. A failure prints the seed; -qp.seed=N replays it.
func TestRandomized(t *testing.T) {
	seeds := make([]uint64, 0, *randomSeeds)
	if *randomSeed != 0 {
		seeds = append(seeds, *randomSeed)
	} else {
		for i := 0; i < *randomSeeds; i++ {
			seeds = append(seeds, uint64(i+1))
		}
	}
	for _, seed := range seeds {
		if !runRandomized(t, seed) {
			t.Fatalf("seed %d failed; replay with: go test ./qp -run TestRandomized -qp.seed=%d -v", seed, seed)
		}
	}
}

func runRandomized(t *testing.T, seed uint64) bool {
	rng := rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))
	o := defaultOpts()
	o.mtu = []wire.MTU{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU4096}[rng.IntN(4)]
	o.timeout = 6 // 262 us
	o.minRNR = 1
	o.psnA = wire.PSN(rng.Uint32N(1 << 24))
	o.psnB = wire.PSN(rng.Uint32N(1 << 24))
	if rng.IntN(2) == 0 {
		o.ackDelay = time.Duration(rng.IntN(30)) * time.Microsecond
	}
	l := newLink(t, o)
	pDrop := rng.Float64() * 0.08
	pDup := rng.Float64() * 0.05
	pDelay := rng.Float64() * 0.1
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		switch x := rng.Float64(); {
		case x < pDrop:
			return nil
		case x < pDrop+pDup:
			return [][]byte{p.Bytes(), p.Bytes()}
		}
		return [][]byte{p.Bytes()}
	}
	l.jitter = func() time.Duration {
		if rng.Float64() < pDelay {
			return time.Duration(rng.IntN(50)) * time.Microsecond
		}
		return 0
	}

	const size = 1 << 16
	src := l.a.reg(t, size, mr.LocalWrite)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(rng.Uint32())
	}
	readBuf := l.a.reg(t, size, mr.LocalWrite)
	remote := l.b.reg(t, size, mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic)
	for i := range remote.Bytes() {
		remote.Bytes()[i] = byte(rng.Uint32())
	}
	model := bytes.Clone(remote.Bytes())
	recvBuf := l.b.reg(t, size, mr.LocalWrite)

	type expectRecv struct {
		id   uint64
		data []byte
	}
	var wantRecv []expectRecv
	var wantReads []struct {
		off  int
		data []byte
	}
	counters := 4
	atomicsDone := make([]uint64, counters) // adds issued per counter
	var atomicOrig []struct {
		counter int
		want    uint64
		off     int
	}
	ops := 20 + rng.IntN(40)
	recvOff, readOff, atomOff := 0, 0, size-8*64
	posted := 0
	for i := 0; i < ops; i++ {
		n := rng.IntN(3*o.mtu.Bytes() + 2)
		srcOff := rng.IntN(size - n)
		wr := SendWR{ID: uint64(i), Flags: Signaled, SGL: sge(src, srcOff, n)}
		switch k := rng.IntN(4); k {
		case 0:
			if recvOff+n > size/2 {
				continue
			}
			wr.Opcode = WRSend
			id := uint64(1000 + len(wantRecv))
			must(t, l.b.qp.PostRecv(&RecvWR{ID: id, SGL: sge(recvBuf, recvOff, n)}))
			wantRecv = append(wantRecv, expectRecv{id, src.Bytes()[srcOff : srcOff+n]})
			recvOff += n
		case 1:
			dst := rng.IntN(size/2 - n)
			wr.Opcode = WRWrite
			wr.RemoteAddr, wr.RKey = remote.IOVA()+uint64(dst), remote.RKey()
			copy(model[dst:], src.Bytes()[srcOff:srcOff+n])
		case 2:
			if readOff+n > size-8*64 {
				continue
			}
			from := size/2 + rng.IntN(size/2-8*64-n)
			wr.Opcode = WRRead
			wr.SGL = sge(readBuf, readOff, n)
			wr.RemoteAddr, wr.RKey = remote.IOVA()+uint64(from), remote.RKey()
			wantReads = append(wantReads, struct {
				off  int
				data []byte
			}{readOff, model[from : from+n]}) // the READ region is never written
			readOff += n
		case 3:
			if atomOff+8 > size {
				continue
			}
			c := rng.IntN(counters)
			add := uint64(rng.IntN(1000) + 1)
			wr.Opcode = WRFetchAdd
			wr.SGL = sge(readBuf, atomOff, 8)
			target := size - 8*(c+1)
			wr.RemoteAddr, wr.RKey, wr.CompareAdd = remote.IOVA()+uint64(target), remote.RKey(), add
			cur := binary.NativeEndian.Uint64(model[target:])
			atomicOrig = append(atomicOrig, struct {
				counter int
				want    uint64
				off     int
			}{c, cur, atomOff})
			binary.NativeEndian.PutUint64(model[target:], cur+add)
			atomicsDone[c]++
			atomOff += 8
		}
		must(t, l.a.qp.PostSend(l.now, &wr))
		posted++
	}
	l.run(10 * time.Second)

	fail := func(format string, args ...any) bool {
		t.Logf("seed %d (mtu %v drop %.3f dup %.3f delay %.3f): "+format, append([]any{seed, o.mtu, pDrop, pDup, pDelay}, args...)...)
		if *randomSeed != 0 {
			t.Logf("ladder:\n%s", l.ladderString())
		}
		return false
	}
	got := poll(l.a.scq)
	if len(got) != posted {
		return fail("%d send completions for %d requests; A %v B %v", len(got), posted, l.a.qp.State(), l.b.qp.State())
	}
	for i := 1; i < len(got); i++ {
		if got[i].WRID <= got[i-1].WRID || got[i].Status != StatusSuccess {
			return fail("completion %d: %+v after %+v", i, got[i], got[i-1])
		}
	}
	rc := poll(l.b.rcq)
	if len(rc) != len(wantRecv) {
		return fail("%d receive completions, want %d", len(rc), len(wantRecv))
	}
	off := 0
	for i, w := range wantRecv {
		if rc[i].WRID != w.id || rc[i].ByteLen != uint32(len(w.data)) || rc[i].Status != StatusSuccess {
			return fail("receive %d: %+v", i, rc[i])
		}
		if !bytes.Equal(recvBuf.Bytes()[off:off+len(w.data)], w.data) {
			return fail("receive %d data differs", i)
		}
		off += len(w.data)
	}
	for i, r := range wantReads {
		if !bytes.Equal(readBuf.Bytes()[r.off:r.off+len(r.data)], r.data) {
			return fail("READ %d data differs", i)
		}
	}
	for i, a := range atomicOrig {
		if v := binary.NativeEndian.Uint64(readBuf.Bytes()[a.off:]); v != a.want {
			return fail("atomic %d returned %d, want %d (executed twice or out of order)", i, v, a.want)
		}
	}
	if !bytes.Equal(remote.Bytes(), model) {
		return fail("responder memory differs from the model")
	}
	return true
}
