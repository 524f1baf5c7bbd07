package qp

import (
	"bytes"
	"encoding/binary"
	"errors"
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

// dropAt returns a hook that drops the listed matches (1-based) of op sent by the given side.
func dropAt(from string, op wire.Opcode, nth ...int) func(*link, *host, wire.Packet) [][]byte {
	seen := 0
	return func(l *link, h *host, p wire.Packet) [][]byte {
		if h.name == from && p.Opcode() == op {
			seen++
			for _, n := range nth {
				if n == seen {
					return nil
				}
			}
		}
		return [][]byte{p.Bytes()}
	}
}

// drainPackets is drain returning the packets themselves.
func (l *link) drainPackets(h *host) []wire.Packet {
	l.t.Helper()
	var out []wire.Packet
	for {
		b, _, ok := h.qp.AppendPacket(l.now, nil)
		if !ok {
			return out
		}
		p, err := wire.Parse(b)
		must(l.t, err)
		out = append(out, p)
	}
}

// reconnect resets q and brings it to RTS again with o.
func (l *link) reconnect(h *host, o pairOpts) {
	l.t.Helper()
	must(l.t, h.qp.Modify(l.now, &Attr{State: StateReset}, AttrState))
	if h == l.a {
		connect(l.t, l.now, h.qp, 0x22, o, o.psnA, o.psnB)
	} else {
		connect(l.t, l.now, h.qp, 0x11, o, o.psnB, o.psnA)
	}
}

// CONFORMANCE Q3, Q6: RESET empties both queues without a completion and forgets the connection;
// posting sends in RESET fails; the QP can be brought up again and carries traffic.
func TestResetAndReuse(t *testing.T) {
	o := defaultOpts()
	l := newLink(t, o)
	src := l.a.reg(t, 16, mr.LocalWrite)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 16)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 16)}))
	must(t, l.a.qp.PostRecv(&RecvWR{ID: 3}))
	l.a.qp.AppendPacket(l.now, nil) // the first request is in flight, never to be answered
	must(t, l.a.qp.Modify(l.now, &Attr{State: StateReset}, AttrState))
	if n, m := l.a.scq.Len(), l.a.rcq.Len(); n != 0 || m != 0 {
		t.Fatalf("%d send and %d receive completions after RESET", n, m)
	}
	if err := l.a.qp.PostSend(l.now, &SendWR{Opcode: WRSend}); err != ErrInvalidState {
		t.Fatalf("post send in RESET: %v", err)
	}
	if got := l.a.qp.Query(); got.State != StateReset || got.DestQPN != 0 || got.SQPSN != 0 || got.PathMTU != wire.MTU256 {
		t.Fatalf("query after RESET: %+v", got)
	}
	if !l.a.qp.NextDeadline().IsZero() {
		t.Fatal("a timer survived RESET")
	}
	o.psnA, o.psnB = 0x700, 0x900
	l.reconnect(l.a, o)
	l.reconnect(l.b, o)
	dst := l.b.reg(t, 16, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 9, SGL: sge(dst, 0, 16)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 4, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 16)}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=1792 A +16",
		"<- ACKNOWLEDGE psn=1792 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 4, Opcode: CompSend, QPN: 0x11, ByteLen: 16})
	expectCompletions(t, l.b.rcq, Completion{WRID: 9, Opcode: CompRecv, QPN: 0x22, ByteLen: 16})
}

// CONFORMANCE Q5: a responder in INIT or ERR drops requests without a NAK and the requester ends with
// RETRY_EXC_ERR; one in RTR executes and acknowledges them; a requester not in RTS or SQD drops
// responses.
func TestInboundVsState(t *testing.T) {
	for _, st := range []State{StateInit, StateErr} {
		t.Run(st.String(), func(t *testing.T) {
			o := defaultOpts()
			o.retry, o.timeout = 1, 8
			l := newLink(t, o)
			must(t, l.b.qp.Modify(l.now, &Attr{State: StateReset}, AttrState))
			must(t, l.b.qp.Modify(l.now, &Attr{State: StateInit, AccessFlags: o.access}, AttrState|AttrAccessFlags))
			if st == StateErr {
				must(t, l.b.qp.Modify(l.now, &Attr{State: StateErr}, AttrState))
			}
			must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend}))
			l.run(time.Second)
			l.expectLadder("-> SEND_ONLY psn=256 A", "-> SEND_ONLY psn=256 A")
			expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRetryExcErr, Opcode: CompSend, QPN: 0x11})
			if c := l.b.qp.Counters(); c.DropState != 2 || l.b.qp.State() != st {
				t.Fatalf("responder drop_state %d, state %v", c.DropState, l.b.qp.State())
			}
		})
	}
	t.Run("RTR", func(t *testing.T) {
		o := defaultOpts()
		l := newLink(t, o)
		must(t, l.b.qp.Modify(l.now, &Attr{State: StateReset}, AttrState))
		must(t, l.b.qp.Modify(l.now, &Attr{State: StateInit, AccessFlags: o.access}, AttrState|AttrAccessFlags))
		must(t, l.b.qp.Modify(l.now, &Attr{State: StateRTR, PathMTU: o.mtu, DestQPN: 0x11, RQPSN: o.psnA, MaxDestRdAtomic: 4, MinRNRTimer: 1},
			AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer))
		src := l.a.reg(t, 8, mr.LocalWrite)
		fill(src.Bytes(), 1)
		remote := l.b.reg(t, 8, mr.LocalWrite|mr.RemoteWrite)
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 8), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
		l.run(time.Second)
		l.expectLadder("-> RDMA_WRITE_ONLY psn=256 A len=8 +8", "<- ACKNOWLEDGE psn=256 [ACK msn=1]")
		expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 8})
		if !bytes.Equal(remote.Bytes(), src.Bytes()) {
			t.Fatal("data differs")
		}
	})
	t.Run("responses", func(t *testing.T) {
		l := newLink(t, defaultOpts())
		must(t, l.a.qp.Modify(l.now, &Attr{State: StateErr}, AttrState))
		ack := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCAcknowledge, PSN: 0x100}, AETH: wire.AETHFields{Syndrome: wire.SyndromeACK(wire.CreditInvalid)}}
		l.inject(l.a, ack, nil)
		must(t, l.a.qp.Modify(l.now, &Attr{State: StateReset}, AttrState))
		l.inject(l.a, ack, nil)
		if c := l.a.qp.Counters(); c.DropState != 2 || c.Dropped != 2 {
			t.Fatalf("counters %+v", c)
		}
	})
}

// CONFORMANCE A4: a READ's response is lost and the ACK of the SEND behind it arrives: an implied NAK.
// The READ is not completed but sent again (with the SEND), one retry is counted, and both succeed;
// with retry_cnt 0 the READ fails RETRY_EXC_ERR, its buffer untouched, and the QP enters ERR.
func TestImpliedNAK(t *testing.T) {
	for _, retry := range []uint8{6, 0} {
		o := defaultOpts()
		o.retry = retry
		l := newLink(t, o)
		local := l.a.reg(t, 16, mr.LocalWrite)
		remote := l.b.reg(t, 16, mr.RemoteRead)
		fill(remote.Bytes(), 7)
		must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
		l.hook = dropNth("B", wire.RCReadResponseOnly, 1)
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 16), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled}))
		l.run(time.Second)
		if retry == 0 {
			l.expectLadder(
				"-> RDMA_READ_REQUEST psn=256 A len=16",
				"-> SEND_ONLY psn=257 A",
				"<- RDMA_READ_RESPONSE_ONLY psn=256 [ACK msn=1] +16 (lost)",
				"<- ACKNOWLEDGE psn=257 [ACK msn=2]",
			)
			expectCompletions(t, l.a.scq,
				Completion{WRID: 1, Status: StatusRetryExcErr, Opcode: CompRDMARead, QPN: 0x11},
				Completion{WRID: 2, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11})
			if l.a.qp.State() != StateErr || !bytes.Equal(local.Bytes(), make([]byte, 16)) {
				t.Fatalf("state %v, buffer %x", l.a.qp.State(), local.Bytes())
			}
			continue
		}
		l.expectLadder(
			"-> RDMA_READ_REQUEST psn=256 A len=16",
			"-> SEND_ONLY psn=257 A",
			"<- RDMA_READ_RESPONSE_ONLY psn=256 [ACK msn=1] +16 (lost)",
			"<- ACKNOWLEDGE psn=257 [ACK msn=2]",
			"-> RDMA_READ_REQUEST psn=256 A len=16",
			"-> SEND_ONLY psn=257 A",
			"<- RDMA_READ_RESPONSE_ONLY psn=256 [ACK msn=2] +16",
			"<- ACKNOWLEDGE psn=257 [ACK msn=2]",
		)
		expectCompletions(t, l.a.scq,
			Completion{WRID: 1, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 16},
			Completion{WRID: 2, Opcode: CompSend, QPN: 0x11})
		if c := l.a.qp.Counters(); c.CompleterRetryErr != 1 || c.Timeouts != 0 || !bytes.Equal(local.Bytes(), remote.Bytes()) {
			t.Fatalf("counters %+v", c)
		}
		if got := poll(l.b.rcq); len(got) != 1 {
			t.Fatalf("the SEND was delivered %d times", len(got))
		}
	}
}

// CONFORMANCE A5: duplicated responses arrive after their request completed: a second READ response
// (carrying other bytes) and a second ACK are dropped as stale; nothing is copied again and nothing
// completes twice.
func TestStaleResponses(t *testing.T) {
	l := newLink(t, defaultOpts())
	local := l.a.reg(t, 16, mr.LocalWrite)
	remote := l.b.reg(t, 16, mr.RemoteRead)
	fill(remote.Bytes(), 7)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		switch p.Opcode() {
		case wire.RCReadResponseOnly:
			other := bytes.Clone(p.Bytes())
			other[wire.BTHLen+wire.AETHLen] ^= 0xFF
			return [][]byte{p.Bytes(), other}
		case wire.RCAcknowledge:
			return [][]byte{p.Bytes(), p.Bytes()}
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 16), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 16},
		Completion{WRID: 2, Opcode: CompSend, QPN: 0x11})
	if c := l.a.qp.Counters(); c.DropStaleResponse != 2 || c.Dropped != 2 || l.a.qp.State() != StateRTS {
		t.Fatalf("counters %+v state %v", c, l.a.qp.State())
	}
	if !bytes.Equal(local.Bytes(), remote.Bytes()) {
		t.Fatal("the stale response was copied")
	}
}

// CONFORMANCE A7, C1: an ACK's low five bits are a credit count the requester ignores; NAK codes map to
// statuses, an unknown one to REM_OP_ERR; a reserved syndrome is dropped and the timeout recovers.
func TestAckSyndromes(t *testing.T) {
	for _, tc := range []struct {
		syn     wire.Syndrome
		status  Status
		dropped uint64
	}{
		{0x00, StatusSuccess, 0},
		{0x05, StatusSuccess, 0},
		{0x1E, StatusSuccess, 0},
		{0x61, StatusRemInvReqErr, 0},
		{0x62, StatusRemAccessErr, 0},
		{0x63, StatusRemOpErr, 0},
		{0x64, StatusRemOpErr, 0}, // invalid RD request
		{0x6F, StatusRemOpErr, 0}, // reserved NAK code
		{0x40, StatusSuccess, 1},  // reserved syndrome kind: dropped, the retry is ACKed normally
	} {
		o := defaultOpts()
		o.timeout = 8
		l := newLink(t, o)
		must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
		rewritten := false
		l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
			if p.Opcode() == wire.RCAcknowledge && !rewritten {
				rewritten = true
				b := bytes.Clone(p.Bytes())
				b[wire.BTHLen] = byte(tc.syn)
				return [][]byte{b}
			}
			return [][]byte{p.Bytes()}
		}
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled}))
		l.run(time.Second)
		expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: tc.status, Opcode: CompSend, QPN: 0x11})
		if c := l.a.qp.Counters(); c.DropBadResponse != tc.dropped {
			t.Fatalf("syndrome %#x: drop_bad_response %d", uint8(tc.syn), c.DropBadResponse)
		}
	}
}

// CONFORMANCE P1, P2: a gap draws one NAK; the later out-of-order packet is dropped without another;
// the NAK (which replaced the ACK still queued for the SEND before it) completes that SEND and the requester goes back to the gap; a new gap in the
// retransmission is NAKed again.
func TestNAKPerGap(t *testing.T) {
	l := newLink(t, defaultOpts())
	for i := 0; i < 4; i++ {
		must(t, l.b.qp.PostRecv(&RecvWR{ID: uint64(i)}))
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(i), Opcode: WRSend, Flags: Signaled}))
	}
	l.hook = dropAt("A", wire.RCSendOnly, 2, 6)
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=256 A",
		"-> SEND_ONLY psn=257 A (lost)",
		"-> SEND_ONLY psn=258 A",
		"-> SEND_ONLY psn=259 A",
		"<- ACKNOWLEDGE psn=257 [NAK psn-sequence-error msn=1]", // replaced the queued ACK of 256
		"-> SEND_ONLY psn=257 A",
		"-> SEND_ONLY psn=258 A (lost)",
		"-> SEND_ONLY psn=259 A",
		"<- ACKNOWLEDGE psn=258 [NAK psn-sequence-error msn=2]",
		"-> SEND_ONLY psn=258 A",
		"-> SEND_ONLY psn=259 A",
		"<- ACKNOWLEDGE psn=259 [ACK msn=4]",
	)
	got := poll(l.a.scq)
	if len(got) != 4 {
		t.Fatalf("completions %+v", got)
	}
	for i, wc := range got {
		if wc.WRID != uint64(i) || wc.Status != StatusSuccess {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if c := l.b.qp.Counters(); c.NAKsSent[wire.NAKPSNSequenceError] != 2 || c.OutOfSeqRequest != 3 || l.b.qp.State() != StateRTS {
		t.Fatalf("responder counters %+v", c)
	}
	if got := poll(l.b.rcq); len(got) != 4 {
		t.Fatalf("receives %+v", got)
	}
}

// CONFORMANCE R5: serial PSN comparison over half the space: e+2^23-1 is ahead (a gap, NAKed), e-2^23
// is behind (a duplicate, re-ACKed with e-1).
func TestPSNHalfSpace(t *testing.T) {
	o := defaultOpts()
	o.psnA = 5
	l := newLink(t, o)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	l.inject(l.b, rq(wire.RCSendOnly, wire.PSN(5).Add(1<<23-1)), nil)
	expectLines(t, l.drain(l.b), "ACKNOWLEDGE psn=5 [NAK psn-sequence-error msn=0]")
	l.inject(l.b, rq(wire.RCSendOnly, wire.PSN(5).Sub(1<<23)), nil)
	expectLines(t, l.drain(l.b), "ACKNOWLEDGE psn=4 [ACK msn=0]")
	if c := l.b.qp.Counters(); c.OutOfSeqRequest != 1 || c.DuplicateRequest != 1 || l.b.rcq.Len() != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// CONFORMANCE P6: a duplicate READ for the tail of an executed one (PSN 1 of 4, VA+256, 768 bytes) is
// answered from the responder resource: FIRST, MIDDLE, LAST at PSN 1..3 with the region's bytes; the
// expected PSN does not move.
func TestDuplicateReadReplay(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	o.psnA = 0
	l := newLink(t, o)
	remote := l.b.reg(t, 1024, mr.RemoteRead)
	fill(remote.Bytes(), 11)
	l.inject(l.b, reth(wire.RCReadRequest, 0, remote, 0, 1024), nil)
	expectLines(t, l.drain(l.b),
		"RDMA_READ_RESPONSE_FIRST psn=0 [ACK msn=1] +256",
		"RDMA_READ_RESPONSE_MIDDLE psn=1 +256",
		"RDMA_READ_RESPONSE_MIDDLE psn=2 +256",
		"RDMA_READ_RESPONSE_LAST psn=3 [ACK msn=1] +256")
	l.inject(l.b, reth(wire.RCReadRequest, 1, remote, 256, 768), nil)
	ps := l.drainPackets(l.b)
	var got []string
	var data []byte
	for _, p := range ps {
		got = append(got, describe(p))
		data = append(data, p.Payload()...)
	}
	expectLines(t, got,
		"RDMA_READ_RESPONSE_FIRST psn=1 [ACK msn=1] +256",
		"RDMA_READ_RESPONSE_MIDDLE psn=2 +256",
		"RDMA_READ_RESPONSE_LAST psn=3 [ACK msn=1] +256")
	if !bytes.Equal(data, remote.Bytes()[256:]) {
		t.Fatal("replayed data differs")
	}
	l.inject(l.b, reth(wire.RCWriteOnly, 4, remote, 0, 0), nil) // e is still 4
	expectLines(t, l.drain(l.b), "ACKNOWLEDGE psn=4 [ACK msn=2]")
	if c := l.b.qp.Counters(); c.DuplicateRequest != 1 || c.OutOfSeqRequest != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// CONFORMANCE P7, P8, D4: duplicates that match no responder resource are dropped without a NAK: a
// READ with another rkey, one whose range is not the rest of the original, one whose resource was
// recycled; an atomic whose resource was recycled. A duplicate atomic with its resource is answered
// with the saved value and not executed again.
func TestUnmatchedDuplicates(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	o.psnA = 0
	o.rdAtomic = 1 // one resource: each READ or atomic recycles the last
	l := newLink(t, o)
	remote := l.b.reg(t, 1024, mr.LocalWrite|mr.RemoteRead|mr.RemoteAtomic)
	other := l.b.reg(t, 1024, mr.RemoteRead)
	binary.NativeEndian.PutUint64(remote.Bytes()[512:], 100)
	l.inject(l.b, reth(wire.RCReadRequest, 0, remote, 0, 512), nil)
	if n := len(l.drain(l.b)); n != 2 {
		t.Fatalf("%d READ responses", n)
	}
	dropped := uint64(0)
	expectDrop := func(what string) {
		t.Helper()
		dropped++
		if out := l.drain(l.b); len(out) != 0 {
			t.Fatalf("%s: answered %v", what, out)
		}
		if c := l.b.qp.Counters(); c.DropDuplicate != dropped || l.b.qp.State() != StateRTS {
			t.Fatalf("%s: drop_duplicate %d, state %v", what, c.DropDuplicate, l.b.qp.State())
		}
	}
	l.inject(l.b, reth(wire.RCReadRequest, 1, other, 256, 256), nil)
	expectDrop("another rkey")
	l.inject(l.b, reth(wire.RCReadRequest, 1, remote, 256, 128), nil)
	expectDrop("a shorter range")
	l.inject(l.b, reth(wire.RCReadRequest, 1, remote, 128, 256), nil)
	expectDrop("another offset")

	fa := rq(wire.RCFetchAdd, 2)
	fa.AtomicETH = wire.AtomicETHFields{VA: remote.IOVA() + 512, RKey: remote.RKey(), SwapAdd: 1}
	l.inject(l.b, fa, nil)
	expectLines(t, l.drain(l.b), "ATOMIC_ACKNOWLEDGE psn=2 [ACK msn=2]")
	l.inject(l.b, reth(wire.RCReadRequest, 0, remote, 0, 512), nil)
	expectDrop("a READ whose resource the atomic recycled")
	l.inject(l.b, fa, nil)
	out := l.drainPackets(l.b)
	if len(out) != 1 || out[0].AtomicAckETH().OrigData() != 100 {
		t.Fatalf("duplicate atomic answered %v", out)
	}
	l.inject(l.b, reth(wire.RCReadRequest, 3, remote, 0, 8), nil) // recycles the atomic's resource
	l.drain(l.b)
	l.inject(l.b, fa, nil)
	expectDrop("an atomic whose resource a READ recycled")
	if v := binary.NativeEndian.Uint64(remote.Bytes()[512:]); v != 101 {
		t.Fatalf("atomic target %d, want 101: executed once", v)
	}
}

// CONFORMANCE N4: a WRITE with immediate needs a receive. A single-packet one finds none and is RNR
// NAKed without touching memory, until rnr_retry runs out; in a multi-packet one the data lands and
// only the LAST packet waits for the receive, and is all that is sent again.
func TestWriteImmRNR(t *testing.T) {
	o := defaultOpts()
	o.rnr, o.minRNR = 1, 1
	l := newLink(t, o)
	src := l.a.reg(t, 16, mr.LocalWrite)
	fill(src.Bytes(), 1)
	remote := l.b.reg(t, 16, mr.LocalWrite|mr.RemoteWrite)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWriteImm, Imm: 9, SGL: sge(src, 0, 16), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_ONLY_WITH_IMMEDIATE psn=256 A len=16 +16",
		"<- ACKNOWLEDGE psn=256 [RNR NAK 0.01ms msn=0]",
		"-> RDMA_WRITE_ONLY_WITH_IMMEDIATE psn=256 A len=16 +16",
		"<- ACKNOWLEDGE psn=256 [RNR NAK 0.01ms msn=0]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRNRRetryExcErr, Opcode: CompRDMAWrite, QPN: 0x11})
	if !bytes.Equal(remote.Bytes(), make([]byte, 16)) {
		t.Fatal("an RNR NAKed WRITE wrote memory")
	}

	o = defaultOpts()
	o.mtu, o.minRNR = wire.MTU256, 1
	l = newLink(t, o)
	src = l.a.reg(t, 600, mr.LocalWrite)
	fill(src.Bytes(), 2)
	remote = l.b.reg(t, 600, mr.LocalWrite|mr.RemoteWrite)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWriteImm, Flags: Signaled, Imm: 9, SGL: sge(src, 0, 600), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(5 * time.Microsecond)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 4}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_FIRST psn=256 len=600 +256",
		"-> RDMA_WRITE_MIDDLE psn=257 +256",
		"-> RDMA_WRITE_LAST_WITH_IMMEDIATE psn=258 A +88",
		"<- ACKNOWLEDGE psn=258 [RNR NAK 0.01ms msn=0]",
		"-> RDMA_WRITE_LAST_WITH_IMMEDIATE psn=258 A +88",
		"<- ACKNOWLEDGE psn=258 [ACK msn=1]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 600})
	expectCompletions(t, l.b.rcq, Completion{WRID: 4, Opcode: CompRecvRDMAWithImm, QPN: 0x22, ByteLen: 600, Imm: 9, Flags: WithImm})
	if !bytes.Equal(remote.Bytes(), src.Bytes()) {
		t.Fatal("data differs")
	}
}

// CONFORMANCE N5, N3: progress restores retry_cnt and rnr_retry, so two separate RNR episodes and two
// separate losses each get the full count; a local ACK timeout shorter than the RNR timer starts no
// retry during the RNR wait; rnr_retry 7 never runs out.
func TestRetryCountersReset(t *testing.T) {
	o := defaultOpts()
	o.rnr, o.retry, o.minRNR, o.timeout = 1, 1, 1, 8
	l := newLink(t, o)
	l.hook = dropAt("A", wire.RCSendOnly, 2, 5)
	for id := uint64(1); id <= 2; id++ { // each SEND is RNR NAKed once, then its resend is lost
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: id, Opcode: WRSend, Flags: Signaled}))
		l.run(5 * time.Microsecond)
		must(t, l.b.qp.PostRecv(&RecvWR{ID: id}))
		l.run(time.Second)
	}
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11}, Completion{WRID: 2, Opcode: CompSend, QPN: 0x11})
	if c := l.a.qp.Counters(); c.RcvdRNRErr != 2 || c.Timeouts != 2 {
		t.Fatalf("counters %+v\n%s", c, l.ladderString())
	}

	o = defaultOpts()
	o.timeout, o.minRNR = 1, 14 // 8.192 us against 1.28 ms
	l = newLink(t, o)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled}))
	l.run(5 * time.Microsecond)
	rnrAt := l.now
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=256 A",
		"<- ACKNOWLEDGE psn=256 [RNR NAK 1.28ms msn=0]",
		"-> SEND_ONLY psn=256 A",
		"<- ACKNOWLEDGE psn=256 [ACK msn=1]",
	)
	if c := l.a.qp.Counters(); c.Timeouts != 0 || l.now.Sub(rnrAt) < 1270*time.Microsecond {
		t.Fatalf("timeouts %d, resent after %v", c.Timeouts, l.now.Sub(rnrAt))
	}

	o = defaultOpts()
	o.rnr, o.minRNR = 7, 1
	l = newLink(t, o)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled}))
	l.run(2 * time.Millisecond)
	if c := l.a.qp.Counters(); c.RcvdRNRErr < 50 || l.a.qp.State() != StateRTS {
		t.Fatalf("%d RNR NAKs, state %v", c.RcvdRNRErr, l.a.qp.State())
	}
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11})
}

// CONFORMANCE T3: goroce follows IBTA, not rxe: retry_cnt 7 is seven retries (eight transmissions),
// then RETRY_EXC_ERR. Timeout 0 disables the timer: one transmission, no deadline, no error.
func TestRetryCnt7AndTimeout0(t *testing.T) {
	o := defaultOpts()
	o.retry, o.timeout = 7, 8
	l := newLink(t, o)
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte { return nil }
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend}))
	l.run(time.Second)
	if len(l.ladder) != 8 {
		t.Fatalf("%d transmissions:\n%s", len(l.ladder), l.ladderString())
	}
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRetryExcErr, Opcode: CompSend, QPN: 0x11})

	o.timeout = 0
	l = newLink(t, o)
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte { return nil }
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend}))
	l.run(10 * time.Second)
	if len(l.ladder) != 1 || !l.a.qp.NextDeadline().IsZero() || l.a.scq.Len() != 0 || l.a.qp.State() != StateRTS {
		t.Fatalf("ladder:\n%s\ndeadline %v", l.ladderString(), l.a.qp.NextDeadline())
	}
}

// CONFORMANCE D4: a requester with more READs outstanding than the responder's max_dest_rd_atomic. Like
// rxe, goroce's responder does not NAK them: it executes them, recycling its resources, as long as its
// response queue (max_dest_rd_atomic+4 jobs) has room, and drops the rest unexecuted; the requester's
// timeout sends those again, and every READ completes.
func TestReadsBeyondResponderResources(t *testing.T) {
	o := defaultOpts()
	o.timeout = 8
	l := newLink(t, o)
	o.rdAtomic = 1
	l.reconnect(l.b, o)
	local := l.a.reg(t, 64, mr.LocalWrite)
	remote := l.b.reg(t, 64, mr.RemoteRead)
	fill(remote.Bytes(), 5)
	for i := 0; i < 8; i++ {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(i), Opcode: WRRead, Flags: Signaled, SGL: sge(local, 8*i, 8), RemoteAddr: remote.IOVA() + uint64(8*i), RKey: remote.RKey()}))
	}
	l.run(time.Second)
	got := poll(l.a.scq)
	if len(got) != 8 {
		t.Fatalf("completions %+v", got)
	}
	for i, wc := range got {
		if wc.WRID != uint64(i) || wc.Status != StatusSuccess {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if !bytes.Equal(local.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
	if b, a := l.b.qp.Counters(), l.a.qp.Counters(); b.DropResponseQueueFull != 1 || b.FatalNAKs != 0 || a.Timeouts != 1 {
		t.Fatalf("responder %+v\nrequester %+v\n%s", b, a, l.ladderString())
	}
}

// CONFORMANCE D6: a READ response shorter than the READ asked for fails the READ with LOC_LEN_ERR.
func TestShortReadResponse(t *testing.T) {
	l := newLink(t, defaultOpts())
	local := l.a.reg(t, 100, mr.LocalWrite)
	remote := l.b.reg(t, 100, mr.RemoteRead)
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if p.Opcode() == wire.RCReadResponseOnly {
			f := p.Fields()
			b, err := wire.Append(nil, &f, p.Payload()[:50])
			must(l.t, err)
			return [][]byte{b}
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, SGL: sge(local, 0, 100), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Status: StatusLocLenErr, Opcode: CompRDMARead, QPN: 0x11},
		Completion{WRID: 2, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11})
	if l.a.qp.State() != StateErr {
		t.Fatalf("state %v", l.a.qp.State())
	}
}

// CONFORMANCE X1, X2: a compare-and-swap that does not match leaves memory alone and still succeeds,
// returning the value it found; fetch-and-add wraps modulo 2^64.
func TestAtomicValues(t *testing.T) {
	l := newLink(t, defaultOpts())
	local := l.a.reg(t, 16, mr.LocalWrite)
	remote := l.b.reg(t, 16, mr.LocalWrite|mr.RemoteAtomic)
	binary.NativeEndian.PutUint64(remote.Bytes(), 2)
	binary.NativeEndian.PutUint64(remote.Bytes()[8:], 1<<64-1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRCompareSwap, Flags: Signaled, SGL: sge(local, 0, 8), RemoteAddr: remote.IOVA(), RKey: remote.RKey(), CompareAdd: 5, Swap: 3}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRFetchAdd, Flags: Signaled, SGL: sge(local, 8, 8), RemoteAddr: remote.IOVA() + 8, RKey: remote.RKey(), CompareAdd: 2}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompCompareSwap, QPN: 0x11, ByteLen: 8},
		Completion{WRID: 2, Opcode: CompFetchAdd, QPN: 0x11, ByteLen: 8})
	r, lo := remote.Bytes(), local.Bytes()
	if binary.NativeEndian.Uint64(r) != 2 || binary.NativeEndian.Uint64(lo) != 2 {
		t.Fatalf("compare-swap: memory %d, returned %d", binary.NativeEndian.Uint64(r), binary.NativeEndian.Uint64(lo))
	}
	if binary.NativeEndian.Uint64(r[8:]) != 1 || binary.NativeEndian.Uint64(lo[8:]) != 1<<64-1 {
		t.Fatalf("fetch-add: memory %d, returned %#x", binary.NativeEndian.Uint64(r[8:]), binary.NativeEndian.Uint64(lo[8:]))
	}
}

// CONFORMANCE X5, L5: FLUSH and ATOMIC_WRITE are parsed but not supported: NAK invalid request, the
// responder enters ERR, memory untouched. Reserved opcodes never reach an engine: wire.Parse refuses them.
func TestUnsupportedOpcodes(t *testing.T) {
	for _, op := range []wire.Opcode{wire.RCFlush, wire.RCAtomicWrite} {
		o := defaultOpts()
		o.psnA = 0
		l := newLink(t, o)
		remote := l.b.reg(t, 64, mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic)
		f := reth(op, 0, remote, 0, 8)
		var payload []byte
		if op == wire.RCAtomicWrite {
			payload = []byte{1, 2, 3, 4, 5, 6, 7, 8}
		} else {
			f.FETH = wire.FlushGlobal
		}
		l.inject(l.b, f, payload)
		expectLines(t, l.drain(l.b), "ACKNOWLEDGE psn=0 [NAK invalid-request msn=0]")
		if l.b.qp.State() != StateErr || !bytes.Equal(remote.Bytes(), make([]byte, 64)) {
			t.Fatalf("%v: state %v", op, l.b.qp.State())
		}
	}
	// Reserved RC opcodes: Parse refuses them, ParseReserved gives the responder the PSN to NAK.
	// CONFORMANCE L5.
	for _, op := range []byte{0x15, 0x18, 0x19, 0x1A, 0x1B, 0x1E, 0x1F} {
		o := defaultOpts()
		o.psnA = 0
		l := newLink(t, o)
		b, err := wire.Append(nil, &wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey,
			DestQP: l.b.qp.QPN()}}, []byte{1, 2, 3, 4})
		must(t, err)
		b[0] = op
		if _, err := wire.Parse(b); !errors.Is(err, wire.ErrBadOpcode) {
			t.Errorf("opcode %#x: Parse says %v", op, err)
		}
		p, err := wire.ParseReserved(b)
		must(t, err)
		l.b.qp.HandlePacket(l.now, p, nil)
		expectLines(t, l.drain(l.b), "ACKNOWLEDGE psn=0 [NAK invalid-request msn=0]")
		if l.b.qp.State() != StateErr {
			t.Fatalf("%#x: state %v", op, l.b.qp.State())
		}
	}
	for _, op := range []byte{0x04, 0x35, 0x66, 0x80} { // defined, or reserved outside RC
		b := make([]byte, wire.BTHLen+wire.ICRCLen)
		b[0] = op
		if _, err := wire.ParseReserved(b); !errors.Is(err, wire.ErrBadOpcode) {
			t.Errorf("ParseReserved(%#x): %v", op, err)
		}
	}
}

// CONFORMANCE M6: a WRITE naming a key invalidated locally, or a deregistered region, is NAKed remote
// access error.
func TestInvalidatedKeys(t *testing.T) {
	for _, how := range []string{"local invalidate", "deregister"} {
		l := newLink(t, defaultOpts())
		src := l.a.reg(t, 16, mr.LocalWrite)
		target, err := l.b.mem.Register(l.b.pd, make([]byte, 64), mr.LocalWrite|mr.RemoteWrite, mr.Invalidatable())
		must(t, err)
		if how == "deregister" {
			must(t, l.b.mem.Deregister(target))
		} else {
			must(t, l.b.mem.LocalInvalidate(l.b.pd, target.LKey()))
		}
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, SGL: sge(src, 0, 16), RemoteAddr: target.IOVA(), RKey: target.RKey()}))
		l.run(time.Second)
		expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRemAccessErr, Opcode: CompRDMAWrite, QPN: 0x11})
		if l.b.qp.State() != StateErr {
			t.Fatalf("%s: responder %v", how, l.b.qp.State())
		}
	}
}

// CONFORMANCE M8: a SEND_WITH_INV naming a key that cannot be invalidated (unknown, or a region not
// registered Invalidatable, rxe's non-fast-reg MR): the receive completes REM_INV_REQ_ERR and the
// responder enters ERR, but the SEND itself is ACKed (IBTA class J sends no NAK); the requester
// learns of it only when its next request goes unanswered.
func TestSendWithInvalidateFailure(t *testing.T) {
	for _, key := range []string{"unknown", "not invalidatable"} {
		o := defaultOpts()
		o.retry, o.timeout = 0, 8
		l := newLink(t, o)
		plain := l.b.reg(t, 64, mr.LocalWrite|mr.RemoteWrite)
		k := plain.RKey()
		if key == "unknown" {
			k ^= 0x100
		}
		must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
		must(t, l.b.qp.PostRecv(&RecvWR{ID: 2}))
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSendInv, Flags: Signaled, InvalidateRKey: k}))
		l.run(time.Second)
		l.expectLadder("-> SEND_ONLY_WITH_INVALIDATE psn=256 A", "<- ACKNOWLEDGE psn=256 [ACK msn=1]")
		expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11})
		got := poll(l.b.rcq)
		if len(got) != 2 || got[0].WRID != 1 || got[0].Status != StatusRemInvReqErr || got[1].Status != StatusWRFlushErr {
			t.Fatalf("%s: receive completions %+v", key, got)
		}
		if l.b.qp.State() != StateErr || l.b.qp.Counters().InvalidateErr != 1 {
			t.Fatalf("%s: responder %v", key, l.b.qp.State())
		}
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend}))
		l.run(time.Second)
		expectCompletions(t, l.a.scq, Completion{WRID: 2, Status: StatusRetryExcErr, Opcode: CompSend, QPN: 0x11})
	}
}

// CONFORMANCE L2, L3: WRITE lengths that disagree with the RETH, and MIDDLE or LAST packets with no
// message open, are NAKed invalid request; the responder enters ERR.
func TestBadWriteSequences(t *testing.T) {
	for _, tc := range []struct {
		name string
		pkts func(r *mr.Region) []wire.Fields
		pay  []int // payload per packet
		nak  wire.PSN
	}{
		{"L2 ONLY shorter than RETH", func(r *mr.Region) []wire.Fields { return []wire.Fields{reth(wire.RCWriteOnly, 0, r, 0, 16)} }, []int{12}, 0},
		{"L2 ONLY longer than RETH", func(r *mr.Region) []wire.Fields { return []wire.Fields{reth(wire.RCWriteOnly, 0, r, 0, 8)} }, []int{12}, 0},
		{"L2 FIRST as long as RETH", func(r *mr.Region) []wire.Fields { return []wire.Fields{reth(wire.RCWriteFirst, 0, r, 0, 256)} }, []int{256}, 0},
		{"L2 RETH above 2^31", func(r *mr.Region) []wire.Fields { return []wire.Fields{reth(wire.RCWriteFirst, 0, r, 0, 1<<31+1)} }, []int{256}, 0},
		{"L2 LAST beyond RETH", func(r *mr.Region) []wire.Fields {
			return []wire.Fields{reth(wire.RCWriteFirst, 0, r, 0, 300), rq(wire.RCWriteLast, 1)}
		}, []int{256, 48}, 1},
		{"L2 LAST short of RETH", func(r *mr.Region) []wire.Fields {
			return []wire.Fields{reth(wire.RCWriteFirst, 0, r, 0, 300), rq(wire.RCWriteLast, 1)}
		}, []int{256, 40}, 1},
		{"L3 WRITE MIDDLE with no FIRST", func(r *mr.Region) []wire.Fields { return []wire.Fields{rq(wire.RCWriteMiddle, 0)} }, []int{256}, 0},
		{"L3 SEND LAST with no FIRST", func(r *mr.Region) []wire.Fields { return []wire.Fields{rq(wire.RCSendLast, 0)} }, []int{16}, 0},
		{"L3 WRITE LAST inside a SEND", func(r *mr.Region) []wire.Fields {
			return []wire.Fields{rq(wire.RCSendFirst, 0), rq(wire.RCWriteLast, 1)}
		}, []int{256, 16}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := defaultOpts()
			o.psnA, o.mtu = 0, wire.MTU256
			l := newLink(t, o)
			must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(l.b.reg(t, 1024, mr.LocalWrite), 0, 1024)}))
			remote := l.b.reg(t, 1024, mr.LocalWrite|mr.RemoteWrite)
			for i, f := range tc.pkts(remote) {
				f.BTH.AckReq = false
				l.inject(l.b, f, make([]byte, tc.pay[i]))
			}
			expectLines(t, l.drain(l.b), "ACKNOWLEDGE psn="+itoa(int(tc.nak))+" [NAK invalid-request msn=0]")
			if l.b.qp.State() != StateErr || l.b.qp.Counters().FatalNAKs != 1 {
				t.Fatalf("state %v", l.b.qp.State())
			}
		})
	}
}

// CONFORMANCE L4: the LAST packet of a 4-packet WRITE is replaced by a READ request at its PSN: NAK
// invalid request at that PSN, the WRITE fails REM_INV_REQ_ERR, both QPs enter ERR; the first three
// packets' data has landed.
func TestMissingLast(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	l := newLink(t, o)
	src := l.a.reg(t, 1024, mr.LocalWrite)
	fill(src.Bytes(), 3)
	remote := l.b.reg(t, 1024, mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead)
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if p.Opcode() == wire.RCWriteLast {
			f := rq(wire.RCReadRequest, p.BTH().PSN())
			f.BTH.PKey, f.BTH.DestQP = wire.DefaultPKey, 0x22
			f.RETH = wire.RETHFields{VA: remote.IOVA(), RKey: remote.RKey(), DMALen: 8}
			b, err := wire.Append(nil, &f, nil)
			must(l.t, err)
			return [][]byte{b}
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, SGL: sge(src, 0, 1024), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	if last := l.ladder[len(l.ladder)-1]; last != "<- ACKNOWLEDGE psn=259 [NAK invalid-request msn=0]" {
		t.Fatalf("ladder:\n%s", l.ladderString())
	}
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRemInvReqErr, Opcode: CompRDMAWrite, QPN: 0x11})
	if l.a.qp.State() != StateErr || l.b.qp.State() != StateErr {
		t.Fatalf("states %v %v", l.a.qp.State(), l.b.qp.State())
	}
	if !bytes.Equal(remote.Bytes()[:768], src.Bytes()[:768]) || !bytes.Equal(remote.Bytes()[768:], make([]byte, 256)) {
		t.Fatal("memory is not the first three packets' data")
	}
}

// CONFORMANCE L6, L7: packets of another transport class, and packets with another P_Key, are dropped
// and counted without an answer or a change of state; a UD QP drops RC packets the same way.
func TestWrongClassAndPKey(t *testing.T) {
	o := defaultOpts()
	o.psnA = 0
	l := newLink(t, o)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	l.inject(l.b, rq(wire.UCSendOnly, 0), nil)
	ud := rq(wire.UDSendOnly, 0)
	ud.DETH = wire.DETHFields{QKey: 0x1111, SrcQP: 0x11}
	l.inject(l.b, ud, nil)
	bad := rq(wire.RCSendOnly, 0)
	bad.BTH.PKey = 0x7FFF
	l.inject(l.b, bad, nil)
	if out := l.drain(l.b); len(out) != 0 {
		t.Fatalf("answered %v", out)
	}
	if c := l.b.qp.Counters(); c.DropWrongTransport != 2 || c.DropPKey != 1 || c.Dropped != 3 || l.b.qp.State() != StateRTS || l.b.rcq.Len() != 0 {
		t.Fatalf("counters %+v", c)
	}
	l.inject(l.b, rq(wire.RCSendOnly, 0), nil) // PSN 0 is still expected
	expectLines(t, l.drain(l.b), "ACKNOWLEDGE psn=0 [ACK msn=1]")

	o.typ = UD
	l = newLink(t, o)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(l.b.reg(t, 100, mr.LocalWrite), 0, 100)}))
	l.inject(l.b, rq(wire.RCSendOnly, 0), nil)
	if c := l.b.qp.Counters(); c.DropWrongTransport != 1 || l.b.rcq.Len() != 0 {
		t.Fatalf("UD counters %+v", c)
	}
}

// CONFORMANCE U2: a work request Q_Key with the top bit set sends the QP's own Q_Key instead; GSI
// (QP1) datagrams always carry 0x80010000.
func TestUDQKeyRules(t *testing.T) {
	o := defaultOpts()
	o.typ = UD
	l := newLink(t, o)
	src := l.a.reg(t, 8, mr.LocalWrite)
	dst := l.b.reg(t, 100, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 100)}))
	var qkeys []wire.QKey
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		qkeys = append(qkeys, p.DETH().QKey())
		return [][]byte{p.Bytes()}
	}
	ah := &AddressHandle{}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, SGL: sge(src, 0, 8), AH: ah, RemoteQPN: 0x22, RemoteQKey: 0x80002222}))
	l.run(time.Second)
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Opcode: CompRecv, QPN: 0x22, ByteLen: 48, SrcQP: 0x11, Flags: WithGRH})

	gsi := newHost(t, "GSI", UD, wire.QPNGSI, false)
	connect(t, l.now, gsi.qp, 0, o, 0, 0)
	must(t, gsi.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, AH: ah, RemoteQPN: wire.QPNGSI, RemoteQKey: 0x1111}))
	b, _, ok := gsi.qp.AppendPacket(l.now, nil)
	p, err := wire.Parse(b)
	if !ok || err != nil {
		t.Fatalf("GSI sent nothing: %v", err)
	}
	qkeys = append(qkeys, p.DETH().QKey())
	if len(qkeys) != 2 || qkeys[0] != 0x1111 || qkeys[1] != wire.GSIQKey {
		t.Fatalf("Q_Keys on the wire %#x", qkeys)
	}
}

// CONFORMANCE U4: UD and UC messages with no receive posted, or (UD) one too small, are dropped with no
// RNR NAK and no receive completion; the sender completes successfully; a receive too small stays for
// the next datagram.
func TestUnreliableWithoutReceive(t *testing.T) {
	o := defaultOpts()
	o.typ = UD
	l := newLink(t, o)
	src := l.a.reg(t, 100, mr.LocalWrite)
	ah := &AddressHandle{}
	send := func(id uint64, n int) {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: id, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, n), AH: ah, RemoteQPN: 0x22, RemoteQKey: 0x1111}))
		l.run(time.Second)
	}
	send(1, 100)
	dst := l.b.reg(t, 100, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 7, SGL: sge(dst, 0, 100)}))
	send(2, 100) // 40 + 100 bytes do not fit
	send(3, 60)
	l.expectLadder("-> UD SEND_ONLY psn=256 +100", "-> UD SEND_ONLY psn=257 +100", "-> UD SEND_ONLY psn=258 +60")
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompSend, QPN: 0x11, ByteLen: 100},
		Completion{WRID: 2, Opcode: CompSend, QPN: 0x11, ByteLen: 100},
		Completion{WRID: 3, Opcode: CompSend, QPN: 0x11, ByteLen: 60})
	expectCompletions(t, l.b.rcq, Completion{WRID: 7, Opcode: CompRecv, QPN: 0x22, ByteLen: 100, SrcQP: 0x11, Flags: WithGRH})
	if c := l.b.qp.Counters(); c.DropNoRecv != 1 || c.DropRecvTooSmall != 1 {
		t.Fatalf("counters %+v", c)
	}

	o.typ = UC
	l = newLink(t, o)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, Flags: Signaled}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRWriteImm, Flags: Signaled}))
	l.run(time.Second)
	l.expectLadder("-> UC SEND_ONLY psn=256", "-> UC RDMA_WRITE_ONLY_WITH_IMMEDIATE psn=257 len=0")
	if got := poll(l.a.scq); len(got) != 2 || got[0].Status != StatusSuccess || got[1].Status != StatusSuccess {
		t.Fatalf("send completions %+v", got)
	}
	if c := l.b.qp.Counters(); c.DropNoRecv != 2 || c.SendRNRErr != 0 || l.b.rcq.Len() != 0 {
		t.Fatalf("UC counters %+v", c)
	}
}

// CONFORMANCE U8: on UC, MIDDLE and LAST packets with no message open are dropped; a FIRST while a
// message is open replaces it, and the receive goes to the new message.
func TestUCSequence(t *testing.T) {
	o := defaultOpts()
	o.typ, o.mtu, o.psnA = UC, wire.MTU256, 0
	l := newLink(t, o)
	dst := l.b.reg(t, 1024, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 1024)}))
	a := bytes.Repeat([]byte{0xAA}, 256)
	b := bytes.Repeat([]byte{0xBB}, 256)
	uc := func(op wire.Opcode, psn wire.PSN) wire.Fields {
		return wire.Fields{BTH: wire.BTHFields{Opcode: op, PSN: psn}}
	}
	l.inject(l.b, uc(wire.UCSendMiddle, 0), a)
	l.inject(l.b, uc(wire.UCSendLast, 1), a[:10])
	l.inject(l.b, uc(wire.UCSendFirst, 2), a)
	l.inject(l.b, uc(wire.UCSendFirst, 3), b) // replaces the open message
	l.inject(l.b, uc(wire.UCSendLast, 4), b[:20])
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Opcode: CompRecv, QPN: 0x22, ByteLen: 276})
	if !bytes.Equal(dst.Bytes()[:276], bytes.Repeat([]byte{0xBB}, 276)) {
		t.Fatal("the receive does not hold the second message")
	}
	if c := l.b.qp.Counters(); c.DropUCMessage != 2 || l.b.qp.State() != StateRTS {
		t.Fatalf("counters %+v", c)
	}
	if out := l.drain(l.b); len(out) != 0 {
		t.Fatalf("UC responder answered %v", out)
	}
}

// CONFORMANCE U9: UC WRITEs with a bad rkey, or to a QP without remote write, are dropped silently; the
// QP stays in RTS and the receive a dropped WRITE with immediate had taken serves the next message.
func TestUCAccessErrors(t *testing.T) {
	o := defaultOpts()
	o.typ, o.psnA = UC, 0
	l := newLink(t, o)
	remote := l.b.reg(t, 64, mr.LocalWrite|mr.RemoteWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	uc := func(op wire.Opcode, psn wire.PSN, key wire.RKey) wire.Fields {
		return wire.Fields{BTH: wire.BTHFields{Opcode: op, PSN: psn}, RETH: wire.RETHFields{VA: remote.IOVA(), RKey: key, DMALen: 8}, Imm: 5}
	}
	data := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	l.inject(l.b, uc(wire.UCWriteOnly, 0, remote.RKey()^0x100), data)
	l.inject(l.b, uc(wire.UCWriteOnlyImm, 1, remote.RKey()^0x100), data)
	if c := l.b.qp.Counters(); c.DropUCMessage != 2 || l.b.rcq.Len() != 0 || l.b.qp.State() != StateRTS {
		t.Fatalf("counters %+v", c)
	}
	l.inject(l.b, uc(wire.UCWriteOnlyImm, 2, remote.RKey()), data)
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Opcode: CompRecvRDMAWithImm, QPN: 0x22, ByteLen: 8, Imm: 5, Flags: WithImm})
	if !bytes.Equal(remote.Bytes()[:8], data) {
		t.Fatal("the good WRITE did not land")
	}

	o.access = mr.RemoteRead
	l = newLink(t, o)
	remote = l.b.reg(t, 64, mr.LocalWrite|mr.RemoteWrite)
	l.inject(l.b, uc(wire.UCWriteOnly, 0, remote.RKey()), data)
	if c := l.b.qp.Counters(); c.DropUCMessage != 1 || l.b.qp.State() != StateRTS || !bytes.Equal(remote.Bytes(), make([]byte, 64)) {
		t.Fatalf("counters %+v", c)
	}
}

// CONFORMANCE C5, C2, R1, R2: completion opcodes, lengths and flags of every operation; sq_sig_all makes
// unsignaled requests complete; a zero-length SEND is one SEND_ONLY without payload and a receive of 0
// bytes; the SE bit is set only on the request that asked for it.
func TestCompletionFields(t *testing.T) {
	l := newLink(t, defaultOpts())
	l.a.qp.cfg.SigAll = true
	src := l.a.reg(t, 64, mr.LocalWrite)
	local := l.a.reg(t, 64, mr.LocalWrite)
	remote := l.b.reg(t, 64, mr.LocalWrite|mr.RemoteWrite|mr.RemoteRead|mr.RemoteAtomic)
	inv, err := l.b.mem.Register(l.b.pd, make([]byte, 8), mr.LocalWrite|mr.RemoteWrite, mr.Invalidatable())
	must(t, err)
	recv := l.b.reg(t, 256, mr.LocalWrite)
	for i := 0; i < 5; i++ {
		must(t, l.b.qp.PostRecv(&RecvWR{ID: uint64(10 + i), SGL: sge(recv, 50*i, 50)}))
	}
	var se []string
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if p.BTH().SolicitedEvent() {
			se = append(se, describe(p))
		}
		return [][]byte{p.Bytes()}
	}
	rk := remote.RKey()
	for _, wr := range []SendWR{
		{ID: 1, Opcode: WRSend},
		{ID: 2, Opcode: WRSendImm, Imm: 0x1234, SGL: sge(src, 0, 16)},
		{ID: 3, Opcode: WRSendInv, InvalidateRKey: inv.RKey(), SGL: sge(src, 0, 17)},
		{ID: 4, Opcode: WRWrite, SGL: sge(src, 0, 18), RemoteAddr: remote.IOVA(), RKey: rk},
		{ID: 5, Opcode: WRWriteImm, Imm: 7, SGL: sge(src, 0, 19), RemoteAddr: remote.IOVA(), RKey: rk},
		{ID: 6, Opcode: WRRead, SGL: sge(local, 0, 20), RemoteAddr: remote.IOVA(), RKey: rk},
		{ID: 7, Opcode: WRCompareSwap, SGL: sge(local, 24, 8), RemoteAddr: remote.IOVA() + 32, RKey: rk},
		{ID: 8, Opcode: WRFetchAdd, SGL: sge(local, 32, 8), RemoteAddr: remote.IOVA() + 32, RKey: rk, CompareAdd: 1},
		{ID: 9, Opcode: WRSend, Flags: Solicited, SGL: sge(src, 0, 3)},
	} {
		must(t, l.a.qp.PostSend(l.now, &wr))
	}
	l.run(time.Second)
	if l.ladder[0] != "-> SEND_ONLY psn=256 A" {
		t.Fatalf("zero-length SEND sent as %q", l.ladder[0])
	}
	expectLines(t, se, "SEND_ONLY psn=264 A +3") // SE only where asked for
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompSend, QPN: 0x11},
		Completion{WRID: 2, Opcode: CompSend, QPN: 0x11, ByteLen: 16},
		Completion{WRID: 3, Opcode: CompSend, QPN: 0x11, ByteLen: 17},
		Completion{WRID: 4, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 18},
		Completion{WRID: 5, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 19},
		Completion{WRID: 6, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 20},
		Completion{WRID: 7, Opcode: CompCompareSwap, QPN: 0x11, ByteLen: 8},
		Completion{WRID: 8, Opcode: CompFetchAdd, QPN: 0x11, ByteLen: 8},
		Completion{WRID: 9, Opcode: CompSend, QPN: 0x11, ByteLen: 3})
	expectCompletions(t, l.b.rcq,
		Completion{WRID: 10, Opcode: CompRecv, QPN: 0x22},
		Completion{WRID: 11, Opcode: CompRecv, QPN: 0x22, ByteLen: 16, Imm: 0x1234, Flags: WithImm},
		Completion{WRID: 12, Opcode: CompRecv, QPN: 0x22, ByteLen: 17, InvalidatedRKey: inv.RKey(), Flags: WithInv},
		Completion{WRID: 13, Opcode: CompRecvRDMAWithImm, QPN: 0x22, ByteLen: 19, Imm: 7, Flags: WithImm},
		Completion{WRID: 14, Opcode: CompRecv, QPN: 0x22, ByteLen: 3})
}

// cnpPacer is a pacer that lets every packet go and counts the CNPs it is told about.
type cnpPacer struct{ cnps, sent int }

func (p *cnpPacer) NextSend(now time.Time, n int) time.Time { return now }
func (p *cnpPacer) OnSent(now time.Time, n int)             { p.sent++ }
func (p *cnpPacer) OnCNP(now time.Time)                     { p.cnps++ }

// plainPacer paces nothing and does not take CNPs.
type plainPacer struct{}

func (plainPacer) NextSend(now time.Time, n int) time.Time { return now }
func (plainPacer) OnSent(now time.Time, n int)             {}

// CONFORMANCE K4, K5, K6: a CNP to a QP is counted and handed to a pacer that takes CNPs, and has no
// transport effect: no packet, no completion, no change to PSNs, timers or retry counters, whatever
// the QP's state. A packet marked CE is counted and otherwise processed as usual.
func TestCNP(t *testing.T) {
	o := defaultOpts()
	o.timeout = 8
	l := newLink(t, o)
	p := &cnpPacer{}
	l.a.qp.cfg.Pacer = p
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte { return nil }
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend}))
	l.pump()
	deadline, before := l.a.qp.NextDeadline(), l.a.qp.Query()
	cnp := wire.Fields{BTH: wire.BTHFields{Opcode: wire.CNP}}
	for i := 0; i < 3; i++ {
		l.inject(l.a, cnp, nil)
	}
	c := l.a.qp.Counters()
	if c.RcvdCNP != 3 || p.cnps != 3 || c.Dropped != 0 || c.CompleterRetryErr != 0 || l.a.scq.Len() != 0 {
		t.Fatalf("counters %+v, pacer saw %d CNPs", c, p.cnps)
	}
	if out := l.drain(l.a); len(out) != 0 || !l.a.qp.NextDeadline().Equal(deadline) || l.a.qp.Query() != before || l.a.qp.cmp.retryLeft != o.retry {
		t.Fatalf("a CNP changed the transport: sent %v, deadline %v", out, l.a.qp.NextDeadline())
	}
	l.b.qp.cfg.Pacer = plainPacer{}
	must(t, l.b.qp.Modify(l.now, &Attr{State: StateErr}, AttrState))
	l.inject(l.b, cnp, nil)
	if c := l.b.qp.Counters(); c.RcvdCNP != 1 || c.Dropped != 0 {
		t.Fatalf("counters of a QP in ERR %+v", c)
	}

	l = newLink(t, defaultOpts())
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	b, err := wire.Append(nil, &wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey, DestQP: 0x22, PSN: 0x100, AckReq: true}}, nil)
	must(t, err)
	pkt, err := wire.Parse(b)
	must(t, err)
	l.b.qp.HandlePacket(l.now, pkt, &RxInfo{CE: true})
	expectLines(t, l.drain(l.b), "ACKNOWLEDGE psn=256 [ACK msn=1]")
	if c := l.b.qp.Counters(); c.RcvdCE != 1 || l.b.rcq.Len() != 1 {
		t.Fatalf("counters %+v", c)
	}
}

// An implied acknowledgement that retires the requests a go-back-N resend is part way through moves
// the resend on to the oldest unacknowledged PSN: the READ behind them goes out with its own first PSN,
// not the PSN the resend had reached. (Found by the sim fault campaign, seeds 262 and 298.)
func TestImpliedAckDuringResend(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	l := newLink(t, o)
	local := l.a.reg(t, 768, mr.LocalWrite)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 3, Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 768), RemoteAddr: 0x1000, RKey: 5}))
	expectLines(t, l.drain(l.a), "SEND_ONLY psn=256 A", "SEND_ONLY psn=257 A", "RDMA_READ_REQUEST psn=258 A len=768")
	nak := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCAcknowledge, PSN: 256}, AETH: wire.AETHFields{Syndrome: wire.SyndromeNAK(wire.NAKPSNSequenceError)}}
	l.inject(l.a, nak, nil)
	b, _, _ := l.a.qp.AppendPacket(l.now, nil) // the resend has sent PSN 256 only
	if p, err := wire.Parse(b); err != nil || describe(p) != "SEND_ONLY psn=256 A" {
		t.Fatalf("resend started with %v", err)
	}
	// A READ response for PSN 259, late from the first transmission: it acknowledges both SENDs and
	// implies the response for 258 was lost.
	l.inject(l.a, wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCReadResponseMiddle, PSN: 259}}, make([]byte, 256))
	expectCompletions(t, l.a.scq)
	expectLines(t, l.drain(l.a), "RDMA_READ_REQUEST psn=258 A len=768")
}
