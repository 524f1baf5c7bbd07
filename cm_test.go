package goroce_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// Tests of the RDMA CM as a program uses it: Dial, Listen, Accept, Close, on devices of one
// MemNetwork, both on the RoCEv2 port as rdma_cm peers are.

var (
	cmAddrA = netip.MustParseAddr("10.0.0.1")
	cmAddrB = netip.MustParseAddr("10.0.0.2")
)

// cmPair is a client and a server device on one MemNetwork.
type cmPair struct {
	net    *goroce.MemNetwork
	client *goroce.Device
	server *goroce.Device
}

func newCMPair(t testing.TB, cfg goroce.Config) *cmPair {
	t.Helper()
	p := &cmPair{net: goroce.NewMemNetwork()}
	open := func(a netip.Addr) *goroce.Device {
		c := cfg
		c.Addr, c.Port, c.Network = a, goroce.DefaultPort, p.net
		d, err := goroce.Open(c)
		ok(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	p.client, p.server = open(cmAddrA), open(cmAddrB)
	return p
}

func cmCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// accepted runs l.Accept in the background.
func accepted(ctx context.Context, l *goroce.Listener) <-chan acceptResult {
	ch := make(chan acceptResult, 1)
	go func() {
		c, err := l.Accept(ctx)
		ch <- acceptResult{c, err}
	}()
	return ch
}

type acceptResult struct {
	c   *goroce.Conn
	err error
}

// connect dials the server's listener and accepts, with opts for both sides.
func (p *cmPair) connect(t testing.TB, ctx context.Context, l *goroce.Listener, opts *goroce.CMOptions) (client, server *goroce.Conn) {
	t.Helper()
	acc := accepted(ctx, l)
	c, err := p.client.Dial(ctx, l.Addr().String(), opts)
	ok(t, err)
	a := <-acc
	ok(t, a.err)
	return c, a.c
}

// TestCMConnect: Dial reaches a Listener; both sides get a connected RC QP with its CQs and the peer's
// private data and addresses; SEND, WRITE and READ move data both ways; Close from the client reaches
// the server as ErrDisconnected with its receive flushed; the counters show one connection each way.
func TestCMConnect(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	so := goroce.DefaultCMOptions()
	so.PrivateData = []byte("welcome")
	l, err := p.server.Listen(7471, &so)
	ok(t, err)
	if l.Addr() != netip.AddrPortFrom(cmAddrB, 7471) {
		t.Fatalf("listener address %v", l.Addr())
	}
	co := goroce.DefaultCMOptions()
	co.PrivateData = []byte("hello")
	c, s := p.connect(t, ctx, l, &co)

	if !bytes.HasPrefix(s.PrivateData(), []byte("hello")) || len(s.PrivateData()) != 56 {
		t.Errorf("server got private data %q", s.PrivateData())
	}
	if !bytes.HasPrefix(c.PrivateData(), []byte("welcome")) || len(c.PrivateData()) != 196 {
		t.Errorf("client got private data %q", c.PrivateData())
	}
	if s.RemoteAddr() != c.LocalAddr() || c.RemoteAddr() != l.Addr() || s.LocalAddr() != l.Addr() {
		t.Errorf("addresses: client %v -> %v, server %v <- %v", c.LocalAddr(), c.RemoteAddr(), s.LocalAddr(), s.RemoteAddr())
	}
	for _, q := range []*goroce.QP{c.QP(), s.QP()} {
		if q.State() != goroce.StateRTS || q.Type() != goroce.RC {
			t.Fatalf("QP %v in %v", q.Type(), q.State())
		}
	}
	ca, sa := c.QP().Query(), s.QP().Query()
	if ca.DestQPN != s.QP().QPN() || sa.DestQPN != c.QP().QPN() || ca.SQPSN != sa.RQPSN || sa.SQPSN != ca.RQPSN {
		t.Fatalf("QPs not joined: client %+v, server %+v", ca, sa)
	}
	if ca.MaxRdAtomic != 16 || ca.MaxDestRdAtomic != 16 || ca.PathMTU != goroce.MTU4096 {
		t.Errorf("client attributes %+v", ca)
	}

	// SEND from the client, WRITE and READ from the server.
	cbuf, err := c.PD().AllocMR(4096, goroce.LocalWrite|goroce.RemoteWrite|goroce.RemoteRead)
	ok(t, err)
	sbuf, err := s.PD().AllocMR(4096, goroce.LocalWrite)
	ok(t, err)
	ok(t, s.QP().PostRecv(&goroce.RecvWR{WRID: 1, SGL: []goroce.SGE{sbuf.SGE(0, 64)}}))
	ok(t, c.QP().PostSend(&goroce.SendWR{WRID: 2, Opcode: goroce.WRSend, Flags: goroce.Signaled | goroce.Inline,
		InlineData: []byte("ping")}))
	if wc := waitOne(t, s.RecvCQ()); wc.Err() != nil || wc.ByteLen != 4 || string(sbuf.Bytes()[:4]) != "ping" {
		t.Fatalf("server receive %#v", wc)
	}
	if wc := waitOne(t, c.SendCQ()); wc.Err() != nil {
		t.Fatalf("client send %#v", wc)
	}
	copy(sbuf.Bytes()[100:], "pong")
	ok(t, s.QP().PostSend(&goroce.SendWR{WRID: 3, Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
		SGL: []goroce.SGE{sbuf.SGE(100, 4)}, RemoteAddr: cbuf.Addr(), RKey: cbuf.RKey()}))
	if wc := waitOne(t, s.SendCQ()); wc.Err() != nil {
		t.Fatalf("server WRITE %#v", wc)
	}
	copy(cbuf.Bytes()[8:], "back")
	ok(t, s.QP().PostSend(&goroce.SendWR{WRID: 4, Opcode: goroce.WRRDMARead, Flags: goroce.Signaled,
		SGL: []goroce.SGE{sbuf.SGE(200, 4)}, RemoteAddr: cbuf.Addr() + 8, RKey: cbuf.RKey()}))
	if wc := waitOne(t, s.SendCQ()); wc.Err() != nil || string(sbuf.Bytes()[200:204]) != "back" {
		t.Fatalf("server READ %#v", wc)
	}
	if string(cbuf.Bytes()[:4]) != "pong" {
		t.Fatalf("client buffer %q", cbuf.Bytes()[:4])
	}

	// The client disconnects: the server hears it, and its posted receive is flushed.
	ok(t, s.QP().PostRecv(&goroce.RecvWR{WRID: 5, SGL: []goroce.SGE{sbuf.SGE(0, 64)}}))
	ok(t, cbuf.Close())
	ok(t, c.Close())
	ok(t, c.Close())
	if !errors.Is(c.Err(), goroce.ErrClosed) {
		t.Errorf("client Err %v after Close", c.Err())
	}
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("the server never heard the DREQ")
	}
	if !errors.Is(s.Err(), goroce.ErrDisconnected) {
		t.Errorf("server Err %v", s.Err())
	}
	if wc := waitOne(t, s.RecvCQ()); !errors.Is(wc.Err(), goroce.ErrFlushed) || wc.WRID != 5 {
		t.Errorf("the server's receive after the DREQ: %#v", wc)
	}
	ok(t, sbuf.Close())
	ok(t, s.Close())
	ok(t, l.Close())
	for _, d := range []*goroce.Device{p.client, p.server} {
		st := d.Stats()
		if st.CM.Established != 1 || st.RxMADs == 0 || st.TxMADs == 0 || st.CM.Dropped != 0 || st.DropGSI != 0 {
			t.Errorf("stats %+v", st.CM)
		}
	}
	if n := p.client.Stats().CM.Sent; n[0] != 1 || n[4] != 1 || n[5] != 1 {
		t.Errorf("client sent REQ %d, RTU %d, DREQ %d; want one of each", n[0], n[4], n[5])
	}
	if n := p.server.Stats().CM.Sent; n[3] != 1 || n[6] != 1 {
		t.Errorf("server sent REP %d, DREP %d; want one of each", n[3], n[6])
	}
}

// TestCMServerClosesFirst: the passive side disconnects; the active side's Done closes with
// ErrDisconnected and its QP's outstanding receive completes flushed.
func TestCMServerClosesFirst(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	l, err := p.server.Listen(0, nil)
	ok(t, err)
	c, s := p.connect(t, ctx, l, nil)
	buf, err := c.PD().AllocMR(64, goroce.LocalWrite)
	ok(t, err)
	ok(t, c.QP().PostRecv(&goroce.RecvWR{WRID: 9, SGL: []goroce.SGE{buf.SGE(0, 64)}}))
	ok(t, s.Close())
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("the client never heard the DREQ")
	}
	if !errors.Is(c.Err(), goroce.ErrDisconnected) {
		t.Errorf("client Err %v", c.Err())
	}
	if wc := waitOne(t, c.RecvCQ()); !errors.Is(wc.Err(), goroce.ErrFlushed) || wc.WRID != 9 {
		t.Errorf("receive %#v", wc)
	}
	ok(t, buf.Close())
	ok(t, c.Close())
}

// TestCMReject: a listener that refuses: the dialer gets ErrConnRefused as a *RejectError with the
// reason (consumer reject) and the private data rdma_reject sent.
func TestCMReject(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	l, err := p.server.Listen(7000, nil)
	ok(t, err)
	answered := make(chan struct{})
	defer func() { <-answered }() // before the devices close: the answers after the REJ must meet ErrBadState
	go func() {
		defer close(answered)
		r, err := l.Request(ctx)
		if err != nil {
			return
		}
		if !bytes.HasPrefix(r.PrivateData(), []byte("may I")) || r.RemoteAddr().Addr() != cmAddrA {
			t.Errorf("request %q from %v", r.PrivateData(), r.RemoteAddr())
		}
		_ = r.Reject([]byte("no, thanks"))
		if err := r.Reject(nil); !errors.Is(err, goroce.ErrBadState) {
			t.Errorf("second answer: %v", err)
		}
		if _, err := r.Accept(ctx, nil); !errors.Is(err, goroce.ErrBadState) {
			t.Errorf("accept after reject: %v", err)
		}
	}()
	o := goroce.DefaultCMOptions()
	o.PrivateData = []byte("may I")
	_, err = p.client.Dial(ctx, "10.0.0.2:7000", &o)
	var rej *goroce.RejectError
	if !errors.Is(err, goroce.ErrConnRefused) || !errors.As(err, &rej) || rej.Reason != goroce.RejectConsumer ||
		!bytes.HasPrefix(rej.PrivateData, []byte("no, thanks")) {
		t.Fatalf("Dial: %v (%+v)", err, rej)
	}
	if st := p.client.Stats(); st.CM.RejectsRcvd[goroce.RejectConsumer] != 1 {
		t.Errorf("client stats %+v", st.CM)
	}
}

// TestCMNoListener: a port nobody listens on is refused with invalid service ID, as a TCP port with
// no listener is refused; the client's QP and CQ are gone again.
func TestCMNoListener(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	_, err := p.client.Dial(ctx, "10.0.0.2:1234", nil)
	var rej *goroce.RejectError
	if !errors.Is(err, goroce.ErrConnRefused) || !errors.As(err, &rej) || rej.Reason != goroce.RejectInvalidServiceID {
		t.Fatalf("Dial: %v", err)
	}
	// A listener closed refuses too.
	l, err := p.server.Listen(1235, nil)
	ok(t, err)
	ok(t, l.Close())
	if _, err := l.Accept(ctx); !errors.Is(err, goroce.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
	_, err = p.client.Dial(ctx, "10.0.0.2:1235", nil)
	if !errors.As(err, &rej) || rej.Reason != goroce.RejectInvalidServiceID {
		t.Fatalf("Dial to a closed listener: %v", err)
	}
	if _, err := p.server.Listen(1236, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := p.server.Listen(1236, nil); err == nil {
		t.Error("two listeners on one port")
	}
}

// TestCMDialContext: a peer that never answers: Dial ends with the context's error, and the attempt is
// abandoned (the CM holds no connection and no timer runs for it).
func TestCMDialContext(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.client.Dial(ctx, "10.0.0.9:7471", nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Dial took %v", d)
	}
	if st := p.client.Stats(); st.CM.Sent[0] != 1 || st.CM.RejectsSent[goroce.RejectTimeout] != 1 {
		t.Errorf("stats: REQ sent %d, REJ timeout %d; want 1 and 1 (the abandoned attempt)", st.CM.Sent[0],
			st.CM.RejectsSent[goroce.RejectTimeout])
	}
}

// TestCMUnreachable: on a manual clock, a REQ nobody answers is resent 15 times, 6.4 s apart (rdma_cm's
// timeouts), and Dial then fails with ErrUnreachable, which matches os.ErrDeadlineExceeded.
func TestCMUnreachable(t *testing.T) {
	clock := goroce.NewManualClock(time.Unix(1e6, 0))
	p := newCMPair(t, goroce.Config{Clock: clock})
	done := make(chan error, 1)
	go func() {
		_, err := p.client.Dial(context.Background(), "10.0.0.9:7471", nil)
		done <- err
	}()
	for i := 0; ; i++ {
		select {
		case err := <-done:
			if !errors.Is(err, goroce.ErrUnreachable) || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Dial: %v", err)
			}
			st := p.client.Stats().CM
			if st.Sent[0] != 16 || st.Retries[0] != 15 || st.Unreachable != 1 {
				t.Errorf("REQs %d, retries %d, unreachable %d; want 16, 15, 1", st.Sent[0], st.Retries[0], st.Unreachable)
			}
			if i < 100 {
				t.Errorf("gave up after %d s", i)
			}
			return
		case <-time.After(time.Millisecond):
			if p.client.Stats().CM.Sent[0] == 0 {
				continue // the REQ has not left yet
			}
			clock.Advance(time.Second)
			if i > 1000 {
				t.Fatal("Dial never gave up")
			}
		}
	}
}

// TestCMSeveral: several connections at once to one listener, each moving its own data; the counters
// add up.
func TestCMSeveral(t *testing.T) {
	const n = 8
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	l, err := p.server.Listen(7471, nil)
	ok(t, err)
	servers := make(chan *goroce.Conn, n)
	go func() {
		for range n {
			c, err := l.Accept(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			servers <- c
		}
	}()
	var wg sync.WaitGroup
	clients := make([]*goroce.Conn, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := goroce.DefaultCMOptions()
			o.PrivateData = []byte{byte(i)}
			c, err := p.client.Dial(ctx, "10.0.0.2:7471", &o)
			if err != nil {
				t.Error(err)
				return
			}
			clients[i] = c
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	byID := map[byte]*goroce.Conn{}
	for range n {
		s := <-servers
		byID[s.PrivateData()[0]] = s
	}
	for i, c := range clients {
		s := byID[byte(i)]
		buf, err := s.PD().AllocMR(64, goroce.LocalWrite)
		ok(t, err)
		ok(t, s.QP().PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{buf.SGE(0, 64)}}))
		msg := fmt.Sprintf("conn %d", i)
		ok(t, c.QP().PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: []byte(msg)}))
		if wc := waitOne(t, s.RecvCQ()); wc.Err() != nil || string(buf.Bytes()[:wc.ByteLen]) != msg {
			t.Fatalf("connection %d got %q", i, buf.Bytes()[:wc.ByteLen])
		}
		ok(t, buf.Close())
	}
	for i, c := range clients {
		ok(t, c.Close())
		<-byID[byte(i)].Done()
		ok(t, byID[byte(i)].Close())
	}
	if a, b := p.client.Stats().CM, p.server.Stats().CM; a.Established != n || b.Established != n {
		t.Errorf("established %d and %d, want %d", a.Established, b.Established, n)
	}
}

// TestCMPeerVanishes: the server disappears without a word (every packet it sends is lost from then on,
// and it closes): the client's next SEND fails after its retries, its Close returns at once although
// the DREQ is never answered, and Done is closed.
func TestCMPeerVanishes(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	l, err := p.server.Listen(0, nil)
	ok(t, err)
	o := goroce.DefaultCMOptions()
	o.Timeout, o.RetryCount = 8, 1 // 1 ms ACK timeout, one retry
	c, _ := p.connect(t, ctx, l, &o)
	ok(t, p.net.Impair(goroce.Impairment{Loss: 1, From: cmAddrB}))
	ok(t, p.server.Close())
	ok(t, c.QP().PostSend(&goroce.SendWR{WRID: 1, Opcode: goroce.WRSend, Flags: goroce.Signaled | goroce.Inline,
		InlineData: []byte("anyone?")}))
	if wc := waitOne(t, c.SendCQ()); !errors.Is(wc.Err(), goroce.ErrRetryExceeded) {
		t.Fatalf("SEND to a vanished peer: %#v", wc)
	}
	start := time.Now()
	ok(t, c.Close())
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done is open after Close")
	}
}

// TestCMDialBadInput: addresses and options Dial refuses before sending anything.
func TestCMDialBadInput(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	long := goroce.DefaultCMOptions()
	long.PrivateData = make([]byte, 57)
	for _, tc := range []struct {
		addr string
		opts *goroce.CMOptions
	}{
		{"10.0.0.2", nil}, {"10.0.0.2:0", nil}, {"10.0.0.2:70000", nil}, {"[fe80::1]:7471", nil},
		{"10.0.0.2:7471", &long}, {"no such host.invalid:7471", nil},
	} {
		if _, err := p.client.Dial(ctx, tc.addr, tc.opts); !errors.Is(err, goroce.ErrBadConfig) {
			t.Errorf("Dial(%q): %v, want ErrBadConfig", tc.addr, err)
		}
	}
	if st := p.client.Stats(); st.TxMADs != 0 {
		t.Errorf("%d MADs sent", st.TxMADs)
	}
}

// TestCMOwnQP: a QP of the program's, with a receive posted in INIT before Dial, takes the server's
// first SEND; Close leaves it to the program, in the error state.
func TestCMOwnQP(t *testing.T) {
	p := newCMPair(t, goroce.Config{})
	ctx := cmCtx(t)
	l, err := p.server.Listen(0, nil)
	ok(t, err)
	pd, _ := p.client.AllocPD()
	cq, _ := p.client.CreateCQ(16)
	q, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
	ok(t, err)
	ok(t, q.Init())
	buf, _ := pd.AllocMR(64, goroce.LocalWrite)
	ok(t, q.PostRecv(&goroce.RecvWR{WRID: 1, SGL: []goroce.SGE{buf.SGE(0, 64)}}))
	o := goroce.DefaultCMOptions()
	o.QP = q
	c, s := p.connect(t, ctx, l, &o)
	if c.QP() != q || c.PD() != pd || c.RecvCQ() != cq {
		t.Fatal("the connection does not use the program's QP")
	}
	ok(t, s.QP().PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: []byte("first")}))
	if wc := waitOne(t, cq); wc.Err() != nil || string(buf.Bytes()[:5]) != "first" {
		t.Fatalf("receive %#v", wc)
	}
	ok(t, c.Close())
	if q.State() != goroce.StateErr {
		t.Errorf("the program's QP is in %v after Close", q.State())
	}
	ok(t, q.Close())
	o.QP = q
	if _, err := p.client.Dial(ctx, l.Addr().String(), &o); !errors.Is(err, goroce.ErrBadState) {
		t.Errorf("Dial with a QP in ERR: %v", err)
	}
	ok(t, s.Close())
}

// fastClock returns a manual clock that a goroutine moves 50 ms every real millisecond until the test
// ends: the CM's and the QPs' timeouts of seconds pass in tens of milliseconds.
func fastClock(t testing.TB) *goroce.ManualClock {
	clock := goroce.NewManualClock(time.Unix(1e6, 0))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				clock.Advance(50 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return clock
}

// TestCMLoss: connections set up, used and torn down with a tenth of all packets lost each way,
// MADs included: the CM's resends recover. Time runs fast.
func TestCMLoss(t *testing.T) {
	p := newCMPair(t, goroce.Config{Clock: fastClock(t)})
	ok(t, p.net.Impair(goroce.Impairment{Loss: 0.1, Seed: 7}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := p.server.Listen(7471, nil)
	ok(t, err)
	for i := range 20 {
		c, s := p.connect(t, ctx, l, nil)
		buf, _ := s.PD().AllocMR(64, goroce.LocalWrite)
		ok(t, s.QP().PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{buf.SGE(0, 64)}}))
		ok(t, c.QP().PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: []byte{byte(i)}}))
		if wc := waitOne(t, s.RecvCQ()); wc.Err() != nil {
			t.Fatal(wc.Err())
		}
		ok(t, buf.Close())
		ok(t, c.Close())
		select {
		case <-s.Done():
		case <-ctx.Done():
			t.Fatal("no DREQ")
		}
		ok(t, s.Close())
	}
	a, b := p.client.Stats().CM, p.server.Stats().CM
	var retries uint64
	for i := range a.Retries {
		retries += a.Retries[i] + b.Retries[i]
	}
	if a.Established != 20 || b.Established != 20 || retries == 0 {
		t.Errorf("established %d and %d, %d CM resends: want 20, 20 and some", a.Established, b.Established, retries)
	}
	t.Logf("lost %d datagrams; CM resends: client %v, server %v", p.net.Stats().Dropped, a.Retries, b.Retries)
}
