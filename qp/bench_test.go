package qp

import (
	"testing"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// enginePair is a minimal, allocation-free driver for benchmarks: packets go straight from one engine
// to the other through one reused buffer.
type enginePair struct {
	l   *link
	buf []byte
	wcs []Completion
}

func newEnginePair(b *testing.B, mtu wire.MTU) *enginePair {
	o := defaultOpts()
	o.mtu = mtu
	return &enginePair{l: newLink(b, o), buf: make([]byte, 0, 4200), wcs: make([]Completion, 16)}
}

// exchange moves packets both ways until neither side has anything to send, and returns how many.
func (e *enginePair) exchange(b *testing.B) int {
	n := 0
	now := e.l.now
	for moved := true; moved; {
		moved = false
		for _, h := range [2]*host{e.l.a, e.l.b} {
			for {
				out, _, ok := h.qp.AppendPacket(now, e.buf[:0])
				if !ok {
					break
				}
				p, err := wire.Parse(out)
				if err != nil {
					b.Fatal(err)
				}
				e.l.other(h).qp.HandlePacket(now, p, nil)
				moved = true
				n++
			}
		}
	}
	return n
}

// BenchmarkWrite64K moves one 64 KiB RDMA WRITE at MTU 4096 (16 packets and an ACK) through the
// requester, the responder and the completer per iteration: the per-packet engine cost without I/O.
func BenchmarkWrite64K(b *testing.B) {
	e := newEnginePair(b, wire.MTU4096)
	src := e.l.a.reg(b, 1<<16, mr.LocalWrite)
	dst := e.l.b.reg(b, 1<<16, mr.LocalWrite|mr.RemoteWrite)
	wr := SendWR{Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 1<<16), RemoteAddr: dst.IOVA(), RKey: dst.RKey()}
	b.ReportAllocs()
	b.SetBytes(1 << 16)
	pkts := 0
	for b.Loop() {
		if err := e.l.a.qp.PostSend(e.l.now, &wr); err != nil {
			b.Fatal(err)
		}
		pkts += e.exchange(b)
		if e.l.a.scq.Poll(e.wcs) != 1 || e.wcs[0].Status != StatusSuccess {
			b.Fatalf("completion %+v", e.wcs[0])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(pkts), "ns/pkt")
}

// BenchmarkSendPingPong moves a 16-byte SEND and its ACK per iteration.
func BenchmarkSendPingPong(b *testing.B) {
	e := newEnginePair(b, wire.MTU1024)
	src := e.l.a.reg(b, 16, mr.LocalWrite)
	dst := e.l.b.reg(b, 16, mr.LocalWrite)
	wr := SendWR{Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 16)}
	rwr := RecvWR{SGL: sge(dst, 0, 16)}
	b.ReportAllocs()
	for b.Loop() {
		if err := e.l.b.qp.PostRecv(&rwr); err != nil {
			b.Fatal(err)
		}
		if err := e.l.a.qp.PostSend(e.l.now, &wr); err != nil {
			b.Fatal(err)
		}
		e.exchange(b)
		if e.l.a.scq.Poll(e.wcs) != 1 || e.l.b.rcq.Poll(e.wcs) != 1 {
			b.Fatal("missing completion")
		}
	}
}

// BenchmarkRead64K moves one 64 KiB RDMA READ (a request and 16 responses) per iteration.
func BenchmarkRead64K(b *testing.B) {
	e := newEnginePair(b, wire.MTU4096)
	local := e.l.a.reg(b, 1<<16, mr.LocalWrite)
	remote := e.l.b.reg(b, 1<<16, mr.RemoteRead)
	wr := SendWR{Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 1<<16), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}
	b.ReportAllocs()
	b.SetBytes(1 << 16)
	for b.Loop() {
		if err := e.l.a.qp.PostSend(e.l.now, &wr); err != nil {
			b.Fatal(err)
		}
		e.exchange(b)
		if e.l.a.scq.Poll(e.wcs) != 1 || e.wcs[0].Status != StatusSuccess {
			b.Fatalf("completion %+v", e.wcs[0])
		}
	}
}

// TestEngineZeroAllocs asserts the steady state of the per-packet paths allocates nothing.
func TestEngineZeroAllocs(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU4096
	e := &enginePair{l: newLink(t, o), buf: make([]byte, 0, 4200), wcs: make([]Completion, 16)}
	src := e.l.a.reg(t, 1<<16, mr.LocalWrite)
	dst := e.l.b.reg(t, 1<<16, mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic)
	recv := e.l.b.reg(t, 1<<16, mr.LocalWrite)
	write := SendWR{Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 1<<16), RemoteAddr: dst.IOVA(), RKey: dst.RKey()}
	read := SendWR{Opcode: WRRead, Flags: Signaled, SGL: sge(src, 0, 1<<16), RemoteAddr: dst.IOVA(), RKey: dst.RKey()}
	send := SendWR{Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 9000)}
	fadd := SendWR{Opcode: WRFetchAdd, Flags: Signaled, SGL: sge(src, 0, 8), RemoteAddr: dst.IOVA(), RKey: dst.RKey(), CompareAdd: 1}
	rwr := RecvWR{SGL: sge(recv, 0, 1<<16)}
	b := &testing.B{}
	run := func() {
		must(t, e.l.b.qp.PostRecv(&rwr))
		for _, wr := range []*SendWR{&write, &read, &send, &fadd} {
			must(t, e.l.a.qp.PostSend(e.l.now, wr))
		}
		e.exchange(b)
		if e.l.a.scq.Poll(e.wcs) != 4 || e.l.b.rcq.Poll(e.wcs) != 1 {
			t.Fatal("missing completions")
		}
	}
	run()
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Fatalf("%v allocations per WRITE+READ+SEND+atomic round", n)
	}
}
