package qp

import (
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// remoteErrorCase runs one request against a responder set up to refuse it and checks the NAK, the
// requester's status, both states and that memory outside the request was not touched.
type remoteErrorCase struct {
	name       string
	qpAccess   mr.Access // the responder QP's access flags
	mrAccess   mr.Access // the responder region's access
	wr         func(local, remote *mr.Region) SendWR
	wantNAK    string
	wantStatus Status
}

func TestRemoteErrors(t *testing.T) {
	all := mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic
	write := func(off uint64, n int, key func(*mr.Region) wire.RKey) func(l, r *mr.Region) SendWR {
		return func(l, r *mr.Region) SendWR {
			return SendWR{Opcode: WRWrite, SGL: sge(l, 0, n), RemoteAddr: r.IOVA() + off, RKey: key(r)}
		}
	}
	good := func(r *mr.Region) wire.RKey { return r.RKey() }
	bad := func(r *mr.Region) wire.RKey { return r.RKey() ^ 0x100 }
	for _, tc := range []remoteErrorCase{
		{"M1 bad rkey", all, mr.LocalWrite | all, write(0, 16, bad), "NAK remote-access-error", StatusRemAccessErr},
		{"M2 past the end", all, mr.LocalWrite | all, write(1000, 100, good), "NAK remote-access-error", StatusRemAccessErr},
		{"M3 region lacks remote write", all, mr.LocalWrite | mr.RemoteRead, write(0, 16, good), "NAK remote-access-error", StatusRemAccessErr},
		{"M3 QP lacks remote write", mr.RemoteRead, mr.LocalWrite | all, write(0, 16, good), "NAK invalid-request", StatusRemInvReqErr},
		{"M3 QP lacks remote read", mr.RemoteWrite, mr.LocalWrite | all, func(l, r *mr.Region) SendWR {
			return SendWR{Opcode: WRRead, SGL: sge(l, 0, 16), RemoteAddr: r.IOVA(), RKey: r.RKey()}
		}, "NAK invalid-request", StatusRemInvReqErr},
		{"X3 misaligned atomic", all, mr.LocalWrite | all, func(l, r *mr.Region) SendWR {
			return SendWR{Opcode: WRFetchAdd, SGL: sge(l, 0, 8), RemoteAddr: r.IOVA() + 4, RKey: r.RKey(), CompareAdd: 1}
		}, "NAK invalid-request", StatusRemInvReqErr},
		{"X4 QP lacks remote atomic", mr.RemoteWrite, mr.LocalWrite | all, func(l, r *mr.Region) SendWR {
			return SendWR{Opcode: WRCompareSwap, SGL: sge(l, 0, 8), RemoteAddr: r.IOVA(), RKey: r.RKey()}
		}, "NAK invalid-request", StatusRemInvReqErr},
		{"X4 region lacks remote atomic", all, mr.LocalWrite | mr.RemoteWrite, func(l, r *mr.Region) SendWR {
			return SendWR{Opcode: WRCompareSwap, SGL: sge(l, 0, 8), RemoteAddr: r.IOVA(), RKey: r.RKey()}
		}, "NAK remote-access-error", StatusRemAccessErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := defaultOpts()
			o.access = tc.qpAccess
			l := newLink(t, o)
			local := l.a.reg(t, 128, mr.LocalWrite)
			buf := make([]byte, 1024+64)
			for i := range buf {
				buf[i] = 0xEE
			}
			remote, err := l.b.mem.Register(l.b.pd, buf[32:32+1024], tc.mrAccess)
			must(t, err)
			wr := tc.wr(local, remote)
			wr.ID = 1
			must(t, l.a.qp.PostSend(l.now, &wr))
			must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend}))
			l.run(time.Second)
			if len(l.ladder) != 3 || l.ladder[2][:19] != "<- ACKNOWLEDGE psn=" || !contains(l.ladder[2], tc.wantNAK) {
				t.Fatalf("ladder:\n%s\nwant the request, the next, then %s", l.ladderString(), tc.wantNAK)
			}
			op := wr.Opcode.completionOpcode()
			expectCompletions(t, l.a.scq,
				Completion{WRID: 1, Status: tc.wantStatus, Opcode: op, QPN: 0x11},
				Completion{WRID: 2, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11})
			if l.a.qp.State() != StateErr || l.b.qp.State() != StateErr {
				t.Fatalf("states %v %v, want both ERR (class C)", l.a.qp.State(), l.b.qp.State())
			}
			for i, v := range buf {
				if v != 0xEE {
					t.Fatalf("byte %d of the responder's buffer changed", i)
				}
			}
		})
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// CONFORMANCE M5: a receive too small for the SEND: NAK invalid request, LOC_LEN_ERR on the receive.
func TestReceiveTooSmall(t *testing.T) {
	l := newLink(t, defaultOpts())
	src := l.a.reg(t, 100, mr.LocalWrite)
	dst := l.b.reg(t, 100, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 50)}))
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 2, SGL: sge(dst, 50, 50)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, SGL: sge(src, 0, 100)}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRemInvReqErr, Opcode: CompSend, QPN: 0x11})
	expectCompletions(t, l.b.rcq,
		Completion{WRID: 1, Status: StatusLocLenErr, Opcode: CompRecv, QPN: 0x22},
		Completion{WRID: 2, Status: StatusWRFlushErr, Opcode: CompRecv, QPN: 0x22})
}

// CONFORMANCE M4: a receive whose buffer is not writable: NAK remote operational error.
func TestBadReceiveBuffer(t *testing.T) {
	l := newLink(t, defaultOpts())
	src := l.a.reg(t, 100, mr.LocalWrite)
	ro := l.b.reg(t, 100, mr.RemoteRead) // no LocalWrite
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(ro, 0, 100)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, SGL: sge(src, 0, 10)}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRemOpErr, Opcode: CompSend, QPN: 0x11})
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Status: StatusLocProtErr, Opcode: CompRecv, QPN: 0x22})
}

// CONFORMANCE D3: a READ to a responder with max_dest_rd_atomic 0.
func TestNoResponderResources(t *testing.T) {
	o := defaultOpts()
	l := newLink(t, o)
	o.rdAtomic = 0
	must(t, l.b.qp.Modify(l.now, &Attr{State: StateReset}, AttrState))
	connect(t, l.now, l.b.qp, 0x11, o, o.psnB, o.psnA)
	local := l.a.reg(t, 16, mr.LocalWrite)
	remote := l.b.reg(t, 16, mr.RemoteRead)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 16), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRemInvReqErr, Opcode: CompRDMARead, QPN: 0x11})
}

// CONFORMANCE L1: the classic MTU mismatch. The requester segments at 2048, the responder expects 1024:
// the first packet is too long for it and is NAKed invalid request.
func TestMTUMismatch(t *testing.T) {
	o := defaultOpts()
	l := newLink(t, o)
	o.mtu = wire.MTU2048
	must(t, l.a.qp.Modify(l.now, &Attr{State: StateReset}, AttrState))
	connect(t, l.now, l.a.qp, 0x22, o, o.psnA, o.psnB)
	src := l.a.reg(t, 4096, mr.LocalWrite)
	dst := l.b.reg(t, 4096, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 4096)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend, SGL: sge(src, 0, 4096)}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusRemInvReqErr, Opcode: CompSend, QPN: 0x11})
	if l.ladder[len(l.ladder)-1] != "<- ACKNOWLEDGE psn=256 [NAK invalid-request msn=0]" {
		t.Fatalf("ladder:\n%s", l.ladderString())
	}
}

// CONFORMANCE R8: a bad lkey fails the request with LOC_PROT_ERR before anything is sent; a READ into
// a region without LocalWrite fails the same way when its response arrives.
func TestLocalProtectionErrors(t *testing.T) {
	l := newLink(t, defaultOpts())
	src := l.a.reg(t, 16, mr.LocalWrite)
	wr := SendWR{ID: 1, Opcode: WRSend, SGL: []mr.SGE{{Addr: src.IOVA(), Length: 16, LKey: src.LKey() ^ 1}}}
	must(t, l.a.qp.PostSend(l.now, &wr))
	l.run(time.Second)
	if len(l.ladder) != 0 {
		t.Fatalf("sent packets:\n%s", l.ladderString())
	}
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusLocProtErr, Opcode: CompSend, QPN: 0x11})

	l = newLink(t, defaultOpts())
	ro := l.a.reg(t, 16, mr.RemoteRead) // no LocalWrite: READ cannot land here
	remote := l.b.reg(t, 16, mr.RemoteRead)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRRead, SGL: sge(ro, 0, 16), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 2, Status: StatusLocProtErr, Opcode: CompRDMARead, QPN: 0x11})
}

// CONFORMANCE D2: zero-length READ and WRITE go out and succeed without any key check.
func TestZeroLengthRDMA(t *testing.T) {
	l := newLink(t, defaultOpts())
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, RemoteAddr: 0xdead, RKey: 0xbad}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRRead, Flags: Signaled, RemoteAddr: 0xdead, RKey: 0xbad}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_ONLY psn=256 A len=0",
		"-> RDMA_READ_REQUEST psn=257 A len=0",
		"<- ACKNOWLEDGE psn=256 [ACK msn=1]",
		"<- RDMA_READ_RESPONSE_ONLY psn=257 [ACK msn=2]",
	)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11},
		Completion{WRID: 2, Opcode: CompRDMARead, QPN: 0x11})
}

// CONFORMANCE M7: SEND_WITH_INV invalidates the named rkey at the responder; a WRITE with it then fails.
func TestSendWithInvalidate(t *testing.T) {
	l := newLink(t, defaultOpts())
	dst := l.b.reg(t, 16, mr.LocalWrite)
	target, err := l.b.mem.Register(l.b.pd, make([]byte, 64), mr.LocalWrite|mr.RemoteWrite, mr.Invalidatable())
	must(t, err)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 16)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSendInv, Flags: Signaled, InvalidateRKey: target.RKey()}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompSend, QPN: 0x11})
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Opcode: CompRecv, QPN: 0x22, InvalidatedRKey: target.RKey(), Flags: WithInv})
	src := l.a.reg(t, 16, mr.LocalWrite)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRWrite, SGL: sge(src, 0, 16), RemoteAddr: target.IOVA(), RKey: target.RKey()}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 2, Status: StatusRemAccessErr, Opcode: CompRDMAWrite, QPN: 0x11})
}

// CONFORMANCE C2: unsignaled requests retire silently; sq_sig_all makes every request complete.
func TestUnsignaled(t *testing.T) {
	l := newLink(t, defaultOpts())
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1}))
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 2}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRSend}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRSend, Flags: Signaled}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 2, Opcode: CompSend, QPN: 0x11})
	if got := poll(l.b.rcq); len(got) != 2 {
		t.Fatalf("receive completions %+v", got)
	}
}

// CONFORMANCE C6: a full receive CQ puts the responder's QP in ERR.
func TestCQOverflow(t *testing.T) {
	l := newLink(t, defaultOpts())
	l.b.qp.cfg.RecvCQ = NewCQ(1)
	for i := 0; i < 3; i++ {
		must(t, l.b.qp.PostRecv(&RecvWR{ID: uint64(i)}))
	}
	for i := 0; i < 2; i++ {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(i), Opcode: WRSend}))
	}
	l.run(time.Second)
	if l.b.qp.State() != StateErr || !l.b.qp.cfg.RecvCQ.Overflowed() || l.b.qp.Counters().CQOverflow == 0 {
		t.Fatalf("state %v overflowed %v", l.b.qp.State(), l.b.qp.cfg.RecvCQ.Overflowed())
	}
}

// CONFORMANCE A8: a READ answered with the wrong response opcode fails with BAD_RESP_ERR.
func TestBadResponseOpcode(t *testing.T) {
	o := defaultOpts()
	o.mtu = wire.MTU256
	l := newLink(t, o)
	local := l.a.reg(t, 1024, mr.LocalWrite)
	remote := l.b.reg(t, 1024, mr.RemoteRead)
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if p.Opcode() == wire.RCReadResponseLast { // rewrite LAST as MIDDLE (no AETH)
			b := p.Bytes()
			out := append([]byte{byte(wire.RCReadResponseMiddle)}, b[1:wire.BTHLen]...)
			return [][]byte{append(out, b[wire.BTHLen+wire.AETHLen:]...)}
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, SGL: sge(local, 0, 1024), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Status: StatusBadRespErr, Opcode: CompRDMARead, QPN: 0x11})
}

// CONFORMANCE A6: a response for a PSN that was never sent is dropped and counted.
func TestGhostResponse(t *testing.T) {
	l := newLink(t, defaultOpts())
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCAcknowledge, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 0x500},
		AETH: wire.AETHFields{Syndrome: wire.SyndromeACK(wire.CreditInvalid)}}
	b, _ := wire.Append(nil, &f, nil)
	p, _ := wire.Parse(b)
	l.a.qp.HandlePacket(l.now, p, nil)
	if c := l.a.qp.Counters(); c.DropGhostResponse != 1 || l.a.qp.State() != StateRTS {
		t.Fatalf("counters %+v state %v", c, l.a.qp.State())
	}
}

// CONFORMANCE Q4: moving to ERR flushes sends and receives in posting order; nothing more is sent.
func TestModifyToErrorFlushes(t *testing.T) {
	l := newLink(t, defaultOpts())
	src := l.a.reg(t, 16, mr.LocalWrite)
	for i := 1; i <= 2; i++ {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(i), Opcode: WRSend, SGL: sge(src, 0, 16)}))
		must(t, l.a.qp.PostRecv(&RecvWR{ID: uint64(10 + i)}))
	}
	must(t, l.a.qp.Modify(l.now, &Attr{State: StateErr}, AttrState))
	l.run(time.Second)
	if len(l.ladder) != 0 {
		t.Fatalf("sent:\n%s", l.ladderString())
	}
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11},
		Completion{WRID: 2, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11})
	expectCompletions(t, l.a.rcq,
		Completion{WRID: 11, Status: StatusWRFlushErr, Opcode: CompRecv, QPN: 0x11},
		Completion{WRID: 12, Status: StatusWRFlushErr, Opcode: CompRecv, QPN: 0x11})
	// Posting in ERR completes at once with a flush error.
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 3, Opcode: WRSend}))
	expectCompletions(t, l.a.scq, Completion{WRID: 3, Status: StatusWRFlushErr, Opcode: CompSend, QPN: 0x11})
}

// CONFORMANCE Q1, Q2, Q6, Q7: modify validates like ibv_modify_qp; posting needs the right state.
func TestModifyValidation(t *testing.T) {
	h := newHost(t, "A", RC, 0x11, false)
	q := h.qp
	now := epoch
	if err := q.PostSend(now, &SendWR{Opcode: WRSend}); !errors.Is(err, ErrInvalidState) {
		t.Errorf("post send in RESET: %v", err)
	}
	if err := q.PostRecv(&RecvWR{}); !errors.Is(err, ErrInvalidState) {
		t.Errorf("post recv in RESET: %v", err)
	}
	for _, tc := range []struct {
		name string
		a    Attr
		mask AttrMask
		want error
	}{
		{"RESET->RTR", Attr{State: StateRTR}, AttrState, ErrInvalidTransition},
		{"RESET->INIT without access flags", Attr{State: StateInit}, AttrState, ErrMissingAttr},
		{"RESET->INIT with a path MTU", Attr{State: StateInit}, AttrState | AttrAccessFlags | AttrPathMTU, ErrUnexpectedAttr},
		{"RESET->INIT with bad access", Attr{State: StateInit, AccessFlags: 1 << 10}, AttrState | AttrAccessFlags, ErrInvalidAttr},
	} {
		if err := q.Modify(now, &tc.a, tc.mask); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if q.State() != StateReset {
			t.Fatalf("%s: state changed to %v", tc.name, q.State())
		}
	}
	must(t, q.Modify(now, &Attr{State: StateInit, AccessFlags: mr.RemoteWrite}, AttrState|AttrAccessFlags))
	if err := q.PostSend(now, &SendWR{Opcode: WRSend}); !errors.Is(err, ErrInvalidState) {
		t.Errorf("post send in INIT: %v", err)
	}
	must(t, q.PostRecv(&RecvWR{ID: 1}))
	rtr := Attr{State: StateRTR, PathMTU: wire.MTU1024, DestQPN: 0x22, RQPSN: 5, MaxDestRdAtomic: 12, MinRNRTimer: 12}
	full := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	for _, tc := range []struct {
		name string
		a    Attr
		mask AttrMask
		want error
	}{
		{"INIT->RTS", Attr{State: StateRTS}, AttrState, ErrInvalidTransition},
		{"INIT->RTR without the RQ PSN", rtr, full &^ AttrRQPSN, ErrMissingAttr},
		{"INIT->RTR with a bad MTU", func() Attr { a := rtr; a.PathMTU = 7; return a }(), full, ErrInvalidAttr},
		{"INIT->RTR with a 25-bit PSN", func() Attr { a := rtr; a.RQPSN = 1 << 24; return a }(), full, ErrInvalidAttr},
		{"INIT->RTR to QPN 0", func() Attr { a := rtr; a.DestQPN = 0; return a }(), full, ErrInvalidAttr},
	} {
		if err := q.Modify(now, &tc.a, tc.mask); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	must(t, q.Modify(now, &rtr, full))
	if got := q.Query(); got.MaxDestRdAtomic != 16 || got.State != StateRTR || got.RQPSN != 5 {
		t.Errorf("query after RTR: %+v (rd atomic rounds up to a power of two, as in rxe)", got)
	}
	rts := Attr{State: StateRTS, SQPSN: 9, Timeout: 14, RetryCnt: 8, RNRRetry: 7, MaxRdAtomic: 1}
	rtsMask := AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
	if err := q.Modify(now, &rts, rtsMask); !errors.Is(err, ErrInvalidAttr) {
		t.Errorf("retry count 8: %v", err)
	}
	rts.RetryCnt = 7
	must(t, q.Modify(now, &rts, rtsMask))
	if err := q.Modify(now, &Attr{State: StateRTR}, AttrState); !errors.Is(err, ErrInvalidTransition) {
		t.Errorf("RTS->RTR: %v", err)
	}
	must(t, q.Modify(now, &Attr{State: StateReset}, AttrState))
	if q.State() != StateReset || poll(h.rcq) != nil && len(poll(h.rcq)) != 0 {
		t.Errorf("reset: state %v", q.State())
	}
	// Queue limits.
	must(t, q.Modify(now, &Attr{State: StateInit, AccessFlags: 0}, AttrState|AttrAccessFlags))
	for i := 0; i < 256; i++ {
		must(t, q.PostRecv(&RecvWR{ID: uint64(i)}))
	}
	if err := q.PostRecv(&RecvWR{}); !errors.Is(err, ErrQueueFull) {
		t.Errorf("257th receive: %v", err)
	}
	if err := q.PostRecv(&RecvWR{SGL: make([]mr.SGE, 5)}); !errors.Is(err, ErrTooManySGE) {
		t.Errorf("5 SGEs: %v", err)
	}
}

// Work request validation at post time.
func TestPostSendValidation(t *testing.T) {
	l := newLink(t, defaultOpts())
	q := l.a.qp
	for _, tc := range []struct {
		name string
		wr   SendWR
		want error
	}{
		{"too many SGEs", SendWR{Opcode: WRSend, SGL: make([]mr.SGE, 5)}, ErrTooManySGE},
		{"atomic of 4 bytes", SendWR{Opcode: WRFetchAdd, SGL: []mr.SGE{{Length: 4}}}, ErrBadAtomic},
		{"inline too long", SendWR{Opcode: WRSend, Flags: Inline, InlineData: make([]byte, 257)}, ErrInlineTooLong},
		{"inline READ", SendWR{Opcode: WRRead, Flags: Inline}, ErrBadInline},
		{"unknown opcode", SendWR{Opcode: 42}, ErrBadOpcode},
	} {
		if err := q.PostSend(l.now, &tc.wr); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// A fatal NAK does not swallow the responses to earlier requests: a READ pipelined before a misaligned
// atomic still completes, and only the atomic fails.
func TestResponsesBeforeFatalNAK(t *testing.T) {
	l := newLink(t, defaultOpts())
	local := l.a.reg(t, 64, mr.LocalWrite)
	remote := l.b.reg(t, 64, mr.LocalWrite|mr.RemoteRead|mr.RemoteAtomic)
	fill(remote.Bytes(), 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRRead, Flags: Signaled, SGL: sge(local, 0, 16), RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 2, Opcode: WRFetchAdd, SGL: sge(local, 16, 8), RemoteAddr: remote.IOVA() + 4, RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_READ_REQUEST psn=256 A len=16",
		"-> FETCH_ADD psn=257 A",
		"<- RDMA_READ_RESPONSE_ONLY psn=256 [ACK msn=1] +16",
		"<- ACKNOWLEDGE psn=257 [NAK invalid-request msn=1]",
	)
	expectCompletions(t, l.a.scq,
		Completion{WRID: 1, Opcode: CompRDMARead, QPN: 0x11, ByteLen: 16},
		Completion{WRID: 2, Status: StatusRemInvReqErr, Opcode: CompFetchAdd, QPN: 0x11})
}
