package goroce_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// Tests of UD services through the CM (SIDR) as a program uses them: ListenUD, ResolveUD and
// datagrams both ways, on devices of one MemNetwork.

// udEnd is a UD QP with its CQ and a region for messages, receives posted before the QP leaves INIT.
type udEnd struct {
	qp  *goroce.QP
	cq  *goroce.CQ
	buf *goroce.MR
}

// udMsgLen is udaddy's message size.
const udMsgLen = 100

// grhLen is the GRH a UD receive starts with.
const grhLen = 40

func newUDEnd(t testing.TB, d *goroce.Device, recvs int) *udEnd {
	t.Helper()
	pd, err := d.AllocPD()
	ok(t, err)
	cq, err := d.CreateCQ(64)
	ok(t, err)
	q, err := pd.CreateQP(goroce.QPInit{Type: goroce.UD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16,
		MaxSendSGE: 1, MaxRecvSGE: 1})
	ok(t, err)
	buf, err := pd.AllocMR(16*(grhLen+udMsgLen), goroce.LocalWrite)
	ok(t, err)
	ok(t, q.Init())
	for i := range recvs {
		ok(t, q.PostRecv(&goroce.RecvWR{WRID: uint64(i), SGL: []goroce.SGE{buf.SGE(i*(grhLen+udMsgLen), grhLen+udMsgLen)}}))
	}
	t.Cleanup(func() { q.Close(); buf.Close(); cq.Close(); pd.Close() })
	return &udEnd{qp: q, cq: cq, buf: buf}
}

// send sends msg as a SEND with immediate (the sender's QPN, as udaddy does) to wr's destination.
func (e *udEnd) send(t testing.TB, wr goroce.SendWR, msg []byte) {
	t.Helper()
	wr.Opcode, wr.Flags, wr.Imm = goroce.WRSendImm, goroce.Signaled|goroce.Inline, uint32(e.qp.QPN())
	wr.InlineData = msg
	ok(t, e.qp.PostSend(&wr))
	if wc := waitOne(t, e.cq); wc.Err() != nil || wc.Opcode != goroce.CompSend {
		t.Fatalf("send: %#v", wc)
	}
}

// receive waits for a datagram and returns its completion and payload, after the GRH.
func (e *udEnd) receive(t testing.TB) (goroce.Completion, []byte) {
	t.Helper()
	wc := waitOne(t, e.cq)
	if wc.Err() != nil || wc.Opcode != goroce.CompRecv || wc.Flags&goroce.WithImm == 0 || wc.Flags&goroce.WithGRH == 0 {
		t.Fatalf("receive: %#v", wc)
	}
	off := int(wc.WRID) * (grhLen + udMsgLen)
	return wc, e.buf.Bytes()[off+grhLen : off+int(wc.ByteLen)]
}

// grhSource returns the IPv4 source address of the GRH of receive wrid (RoCEv2: the IPv4 header in
// the GRH's last 20 bytes).
func (e *udEnd) grhSource(wrid uint64) netip.Addr {
	off := int(wrid) * (grhLen + udMsgLen)
	return netip.AddrFrom4([4]byte(e.buf.Bytes()[off+20+12 : off+20+16]))
}

// TestUDResolve: ResolveUD learns the listener's QPN, rdma_cm's Q_Key and its private data; a datagram
// goes to the server with the client's QPN as immediate data, and the server answers from what the
// datagram carries (the GRH's source address, the immediate), as udaddy's server does.
func TestUDResolve(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	srv := newUDEnd(t, p.server, 4)
	l, err := p.server.ListenUD(7174, srv.qp, &goroce.UDOptions{PrivateData: []byte("udaddy here")})
	ok(t, err)
	defer l.Close()
	if l.Addr() != netip.AddrPortFrom(cmAddrB, 7174) || l.QKey() != goroce.RDMAUDPQKey || srv.qp.State() != goroce.StateRTS {
		t.Fatalf("listener %v, Q_Key %#x, QP in %v", l.Addr(), l.QKey(), srv.qp.State())
	}
	if q := srv.qp.Query().QKey; q != 0x01234567 {
		t.Fatalf("the server QP's Q_Key %#x", q)
	}
	cli := newUDEnd(t, p.client, 4)
	s, err := p.client.ResolveUD(ctx, "10.0.0.2:7174", &goroce.UDOptions{QP: cli.qp, PrivateData: []byte("hi")})
	ok(t, err)
	if s.QPN != srv.qp.QPN() || s.QKey != goroce.RDMAUDPQKey || s.Addr != l.Addr() || s.AH.DGID.Addr() != cmAddrB ||
		!bytes.HasPrefix(s.PrivateData, []byte("udaddy here")) || len(s.PrivateData) != 136 {
		t.Fatalf("resolved %+v; server QPN %v", s, srv.qp.QPN())
	}
	if cli.qp.State() != goroce.StateRTS || cli.qp.Query().QKey != goroce.RDMAUDPQKey {
		t.Fatalf("client QP in %v, Q_Key %#x", cli.qp.State(), cli.qp.Query().QKey)
	}

	msg := bytes.Repeat([]byte("c"), udMsgLen)
	var wr goroce.SendWR
	s.Address(&wr)
	cli.send(t, wr, msg)
	wc, got := srv.receive(t)
	if !bytes.Equal(got, msg) || wc.SrcQP != cli.qp.QPN() || wc.Imm != uint32(cli.qp.QPN()) || wc.ByteLen != grhLen+udMsgLen {
		t.Fatalf("server received %#v %q", wc, got)
	}
	from := srv.grhSource(wc.WRID)
	if from != cmAddrA {
		t.Fatalf("GRH source %v", from)
	}
	// The answer: to the GRH's address, the QPN of the immediate, the server QP's own Q_Key.
	reply := bytes.Repeat([]byte("s"), udMsgLen)
	srv.send(t, goroce.SendWR{AH: &goroce.AddressHandle{DGID: goroce.GIDFromAddr(from), HopLimit: 64},
		RemoteQPN: goroce.QPN(wc.Imm), RemoteQKey: srv.qp.Query().QKey}, reply)
	wc, got = cli.receive(t)
	if !bytes.Equal(got, reply) || wc.SrcQP != srv.qp.QPN() {
		t.Fatalf("client received %#v %q", wc, got)
	}
	if n := p.client.Stats().CM; n.Sent[7] != 1 || n.Rcvd[8] != 1 || n.SIDRResolved != 1 || n.Dropped != 0 {
		t.Errorf("client CM: sent SIDR_REQ %d, received SIDR_REP %d, resolved %d, dropped %d", n.Sent[7], n.Rcvd[8], n.SIDRResolved, n.Dropped)
	}
	if n := p.server.Stats().CM; n.Rcvd[7] != 1 || n.Sent[8] != 1 {
		t.Errorf("server CM: received SIDR_REQ %d, sent SIDR_REP %d", n.Rcvd[7], n.Sent[8])
	}
}

// TestUDManualAccept: a ManualAccept listener hands the request to Request, with the client's address
// and private data; Reject refuses it and ResolveUD fails with a *SIDRError carrying the status and
// the private data; the next request is accepted with other private data.
func TestUDManualAccept(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	srv := newUDEnd(t, p.server, 0)
	l, err := p.server.ListenUD(0, srv.qp, &goroce.UDOptions{ManualAccept: true})
	ok(t, err)
	answer := func(accept bool) {
		r, err := l.Request(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		if r.RemoteAddr().Addr() != cmAddrA || !bytes.HasPrefix(r.PrivateData(), []byte("may I")) || len(r.PrivateData()) != 180 {
			t.Errorf("request from %v with %q", r.RemoteAddr(), r.PrivateData())
		}
		if accept {
			err = r.Accept([]byte("yes"))
		} else {
			err = r.Reject([]byte("no"))
		}
		if err != nil {
			t.Error(err)
		}
		if err := r.Accept(nil); !errors.Is(err, goroce.ErrBadState) {
			t.Errorf("a second answer: %v", err)
		}
	}
	// Each answer runs in a goroutine of its own, and the test waits for it before going on: its
	// second answer must meet the request answered, not the listener closed below.
	answered := make(chan struct{})
	go func() { defer close(answered); answer(false) }()
	_, err = p.client.ResolveUD(ctx, l.Addr().String(), &goroce.UDOptions{PrivateData: []byte("may I")})
	<-answered
	var se *goroce.SIDRError
	if !errors.Is(err, goroce.ErrConnRefused) || !errors.As(err, &se) || se.Status != goroce.SIDRReject ||
		!bytes.HasPrefix(se.PrivateData, []byte("no")) {
		t.Fatalf("ResolveUD of a refused request: %v", err)
	}
	answered = make(chan struct{})
	go func() { defer close(answered); answer(true) }()
	s, err := p.client.ResolveUD(ctx, l.Addr().String(), &goroce.UDOptions{PrivateData: []byte("may I")})
	<-answered
	ok(t, err)
	if s.QPN != srv.qp.QPN() || !bytes.HasPrefix(s.PrivateData, []byte("yes")) {
		t.Fatalf("resolved %+v", s)
	}
	ok(t, l.Close())
	if _, err := l.Request(ctx); !errors.Is(err, goroce.ErrClosed) {
		t.Fatalf("Request after Close: %v", err)
	}
}

// TestUDNoListener: a port nobody serves, or served only in the TCP port space, is answered
// SIDRUnsupported at once; a closed listener's port too.
func TestUDNoListener(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	tl, err := p.server.Listen(7174, nil)
	ok(t, err)
	defer tl.Close()
	srv := newUDEnd(t, p.server, 0)
	ul, err := p.server.ListenUD(7175, srv.qp, nil)
	ok(t, err)
	ok(t, ul.Close())
	for _, port := range []string{"7174", "7175", "9"} {
		_, err := p.client.ResolveUD(ctx, "10.0.0.2:"+port, nil)
		var se *goroce.SIDRError
		if !errors.Is(err, goroce.ErrConnRefused) || !errors.As(err, &se) || se.Status != goroce.SIDRUnsupported {
			t.Errorf("port %s: %v", port, err)
		}
	}
	// The same port again in the UD space is free.
	ul, err = p.server.ListenUD(7175, srv.qp, nil)
	ok(t, err)
	ok(t, ul.Close())
}

// TestUDBadOptions: what ListenUD and ResolveUD refuse before any MAD.
func TestUDBadOptions(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	pd, err := p.server.AllocPD()
	ok(t, err)
	defer pd.Close()
	cq, err := p.server.CreateCQ(4)
	ok(t, err)
	defer cq.Close()
	rc, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
	ok(t, err)
	defer rc.Close()
	if _, err := p.server.ListenUD(7174, rc, nil); !errors.Is(err, goroce.ErrBadConfig) {
		t.Errorf("ListenUD with an RC QP: %v", err)
	}
	srv := newUDEnd(t, p.server, 0)
	ok(t, srv.qp.Connect(goroce.Endpoint{}, &goroce.ConnectOptions{QKey: 7}))
	if _, err := p.server.ListenUD(7174, srv.qp, nil); !errors.Is(err, goroce.ErrBadConfig) {
		t.Errorf("ListenUD with a QP of another Q_Key: %v", err)
	}
	l, err := p.server.ListenUD(7174, srv.qp, &goroce.UDOptions{QKey: 7})
	ok(t, err)
	if _, err := p.server.ListenUD(7174, srv.qp, &goroce.UDOptions{QKey: 7}); err == nil {
		t.Error("two listeners on one port")
	}
	ok(t, l.Close())
	if _, err := p.client.ResolveUD(ctx, "10.0.0.2:7174", &goroce.UDOptions{PrivateData: make([]byte, 181)}); !errors.Is(err, goroce.ErrBadConfig) {
		t.Errorf("181 bytes of private data: %v", err)
	}
	if _, err := p.client.ResolveUD(ctx, "10.0.0.2", nil); !errors.Is(err, goroce.ErrBadConfig) {
		t.Errorf("no port: %v", err)
	}
}

// resolveOnManualClock runs ResolveUD in the background and moves clock a second every real
// millisecond until it returns; it returns the seconds that passed and ResolveUD's error.
func resolveOnManualClock(t testing.TB, clock *goroce.ManualClock, d *goroce.Device, address string) (secs int, err error) {
	t.Helper()
	type result struct {
		s   *goroce.UDService
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := d.ResolveUD(context.Background(), address, nil)
		done <- result{s, err}
	}()
	for i := 0; ; i++ {
		select {
		case r := <-done:
			return i, r.err
		case <-time.After(time.Millisecond):
			if d.Stats().CM.Sent[7] == 0 {
				continue // the SIDR_REQ has not left yet
			}
			clock.Advance(time.Second)
			if i > 1000 {
				t.Fatal("ResolveUD never returned")
			}
		}
	}
}

// TestUDLostRequest: the first SIDR_REQ is lost; the client resends it after chapter 12's timeout
// (4.3 s with rdma_cm's values) and the answer comes.
func TestUDLostRequest(t *testing.T) {
	clock := goroce.NewManualClock(time.Unix(1e6, 0))
	p := newCMPair(t, goroce.Config{Clock: clock})
	srv := newUDEnd(t, p.server, 0)
	l, err := p.server.ListenUD(7174, srv.qp, nil)
	ok(t, err)
	defer l.Close()
	ok(t, p.net.Impair(goroce.Impairment{Loss: 1, From: cmAddrA}))
	type result struct {
		s   *goroce.UDService
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := p.client.ResolveUD(context.Background(), "10.0.0.2:7174", nil)
		done <- result{s, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.client.Stats().CM.Sent[7] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no SIDR_REQ sent")
		}
		time.Sleep(time.Millisecond)
	}
	ok(t, p.net.Impair(goroce.Impairment{}))
	clock.Advance(5 * time.Second)
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ResolveUD never returned")
	}
	ok(t, r.err)
	if r.s.QPN != srv.qp.QPN() {
		t.Fatalf("resolved %+v", r.s)
	}
	c, s := p.client.Stats().CM, p.server.Stats().CM
	if c.Sent[7] != 2 || c.Retries[7] != 1 || s.Rcvd[7] != 1 || s.Sent[8] != 1 || p.net.Stats().Dropped != 1 {
		t.Errorf("client sent %d SIDR_REQs (%d resent), server received %d and answered %d, %d lost; want 2, 1, 1, 1, 1",
			c.Sent[7], c.Retries[7], s.Rcvd[7], s.Sent[8], p.net.Stats().Dropped)
	}
}

// TestUDUnreachable: a SIDR_REQ nobody answers is sent 16 times, about 4.3 s apart, and ResolveUD then
// fails with ErrUnreachable.
func TestUDUnreachable(t *testing.T) {
	clock := goroce.NewManualClock(time.Unix(1e6, 0))
	p := newCMPair(t, goroce.Config{Clock: clock})
	secs, err := resolveOnManualClock(t, clock, p.client, "10.0.0.9:7174")
	if !errors.Is(err, goroce.ErrUnreachable) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ResolveUD: %v", err)
	}
	if st := p.client.Stats().CM; st.Sent[7] != 16 || st.Retries[7] != 15 || st.Unreachable != 1 {
		t.Errorf("SIDR_REQs %d, retries %d, unreachable %d; want 16, 15, 1", st.Sent[7], st.Retries[7], st.Unreachable)
	}
	if secs < 60 {
		t.Errorf("gave up after %d s", secs)
	}
}

// TestUDContext: ResolveUD returns the context's error when it ends first, and the attempt is gone.
func TestUDContext(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ok(t, p.net.Impair(goroce.Impairment{Loss: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.client.ResolveUD(ctx, "10.0.0.2:7174", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ResolveUD: %v", err)
	}
}
