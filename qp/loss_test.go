package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// dropNth returns a hook that drops the nth packet (1-based) that matches op from the given side.
func dropNth(from string, op wire.Opcode, nth int) func(*link, *host, wire.Packet) [][]byte {
	seen := 0
	return func(l *link, h *host, p wire.Packet) [][]byte {
		if h.name == from && p.Opcode() == op {
			seen++
			if seen == nth {
				return nil
			}
		}
		return [][]byte{p.Bytes()}
	}
}

// dropPasses returns a hook that drops the packet the given side sends with each PSN in drops the
// time that is its value (1-based): the first transmission, or a later resend.
func dropPasses(from string, drops map[wire.PSN]int) func(*link, *host, wire.Packet) [][]byte {
	pass := map[wire.PSN]int{}
	return func(l *link, h *host, p wire.Packet) [][]byte {
		if h.name == from {
			psn := p.BTH().PSN()
			pass[psn]++
			if n, ok := drops[psn]; ok && n == pass[psn] {
				return nil
			}
		}
		return [][]byte{p.Bytes()}
	}
}

// CONFORMANCE T1: a lost READ request is sent again, same PSN, after the local ACK timeout.
func TestLostReadRequest(t *testing.T) {
	o := defaultOpts()
	o.timeout = 10 // 4.19 ms
	l := newLink(t, o)
	local := l.a.reg(t, 100, mr.LocalWrite)
	remote := l.b.reg(t, 100, mr.RemoteRead)
	fill(remote.Bytes(), 3)
	l.hook = dropNth("A", wire.RCReadRequest, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 100), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	start := l.now
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_READ_REQUEST psn=256 A len=100 (lost)",
		"-> RDMA_READ_REQUEST psn=256 A len=100",
		"<- RDMA_READ_RESPONSE_ONLY psn=256 [ACK msn=1] +100",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 100})
	if !bytes.Equal(local.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
	if d := l.now.Sub(start); d < ackTimeout(10) {
		t.Fatalf("retransmitted after %v, before the %v timeout", d, ackTimeout(10))
	}
	if c := l.a.qp.Counters(); c.Timeouts != 1 || c.CompleterRetryErr != 1 {
		t.Fatalf("counters %+v", c)
	}
}

// CONFORMANCE T4, P5: a lost ACK makes the requester send the SEND again; the responder ACKs the
// duplicate with PSN e-1 and does not deliver it twice.
func TestLostAck(t *testing.T) {
	o := defaultOpts()
	o.timeout = 8
	l := newLink(t, o)
	src := l.a.reg(t, 10, mr.LocalWrite)
	dst := l.b.reg(t, 64, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 32)}))
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 2, SGL: sge(dst, 32, 32)}))
	l.hook = dropNth("B", wire.RCAcknowledge, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 9, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 10)}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=256 A +10",
		"<- ACKNOWLEDGE psn=256 [ACK msn=1] (lost)",
		"-> SEND_ONLY psn=256 A +10",
		"<- ACKNOWLEDGE psn=256 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 9, Opcode: CompSend, QPN: 0x11, ByteLen: 10})
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Opcode: CompRecv, QPN: 0x22, ByteLen: 10})
	if c := l.b.qp.Counters(); c.DuplicateRequest != 1 {
		t.Fatalf("duplicate_request %d", c.DuplicateRequest)
	}
}

// CONFORMANCE P5, T4 after a READ: the ACK of a SEND and the response of the READ behind it are both
// lost, and the requester sends both again. The duplicate SEND is ACKed with its own PSN, not the
// READ's (the expected PSN minus one): rxe's completer would take a plain ACK with the READ's PSN for
// the READ's completion, with none of its data placed. goroce's rping client against rxe's server
// under loss got the previous ping's bytes back that way.
func TestDuplicateSendAckBehindRead(t *testing.T) {
	o := defaultOpts()
	o.timeout = 8
	l := newLink(t, o)
	src := l.a.reg(t, 10, mr.LocalWrite)
	local := l.a.reg(t, 100, mr.LocalWrite)
	dst := l.b.reg(t, 32, mr.LocalWrite)
	remote := l.b.reg(t, 100, mr.RemoteRead)
	fill(remote.Bytes(), 7)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 32)}))
	ackLost, respLost := dropNth("B", wire.RCAcknowledge, 1), dropNth("B", wire.RCReadResponseOnly, 1)
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if out := ackLost(l, h, p); out == nil {
			return nil
		}
		return respLost(l, h, p)
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 9, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 10)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 10, Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 100), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=256 A +10",
		"-> RDMA_READ_REQUEST psn=257 A len=100",
		"<- ACKNOWLEDGE psn=256 [ACK msn=1] (lost)",
		"<- RDMA_READ_RESPONSE_ONLY psn=257 [ACK msn=2] +100 (lost)",
		"-> SEND_ONLY psn=256 A +10",
		"-> RDMA_READ_REQUEST psn=257 A len=100",
		"<- ACKNOWLEDGE psn=256 [ACK msn=2]",
		"<- RDMA_READ_RESPONSE_ONLY psn=257 [ACK msn=2] +100",
	)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 9, Opcode: CompSend, QPN: 0x11, ByteLen: 10},
		Completion{WRID: 10, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 100})
	if !bytes.Equal(local.Bytes(), remote.Bytes()) {
		t.Fatal("READ data differs")
	}
	if c := l.a.qp.Counters(); c.ImpliedNAKs != 0 {
		t.Fatalf("requester saw %d implied NAKs: an ACK reached into the READ", c.ImpliedNAKs)
	}
}

// CONFORMANCE T5, P1, P2, P4: a lost WRITE MIDDLE draws one PSN sequence error NAK at the gap; the
// requester goes back to it and resends MIDDLE, MIDDLE, LAST (no RETH); memory ends up right.
func TestLostWriteMiddle(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	l := newLink(t, o)
	src := l.a.reg(t, 1000, mr.LocalWrite)
	fill(src.Bytes(), 5)
	remote := l.b.reg(t, 1000, mr.LocalWrite|mr.RemoteWrite)
	l.hook = dropNth("A", wire.RCWriteMiddle, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 1000), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_FIRST psn=256 len=1000 +256",
		"-> RDMA_WRITE_MIDDLE psn=257 +256 (lost)",
		"-> RDMA_WRITE_MIDDLE psn=258 +256",
		"-> RDMA_WRITE_LAST psn=259 A +232",
		"<- ACKNOWLEDGE psn=257 [NAK psn-sequence-error msn=0]",
		"-> RDMA_WRITE_MIDDLE psn=257 +256",
		"-> RDMA_WRITE_MIDDLE psn=258 +256",
		"-> RDMA_WRITE_LAST psn=259 A +232",
		"<- ACKNOWLEDGE psn=259 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 1000})
	if !bytes.Equal(src.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
	if c := l.b.qp.Counters(); c.OutOfSeqRequest != 2 || c.NAKsSent[wire.NAKPSNSequenceError] != 1 {
		t.Fatalf("responder counters %+v", c)
	}
	if c := l.a.qp.Counters(); c.RcvdSeqErr != 1 {
		t.Fatalf("requester rcvd_seq_err %d", c.RcvdSeqErr)
	}
}

// CONFORMANCE T6: a lost READ response makes the requester ask again for the rest: a new READ request
// at the lost PSN, with the VA moved on and the length reduced.
func TestLostReadResponse(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	o.timeout = 8
	l := newLink(t, o)
	local := l.a.reg(t, 1024, mr.LocalWrite)
	remote := l.b.reg(t, 1024, mr.RemoteRead)
	fill(remote.Bytes(), 9)
	l.hook = dropNth("B", wire.RCReadResponseMiddle, 2)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 1024), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_READ_REQUEST psn=256 A len=1024",
		"<- RDMA_READ_RESPONSE_FIRST psn=256 [ACK msn=1] +256",
		"<- RDMA_READ_RESPONSE_MIDDLE psn=257 +256",
		"<- RDMA_READ_RESPONSE_MIDDLE psn=258 +256 (lost)",
		"<- RDMA_READ_RESPONSE_LAST psn=259 [ACK msn=1] +256",
		"-> RDMA_READ_REQUEST psn=258 A len=512",
		"<- RDMA_READ_RESPONSE_FIRST psn=258 [ACK msn=1] +256",
		"<- RDMA_READ_RESPONSE_LAST psn=259 [ACK msn=1] +256",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 1024})
	if !bytes.Equal(local.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
	if c := l.b.qp.Counters(); c.DuplicateRequest != 1 {
		t.Fatalf("responder duplicate_request %d", c.DuplicateRequest)
	}
}

// CONFORMANCE P8, X1: a lost atomic acknowledgement makes the requester resend the atomic; the
// responder answers from its resource with the saved original value and does not add twice.
func TestDuplicateAtomicNotExecutedTwice(t *testing.T) {
	o := defaultOpts()
	o.timeout = 8
	l := newLink(t, o)
	local := l.a.reg(t, 8, mr.LocalWrite)
	remote := l.b.reg(t, 8, mr.LocalWrite|mr.RemoteAtomic)
	remote.Bytes()[0] = 40
	l.hook = dropNth("B", wire.RCAtomicAcknowledge, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRFetchAdd, Flags: Signaled, SGL: sge(local, 0, 8), RemoteAddr: remote.IOVA(), RKey: remote.RKey(), CompareAdd: 2}))
	l.run(time.Second)
	l.expectLadder(
		"-> FETCH_ADD psn=256 A",
		"<- ATOMIC_ACKNOWLEDGE psn=256 [ACK msn=1] (lost)",
		"-> FETCH_ADD psn=256 A",
		"<- ATOMIC_ACKNOWLEDGE psn=256 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompFetchAdd, QPN: 0x11, ByteLen: 8})
	if remote.Bytes()[0] != 42 || local.Bytes()[0] != 40 {
		t.Fatalf("remote %d (want 42), original %d (want 40)", remote.Bytes()[0], local.Bytes()[0])
	}
}

// CONFORMANCE A3: three SENDs that arrive together draw one ACK, for the last PSN: the responder
// coalesces ACKs still queued, and the requester completes all three from it, in order.
func TestCoalescedAck(t *testing.T) {
	l := newLink(t, defaultOpts())
	src := l.a.reg(t, 30, mr.LocalWrite)
	dst := l.b.reg(t, 90, mr.LocalWrite)
	for i := 0; i < 3; i++ {
		must(t, l.b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: sge(dst, i*30, 30)}))
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(10 + i), Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 30)}))
	}
	l.run(time.Millisecond) // well before the 67 ms timeout
	l.expectLadder(
		"-> SEND_ONLY psn=256 A +30",
		"-> SEND_ONLY psn=257 A +30",
		"-> SEND_ONLY psn=258 A +30",
		"<- ACKNOWLEDGE psn=258 [ACK msn=3]",
	)
	got := poll(l.a.scq)
	if len(got) != 3 || got[0].WRID != 10 || got[1].WRID != 11 || got[2].WRID != 12 {
		t.Fatalf("completions %+v", got)
	}
}

// CONFORMANCE R5: PSNs wrap from 0xFFFFFF to 0 inside a message, and ACKs and retries work across it.
func TestPSNWrap(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	o.psnA = 0xFFFFFE
	l := newLink(t, o)
	src := l.a.reg(t, 1024, mr.LocalWrite)
	fill(src.Bytes(), 2)
	dst := l.b.reg(t, 1024, mr.LocalWrite)
	l.hook = dropNth("A", wire.RCSendMiddle, 2) // PSN 0
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 1024)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 1024)}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_FIRST psn=16777214 +256",
		"-> SEND_MIDDLE psn=16777215 +256",
		"-> SEND_MIDDLE psn=0 +256 (lost)",
		"-> SEND_LAST psn=1 A +256",
		"<- ACKNOWLEDGE psn=0 [NAK psn-sequence-error msn=0]",
		"-> SEND_MIDDLE psn=0 +256",
		"-> SEND_LAST psn=1 A +256",
		"<- ACKNOWLEDGE psn=1 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11, ByteLen: 1024})
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("data differs")
	}
}

// CONFORMANCE N1, N2: a SEND with no receive posted is RNR NAKed with the responder's min_rnr_timer;
// the requester waits that long and sends it again, by when a receive is there.
func TestRNRThenSuccess(t *testing.T) {
	o := defaultOpts()
	o.minRNR = 14 // 1.28 ms
	l := newLink(t, o)
	src := l.a.reg(t, 16, mr.LocalWrite)
	dst := l.b.reg(t, 16, mr.LocalWrite)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 16)}))
	l.run(500 * time.Microsecond)
	rnrAt := l.now
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 5, SGL: sge(dst, 0, 16)}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=256 A +16",
		"<- ACKNOWLEDGE psn=256 [RNR NAK 1.28ms msn=0]",
		"-> SEND_ONLY psn=256 A +16",
		"<- ACKNOWLEDGE psn=256 [ACK msn=1]",
	)
	if d := l.now.Sub(rnrAt); d < 1200*time.Microsecond {
		t.Fatalf("resent %v after the RNR NAK, before the 1.28 ms timer", d)
	}
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11, ByteLen: 16})
	expectCompletions(t, l.b.rcq, Completion{WRID: 5, Opcode: CompRecv, QPN: 0x22, ByteLen: 16})
	if a, b := l.a.qp.Counters(), l.b.qp.Counters(); a.RcvdRNRErr != 1 || b.SendRNRErr != 1 {
		t.Fatalf("rcvd_rnr_err %d send_rnr_err %d", a.RcvdRNRErr, b.SendRNRErr)
	}
}

// CONFORMANCE N3, C3: rnr_retry 0 fails on the first RNR NAK with RNR_RETRY_EXC_ERR; the QP enters
// ERR and later requests are flushed in order.
func TestRNRRetryExceeded(t *testing.T) {
	o := defaultOpts()
	o.rnr = 0
	l := newLink(t, o)
	src := l.a.reg(t, 16, mr.LocalWrite)
	for i := 1; i <= 3; i++ {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(i), Opcode: WRSend, SGL: sge(src, 0, 16)}))
	}
	l.run(time.Second)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Status: StatusRNRRetryExcErr, Opcode: CompSend, QPN: 0x11},
		Completion{WRID: 2, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11},
		Completion{WRID: 3, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11},
	)
	if l.a.qp.State() != StateErr || l.b.qp.State() != StateRTS {
		t.Fatalf("states %v %v: the requester fails, the responder stays (class B)", l.a.qp.State(), l.b.qp.State())
	}
}

// CONFORMANCE T2: a silent responder: retry_cnt 2 gives three transmissions, then RETRY_EXC_ERR.
func TestRetryExceeded(t *testing.T) {
	o := defaultOpts()
	o.retry = 2
	o.timeout = 8
	l := newLink(t, o)
	src := l.a.reg(t, 16, mr.LocalWrite)
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if h == l.a {
			return nil
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, SGL: sge(src, 0, 16)}))
	start := l.now
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=256 A +16 (lost)",
		"-> SEND_ONLY psn=256 A +16 (lost)",
		"-> SEND_ONLY psn=256 A +16 (lost)",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRetryExcErr, Opcode: CompSend, QPN: 0x11})
	if d := l.now.Sub(start); d != 3*ackTimeout(8) {
		t.Fatalf("gave up after %v, want 3 timeouts of %v", d, ackTimeout(8))
	}
	if c := l.a.qp.Counters(); c.RetryExceededErr != 1 || c.Timeouts != 3 {
		t.Fatalf("counters %+v", c)
	}
}

// CONFORMANCE P3: requester and responder disagree on the PSN. The responder NAKs the gap once; the
// requester, whose NAK PSN is behind it, ignores it, times out, and finally fails.
func TestPersistentPSNMismatch(t *testing.T) {
	o := defaultOpts()
	o.retry = 1
	o.timeout = 8
	l := newLink(t, o)
	must(t, l.b.qp.Modify(l.now, &Attr{State: StateErr}, AttrState)) // rebuild B expecting PSN 0x0FF
	must(t, l.b.qp.Modify(l.now, &Attr{State: StateReset}, AttrState))
	connect(t, l.now, l.b.qp, 0x11, o, o.psnB, o.psnA-1)
	poll(l.b.rcq)
	src := l.a.reg(t, 16, mr.LocalWrite)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, SGL: sge(src, 0, 16)}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRetryExcErr, Opcode: CompSend, QPN: 0x11})
	if l.b.qp.State() != StateRTS {
		t.Fatalf("responder state %v", l.b.qp.State())
	}
	if c := l.b.qp.Counters(); c.NAKsSent[wire.NAKPSNSequenceError] != 1 || c.OutOfSeqRequest != 2 {
		t.Fatalf("responder counters %+v", c)
	}
}

// An ACK that arrives after the timeout has already sent the requester back still counts: it is for
// the first transmission, and it completes the request instead of being dropped as a ghost.
func TestLateAckAfterTimeout(t *testing.T) {
	o := defaultOpts()
	o.timeout = 1 // 8.192 us, shorter than the round trip below
	l := newLink(t, o)
	l.delay = 10 * time.Microsecond
	src := l.a.reg(t, 3000, mr.LocalWrite)
	remote := l.b.reg(t, 3000, mr.LocalWrite|mr.RemoteWrite)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 3000), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 3000})
	c := l.a.qp.Counters()
	if c.Timeouts == 0 || c.DropGhostResponse != 0 {
		t.Fatalf("timeouts %d, ghost responses %d:\n%s", c.Timeouts, c.DropGhostResponse, l.ladderString())
	}
}

// The retransmission timer runs as soon as any packet is outstanding, not only once a message is
// wholly sent: a long WRITE whose whole first window is lost (so nothing comes back at all) is
// retransmitted after the timeout.
func TestTimerArmedMidMessage(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	o.timeout = 8
	l := newLink(t, o)
	src := l.a.reg(t, 256*300, mr.LocalWrite)
	remote := l.b.reg(t, 256*300, mr.LocalWrite|mr.RemoteWrite)
	fill(src.Bytes(), 3)
	lost := 0
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if h == l.a && lost < maxUnackedPSNs {
			lost++
			return nil
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 256*300), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 256 * 300})
	if c := l.a.qp.Counters(); c.Timeouts != 1 {
		t.Fatalf("timeouts %d", c.Timeouts)
	}
	if !bytes.Equal(src.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
}

// With an ACK delay the responder's ACK waits for company: sent with the reply when the responder's
// QP has a request of its own to send, or alone when the delay ends.
func TestAckDelay(t *testing.T) {
	o := defaultOpts()
	o.ackDelay = 20 * time.Microsecond
	l := newLink(t, o)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	must(t, l.a.qp.PostRecv(&RecvWR{ID: 2}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled}))
	l.run(5 * time.Microsecond) // the SEND arrives; B holds its ACK
	if d := l.b.qp.NextDeadline(); d.IsZero() || d.Sub(l.now) > 20*time.Microsecond {
		t.Fatalf("B's next deadline %v (now %v)", d, l.now)
	}
	must(t, l.b.qp.PostSend(l.now, &SendWR{ID: 3, Opcode: WRSend, Flags: Signaled})) // the reply
	l.run(time.Second)
	// The held ACK leaves right behind the reply, its company, so that a datapath can send the two
	// in one GSO write.
	l.expectLadder(
		"-> SEND_ONLY psn=256 A",
		"<- SEND_ONLY psn=512 A",
		"<- ACKNOWLEDGE psn=256 [ACK msn=1]",
		"-> ACKNOWLEDGE psn=512 [ACK msn=1]",
	)
	// The last ACK had no company: it left when the delay ended.
	start := l.now
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 4}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 5, Opcode: WRSend, Flags: Signaled}))
	l.run(time.Second)
	if got := l.now.Sub(start); got < 20*time.Microsecond || got > 25*time.Microsecond {
		t.Fatalf("lone ACK arrived after %v, want the 20 us delay plus the link", got)
	}
	if got := poll(l.a.scq); len(got) != 2 {
		t.Fatalf("completions %+v", got)
	}
	// That ACK waited in vain: B answers nothing, as a SEND stream's receiver does not, and its next
	// ACK leaves at once.
	start = l.now
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 6}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 7, Opcode: WRSend, Flags: Signaled}))
	l.run(time.Second)
	if got := l.now.Sub(start); got >= 20*time.Microsecond {
		t.Fatalf("ACK after an ACK that waited in vain arrived after %v, want it sent at once", got)
	}
	// Once B sends a request again, its ACKs wait for company again.
	must(t, l.a.qp.PostRecv(&RecvWR{ID: 8}))
	must(t, l.b.qp.PostSend(l.now, &SendWR{ID: 9, Opcode: WRSend, Flags: Signaled}))
	l.run(time.Second)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 10}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 11, Opcode: WRSend, Flags: Signaled}))
	l.run(5 * time.Microsecond)
	if d := l.b.qp.NextDeadline(); d.IsZero() || d.Sub(l.now) > 20*time.Microsecond {
		t.Fatalf("after B's own SEND, its next ACK is not held: next deadline %v (now %v)", d, l.now)
	}
	l.run(time.Second)
	if got := poll(l.a.scq); len(got) != 2 {
		t.Fatalf("completions %+v", got)
	}
}

// A second gap, found while the requester resends after the first NAK, is NAKed after an ACK for what
// arrived in order since: rxe's requester ignores a NAK during a retry it started until an ACK shows
// progress (rxe_comp.c comp.started_retry), and would otherwise wait for its timeout.
func TestSecondGapAckedBeforeNAK(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	l := newLink(t, o)
	src := l.a.reg(t, 1536, mr.LocalWrite)
	fill(src.Bytes(), 5)
	remote := l.b.reg(t, 1536, mr.LocalWrite|mr.RemoteWrite)
	l.hook = dropPasses("A", map[wire.PSN]int{257: 1, 259: 2}) // 257 the first time, 259 the second
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 1536),
		RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_FIRST psn=256 len=1536 +256",
		"-> RDMA_WRITE_MIDDLE psn=257 +256 (lost)",
		"-> RDMA_WRITE_MIDDLE psn=258 +256",
		"-> RDMA_WRITE_MIDDLE psn=259 +256",
		"-> RDMA_WRITE_MIDDLE psn=260 +256",
		"-> RDMA_WRITE_LAST psn=261 A +256",
		"<- ACKNOWLEDGE psn=257 [NAK psn-sequence-error msn=0]",
		"-> RDMA_WRITE_MIDDLE psn=257 +256",
		"-> RDMA_WRITE_MIDDLE psn=258 +256",
		"-> RDMA_WRITE_MIDDLE psn=259 +256 (lost)",
		"-> RDMA_WRITE_MIDDLE psn=260 +256",
		"-> RDMA_WRITE_LAST psn=261 A +256",
		"<- ACKNOWLEDGE psn=258 [ACK msn=0]",
		"<- ACKNOWLEDGE psn=259 [NAK psn-sequence-error msn=0]",
		"-> RDMA_WRITE_MIDDLE psn=259 +256",
		"-> RDMA_WRITE_MIDDLE psn=260 +256",
		"-> RDMA_WRITE_LAST psn=261 A +256",
		"<- ACKNOWLEDGE psn=261 [ACK msn=1]",
	)
	if !bytes.Equal(src.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
}

// A second gap found while the requester resends after the first NAK, with only READs in order since,
// is NAKed alone: the ACK that TestSecondGapAckedBeforeNAK shows ahead of such a NAK would carry a
// READ's PSN, which rxe's completer takes for the READ's completion (see
// TestDuplicateSendAckBehindRead). The READs' responses show the progress.
func TestSecondGapAfterReadNotAcked(t *testing.T) {
	o := defaultOpts()
	l := newLink(t, o)
	local := l.a.reg(t, 300, mr.LocalWrite)
	src := l.a.reg(t, 16, mr.LocalWrite)
	readSrc := l.b.reg(t, 300, mr.RemoteRead)
	fill(readSrc.Bytes(), 8)
	dst := l.b.reg(t, 64, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 32)}))
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 2, SGL: sge(dst, 32, 32)}))
	l.hook = dropPasses("A", map[wire.PSN]int{257: 1, 259: 2}) // 257 the first time, 259 the second
	for k := range 3 {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(k + 1), Opcode: WRRead, Flags: Signaled, SGL: sge(local, 100*k, 100),
			RemoteAddr: readSrc.IOVA() + uint64(100*k), RKey: readSrc.RKey()}))
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 4, Opcode: WRSend, SGL: sge(src, 0, 8)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 5, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 8, 8)}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_READ_REQUEST psn=256 A len=100",
		"-> RDMA_READ_REQUEST psn=257 A len=100 (lost)",
		"-> RDMA_READ_REQUEST psn=258 A len=100",
		"-> SEND_ONLY psn=259 A +8",
		"-> SEND_ONLY psn=260 A +8",
		"<- RDMA_READ_RESPONSE_ONLY psn=256 [ACK msn=1] +100",
		"<- ACKNOWLEDGE psn=257 [NAK psn-sequence-error msn=1]",
		"-> RDMA_READ_REQUEST psn=257 A len=100",
		"-> RDMA_READ_REQUEST psn=258 A len=100",
		"-> SEND_ONLY psn=259 A +8 (lost)",
		"-> SEND_ONLY psn=260 A +8",
		"<- RDMA_READ_RESPONSE_ONLY psn=257 [ACK msn=2] +100",
		"<- RDMA_READ_RESPONSE_ONLY psn=258 [ACK msn=3] +100",
		"<- ACKNOWLEDGE psn=259 [NAK psn-sequence-error msn=3]",
		"-> SEND_ONLY psn=259 A +8",
		"-> SEND_ONLY psn=260 A +8",
		"<- ACKNOWLEDGE psn=260 [ACK msn=5]",
	)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 100},
		Completion{WRID: 2, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 100},
		Completion{WRID: 3, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 100},
		Completion{WRID: 5, Opcode: CompSend, QPN: 0x11, ByteLen: 8})
	if !bytes.Equal(local.Bytes(), readSrc.Bytes()) {
		t.Fatal("READ data differs")
	}
}

// Deadline tells a loss timer (the ACK timeout, a tail-loss probe) from the deadlines that are due
// when they say: an ACK held for company, the end of an RNR wait. A datapath may run only the first
// kind late.
func TestDeadlineLossTimer(t *testing.T) {
	o := defaultOpts()
	o.ackDelay = 20 * time.Microsecond
	o.tailProbe = true
	o.minRNR = 14 // 1.28 ms
	l := newLink(t, o)
	check := func(h *host, what string, wantLoss bool, within time.Duration) {
		t.Helper()
		at, loss := h.qp.Deadline()
		if at.IsZero() || at.Before(l.now) || at.Sub(l.now) > within || loss != wantLoss {
			t.Fatalf("%s: %s's deadline %v after now, loss timer %v; want one within %v, loss timer %v",
				what, h.name, at.Sub(l.now), loss, within, wantLoss)
		}
		if !h.qp.NextDeadline().Equal(at) {
			t.Fatalf("%s: NextDeadline %v, Deadline %v", what, h.qp.NextDeadline(), at)
		}
	}
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled}))
	l.pump()
	check(l.a, "a SEND in flight", true, ackTimeout(o.timeout))
	l.run(5 * time.Microsecond) // the SEND arrives; B holds its ACK
	check(l.b, "an ACK held for company", false, o.ackDelay)
	l.run(time.Second)
	if at, loss := l.a.qp.Deadline(); !at.IsZero() || loss {
		t.Fatalf("all acknowledged: A's deadline %v, loss timer %v", at, loss)
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 3, Opcode: WRSend, Flags: Signaled})) // no receive: RNR
	l.run(100 * time.Microsecond)
	check(l.a, "an RNR wait", false, 1280*time.Microsecond)
}
