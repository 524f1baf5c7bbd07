package qp

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// This file holds the scenario tests of CONFORMANCE.md that the other files do not: mostly packets a
// well-behaved peer never sends, injected straight into one QP, and the answers it queues.

// inject hands h's QP a packet built from f and payload as if it had crossed the link. The P_Key is
// the default and the destination QPN h's, unless f sets them.
func (l *link) inject(h *host, f wire.Fields, payload []byte) {
	l.t.Helper()
	if f.BTH.PKey == 0 {
		f.BTH.PKey = wire.DefaultPKey
	}
	if f.BTH.DestQP == 0 {
		f.BTH.DestQP = h.qp.QPN()
	}
	b, err := wire.Append(nil, &f, payload)
	must(l.t, err)
	p, err := wire.Parse(b)
	must(l.t, err)
	h.qp.HandlePacket(l.now, p, nil)
}

// drain returns what h's QP sends now, described as on the ladder, without delivering it.
func (l *link) drain(h *host) []string {
	l.t.Helper()
	var out []string
	for {
		b, _, ok := h.qp.AppendPacket(l.now, nil)
		if !ok {
			return out
		}
		p, err := wire.Parse(b)
		must(l.t, err)
		out = append(out, describe(p))
	}
}

func expectLines(t *testing.T, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("sent:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// rq returns the header fields of a request with AckReq set.
func rq(op wire.Opcode, psn wire.PSN) wire.Fields {
	return wire.Fields{BTH: wire.BTHFields{Opcode: op, PSN: psn, AckReq: true}}
}

func reth(op wire.Opcode, psn wire.PSN, r *mr.Region, off uint64, n uint32) wire.Fields {
	f := rq(op, psn)
	f.RETH = wire.RETHFields{VA: r.IOVA() + off, RKey: r.RKey(), DMALen: n}
	return f
}

// CONFORMANCE D5: a READ response is lost, the region is deregistered before the retransmitted READ
// arrives; the responder replays from its resource, finds the key gone and NAKs remote access error
// instead of sending stale memory. Both QPs end in ERR.
func TestReplayAfterDeregister(t *testing.T) {
	o := defaultOpts()
	o.timeout = 8
	l := newLink(t, o)
	local := l.a.reg(t, 64, mr.LocalWrite)
	remote := l.b.reg(t, 64, mr.RemoteRead)
	l.hook = dropNth("B", wire.RCReadResponseOnly, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, SGL: sge(local, 0, 64), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(100 * time.Microsecond)
	must(t, l.b.mem.Deregister(remote))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_READ_REQUEST psn=256 A len=64",
		"<- RDMA_READ_RESPONSE_ONLY psn=256 [ACK msn=1] +64 (lost)",
		"-> SEND_ONLY psn=257 A",
		"<- ACKNOWLEDGE psn=257 [RNR NAK 0.64ms msn=1]",
		"-> RDMA_READ_REQUEST psn=256 A len=64",
		"-> SEND_ONLY psn=257 A",
		"<- ACKNOWLEDGE psn=256 [NAK remote-access-error msn=1]",
	)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Status: StatusRemAccessErr, Opcode: CompRDMARead, QPN: 0x11},
		Completion{WRID: 2, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11})
	if l.a.qp.State() != StateErr || l.b.qp.State() != StateErr {
		t.Fatalf("states %v %v", l.a.qp.State(), l.b.qp.State())
	}
	if !bytes.Equal(local.Bytes(), make([]byte, 64)) {
		t.Fatal("the READ's buffer changed")
	}
}

// CONFORMANCE Q8: in SQD a request already started goes on to its last packet, and one that was sent
// but lost is still retransmitted; no new request starts until the QP is back in RTS. Drained reports
// when nothing is outstanding.
func TestSQDrain(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	o.timeout = 8
	l := newLink(t, o)
	src := l.a.reg(t, 600, mr.LocalWrite)
	dst := l.b.reg(t, 1200, mr.LocalWrite)
	for i := 0; i < 2; i++ {
		must(t, l.b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: sge(dst, i*600, 600)}))
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 600)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 600)}))
	l.hook = dropNth("A", wire.RCSendLast, 1)
	if _, _, ok := l.a.qp.AppendPacket(l.now, nil); !ok { // SEND_FIRST of request 1 leaves, unseen
		t.Fatal("nothing to send")
	}
	must(t, l.a.qp.Modify(l.now, &Attr{State: StateSQD}, AttrState))
	if l.a.qp.Drained() {
		t.Fatal("drained with a request half sent")
	}
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_MIDDLE psn=257 +256",
		"-> SEND_LAST psn=258 A +88 (lost)",
		"<- ACKNOWLEDGE psn=256 [NAK psn-sequence-error msn=0]",
		"-> SEND_FIRST psn=256 +256",
		"-> SEND_MIDDLE psn=257 +256",
		"-> SEND_LAST psn=258 A +88",
		"<- ACKNOWLEDGE psn=258 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11, ByteLen: 600})
	if !l.a.qp.Drained() || l.a.qp.State() != StateSQD {
		t.Fatalf("state %v drained %v", l.a.qp.State(), l.a.qp.Drained())
	}
	must(t, l.a.qp.Modify(l.now, &Attr{State: StateRTS}, AttrState))
	if l.a.qp.Drained() {
		t.Fatal("drained in RTS")
	}
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 2, Opcode: CompSend, QPN: 0x11, ByteLen: 600})
}

// CONFORMANCE Q8: a request sent before SQD whose packets are lost is retransmitted after the timeout
// even though SQD starts no new request.
func TestSQDRetransmits(t *testing.T) {
	o := defaultOpts()
	o.timeout = 8
	o.retry = 1
	l := newLink(t, o)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	l.hook = dropNth("A", wire.RCSendOnly, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled}))
	l.pump()
	must(t, l.a.qp.Modify(l.now, &Attr{State: StateSQD}, AttrState))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=256 A (lost)",
		"-> SEND_ONLY psn=256 A",
		"<- ACKNOWLEDGE psn=256 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11})
	if !l.a.qp.Drained() {
		t.Fatal("not drained")
	}
}

// CONFORMANCE N6: two SENDs reach a responder with no receive: the first is RNR NAKed, the second
// draws a PSN sequence error NAK for the same PSN. The sequence NAK asks for nothing the RNR wait does
// not already do, so it costs no transport retry: with retry_cnt 0 the requester waits out the RNR
// timer and both SENDs succeed, the second not executed before the first.
func TestRequestsBehindRNR(t *testing.T) {
	o := defaultOpts()
	o.retry = 0
	o.minRNR = 1 // 10 us
	l := newLink(t, o)
	dst := l.b.reg(t, 64, mr.LocalWrite)
	src := l.a.reg(t, 64, mr.LocalWrite)
	fill(src.Bytes(), 3)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 8)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 8, 8)}))
	l.run(5 * time.Microsecond)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 8)}))
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 2, SGL: sge(dst, 8, 8)}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=256 A +8",
		"-> SEND_ONLY psn=257 A +8",
		"<- ACKNOWLEDGE psn=256 [RNR NAK 0.01ms msn=0]",
		"<- ACKNOWLEDGE psn=256 [NAK psn-sequence-error msn=0]",
		"-> SEND_ONLY psn=256 A +8",
		"-> SEND_ONLY psn=257 A +8",
		"<- ACKNOWLEDGE psn=257 [ACK msn=2]",
	)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompSend, QPN: 0x11, ByteLen: 8},
		Completion{WRID: 2, Opcode: CompSend, QPN: 0x11, ByteLen: 8})
	if !bytes.Equal(dst.Bytes()[:16], src.Bytes()[:16]) {
		t.Fatal("data differs")
	}
	if c := l.a.qp.Counters(); c.RetryExceededErr != 0 || c.RcvdSeqErr != 1 || c.RcvdRNRErr != 1 || c.RetryIgnored != 1 {
		t.Fatalf("requester counters %+v", c)
	}
}

var _ = binary.NativeEndian
