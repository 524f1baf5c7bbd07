package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// CONFORMANCE U1, U2, U7: UD datagrams carry a DETH with the Q_Key and source QP; the receive gets the
// GRH then the payload; a wrong Q_Key is dropped silently while the sender completes.
func TestUD(t *testing.T) {
	o := defaultOpts()
	o.typ = UD
	l := newLink(t, o)
	src := l.a.reg(t, 100, mr.LocalWrite)
	fill(src.Bytes(), 4)
	dst := l.b.reg(t, 200, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 200)}))
	ah := &AddressHandle{HopLimit: 64}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSendImm, Imm: 7, Flags: Signaled, SGL: sge(src, 0, 100), AH: ah, RemoteQPN: 0x22, RemoteQKey: 0x1111}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 100), AH: ah, RemoteQPN: 0x22, RemoteQKey: 0x2222}))
	l.run(time.Second)
	l.expectLadder(
		"-> UD SEND_ONLY_WITH_IMMEDIATE psn=256 +100",
		"-> UD SEND_ONLY psn=257 +100",
	)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompSend, QPN: 0x11, ByteLen: 100},
		Completion{WRID: 2, Opcode: CompSend, QPN: 0x11, ByteLen: 100})
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Opcode: CompRecv, QPN: 0x22, ByteLen: 140, SrcQP: 0x11, Imm: 7, Flags: WithGRH | WithImm})
	if !bytes.Equal(dst.Bytes()[40:140], src.Bytes()) {
		t.Fatal("data differs")
	}
	if c := l.b.qp.Counters(); c.DropQKey != 1 {
		t.Fatalf("drop_qkey %d", c.DropQKey)
	}
	// CONFORMANCE U3: a datagram larger than the MTU (for UD, the port's: 4096 by default, as rxe uses
	// its port MTU) is refused when posted.
	big := l.a.reg(t, 5000, mr.LocalWrite)
	if err := l.a.qp.PostSend(l.now, &SendWR{Opcode: WRSend, SGL: sge(big, 0, 4097), AH: ah}); err != ErrMessageTooLong {
		t.Fatalf("UD above the MTU: %v", err)
	}
	if err := l.a.qp.PostSend(l.now, &SendWR{Opcode: WRSend}); err != ErrNoAH {
		t.Fatalf("UD without an AH: %v", err)
	}
	// CONFORMANCE U5.
	if err := l.a.qp.PostSend(l.now, &SendWR{Opcode: WRWrite, AH: ah}); err != ErrBadOpcode {
		t.Fatalf("WRITE on UD: %v", err)
	}
}

// CONFORMANCE U7, U8: UC sends no ACKs and completes on send; a lost middle packet loses the message
// at the receiver without an error, and the receive is used by the next message.
func TestUC(t *testing.T) {
	o := defaultOpts()
	o.typ = UC
	o.mtu = wire.MTU256
	l := newLink(t, o)
	src := l.a.reg(t, 1024, mr.LocalWrite)
	fill(src.Bytes(), 8)
	dst := l.b.reg(t, 1024, mr.LocalWrite)
	remote := l.b.reg(t, 1024, mr.RemoteWrite|mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 1024)}))
	l.hook = dropNth("A", wire.UCSendMiddle, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 600)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 300)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 3, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 1000), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> UC SEND_FIRST psn=256 +256",
		"-> UC SEND_MIDDLE psn=257 +256 (lost)",
		"-> UC SEND_LAST psn=258 +88",
		"-> UC SEND_FIRST psn=259 +256",
		"-> UC SEND_LAST psn=260 +44",
		"-> UC RDMA_WRITE_FIRST psn=261 len=1000 +256",
		"-> UC RDMA_WRITE_MIDDLE psn=262 +256",
		"-> UC RDMA_WRITE_MIDDLE psn=263 +256",
		"-> UC RDMA_WRITE_LAST psn=264 +232",
	)
	if got := poll(l.a.scq); len(got) != 3 {
		t.Fatalf("send completions %+v", got)
	}
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Opcode: CompRecv, QPN: 0x22, ByteLen: 300})
	if !bytes.Equal(dst.Bytes()[:300], src.Bytes()[:300]) || !bytes.Equal(remote.Bytes()[:1000], src.Bytes()[:1000]) {
		t.Fatal("data differs")
	}
}

// CONFORMANCE N7: with an SRQ the receives come from the shared queue; an empty one RNR NAKs.
func TestSRQ(t *testing.T) {
	o := defaultOpts()
	o.srq = true
	l := newLink(t, o)
	src := l.a.reg(t, 64, mr.LocalWrite)
	dst := l.b.reg(t, 64, mr.LocalWrite)
	srq := l.b.qp.cfg.SRQ
	if err := l.b.qp.PostRecv(&RecvWR{}); err != ErrSRQ {
		t.Fatalf("PostRecv on an SRQ QP: %v", err)
	}
	limitHit := 0
	must(t, srq.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 32)}))
	must(t, srq.PostRecv(&RecvWR{ID: 2, SGL: sge(dst, 32, 32)}))
	srq.ArmLimit(2, func() { limitHit++ })
	for i := 0; i < 3; i++ {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(i), Opcode: WRSend, SGL: sge(src, 0, 20)}))
	}
	l.run(time.Millisecond)
	got := poll(l.b.rcq)
	if len(got) != 2 || got[0].WRID != 1 || got[1].WRID != 2 || limitHit != 1 {
		t.Fatalf("receives %+v, limit events %d", got, limitHit)
	}
	if c := l.b.qp.Counters(); c.SendRNRErr == 0 {
		t.Fatal("no RNR NAK for the third SEND")
	}
	must(t, srq.PostRecv(&RecvWR{ID: 3, SGL: sge(dst, 0, 32)}))
	l.run(time.Second)
	if got := poll(l.b.rcq); len(got) != 1 || got[0].WRID != 3 {
		t.Fatalf("receive after the RNR wait %+v", got)
	}
}

// CONFORMANCE R7: with max_rd_atomic 1 a second READ waits for the first to complete; a fenced SEND
// waits for outstanding READs.
func TestInitiatorDepthAndFence(t *testing.T) {
	o := defaultOpts()
	o.rdAtomic = 1
	l := newLink(t, o)
	local := l.a.reg(t, 64, mr.LocalWrite)
	remote := l.b.reg(t, 64, mr.RemoteRead)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, SGL: sge(local, 0, 8), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRRead, SGL: sge(local, 8, 8), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 3, Opcode: WRSend, Flags: Fence}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_READ_REQUEST psn=256 A len=8",
		"<- RDMA_READ_RESPONSE_ONLY psn=256 [ACK msn=1] +8",
		"-> RDMA_READ_REQUEST psn=257 A len=8",
		"<- RDMA_READ_RESPONSE_ONLY psn=257 [ACK msn=2] +8",
		"-> SEND_ONLY psn=258 A",
		"<- ACKNOWLEDGE psn=258 [ACK msn=3]",
	)
}

// CONFORMANCE R6, A2: a long WRITE stops at 128 unacknowledged PSNs and asks for an ACK every 65
// packets.
func TestWindowAndAckReq(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	l := newLink(t, o)
	src := l.a.reg(t, 256*200, mr.LocalWrite)
	remote := l.b.reg(t, 256*200, mr.RemoteWrite|mr.LocalWrite)
	fill(src.Bytes(), 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 256*200), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	n := 0
	for {
		_, _, ok := l.a.qp.AppendPacket(l.now, nil)
		if !ok {
			break
		}
		n++
	}
	if n != maxUnackedPSNs {
		t.Fatalf("sent %d packets before waiting, want %d", n, maxUnackedPSNs)
	}
	l = newLink(t, o)
	src = l.a.reg(t, 256*200, mr.LocalWrite)
	remote = l.b.reg(t, 256*200, mr.RemoteWrite|mr.LocalWrite)
	fill(src.Bytes(), 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 256*200), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	var acked []int
	for i, s := range l.ladder {
		if contains(s, "->") && contains(s, " A") {
			acked = append(acked, i)
		}
	}
	if len(acked) < 3 || acked[0] != 64 {
		t.Fatalf("AckReq on packets %v, want the 65th first", acked)
	}
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 256 * 200})
	if !bytes.Equal(src.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
}

// Inline data is copied at post time: changing the caller's slice afterwards changes nothing.
func TestInline(t *testing.T) {
	l := newLink(t, defaultOpts())
	dst := l.b.reg(t, 16, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 16)}))
	data := []byte("inline!")
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Inline | Signaled, InlineData: data}))
	copy(data, "XXXXXXX")
	l.run(time.Second)
	if string(dst.Bytes()[:7]) != "inline!" {
		t.Fatalf("received %q", dst.Bytes()[:7])
	}
}

// A QP in SQD starts no new request; back in RTS it goes on.
func TestSQD(t *testing.T) {
	l := newLink(t, defaultOpts())
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	must(t, l.a.qp.Modify(l.now, &Attr{State: StateSQD}, AttrState))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled}))
	l.run(time.Second)
	if len(l.ladder) != 0 {
		t.Fatalf("sent in SQD:\n%s", l.ladderString())
	}
	must(t, l.a.qp.Modify(l.now, &Attr{State: StateRTS}, AttrState))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11})
}
