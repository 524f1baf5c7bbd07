package goroce_test

// Tests of the API as a program sees it: one import, the in-memory network, errors that match, events,
// and misuse that gets an error instead of a crash. Each misuse issue 13 lists has a test here.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// apiPair is two devices on a MemNetwork with one connected RC QP each, every CQ of 64 entries.
type apiPair struct {
	net        *goroce.MemNetwork
	a, b       *goroce.Device
	pda, pdb   *goroce.PD
	cqa, cqb   *goroce.CQ
	qpa, qpb   *goroce.QP
	srca, dstb *goroce.MR
}

func ok(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newAPIPair opens the pair; opts (nil: the defaults) connects both QPs.
func newAPIPair(t testing.TB, opts *goroce.ConnectOptions) *apiPair {
	t.Helper()
	p := &apiPair{net: goroce.NewMemNetwork()}
	var err error
	p.a, err = goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.1"), Network: p.net})
	ok(t, err)
	t.Cleanup(func() { p.a.Close() })
	p.b, err = goroce.Open(goroce.Config{Addr: netip.MustParseAddr("10.0.0.2"), Network: p.net})
	ok(t, err)
	t.Cleanup(func() { p.b.Close() })
	p.pda, _ = p.a.AllocPD()
	p.pdb, _ = p.b.AllocPD()
	p.cqa, _ = p.a.CreateCQ(64)
	p.cqb, _ = p.b.CreateCQ(64)
	p.qpa, err = p.pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cqa, RecvCQ: p.cqa})
	ok(t, err)
	p.qpb, err = p.pdb.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cqb, RecvCQ: p.cqb})
	ok(t, err)
	ok(t, p.qpa.Connect(p.qpb.Endpoint(), opts))
	ok(t, p.qpb.Connect(p.qpa.Endpoint(), opts))
	p.srca, err = p.pda.AllocMR(1<<16, goroce.LocalWrite)
	ok(t, err)
	p.dstb, err = p.pdb.AllocMR(1<<16, goroce.LocalWrite|goroce.RemoteWrite|goroce.RemoteRead|goroce.RemoteAtomic)
	ok(t, err)
	return p
}

// waitOne waits up to 10 s for one completion.
func waitOne(t testing.TB, cq *goroce.CQ) goroce.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]goroce.Completion, 1)
	if _, err := cq.Wait(ctx, wc); err != nil {
		t.Fatalf("waiting for a completion: %v", err)
	}
	return wc[0]
}

// waitEvent waits up to 10 s for an event of type typ, skipping others.
func waitEvent(t testing.TB, d *goroce.Device, typ goroce.EventType) goroce.AsyncEvent {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e := <-d.Events():
			if e.Type == typ {
				return e
			}
		case <-timeout:
			t.Fatalf("no %v event", typ)
		}
	}
}

// A failed work request's Completion.Err matches its status's error, and a fatal error reaches the
// event stream.
func TestCompletionErrAndQPFatal(t *testing.T) {
	p := newAPIPair(t, nil)
	ok(t, p.qpa.PostSend(&goroce.SendWR{WRID: 7, Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
		SGL: []goroce.SGE{p.srca.SGE(0, 64)}, RemoteAddr: p.dstb.Addr(), RKey: p.dstb.RKey() + 1}))
	wc := waitOne(t, p.cqa)
	err := wc.Err()
	if !errors.Is(err, goroce.ErrRemoteAccess) {
		t.Fatalf("WRITE with a bad rkey: %#v, Err %v", wc, err)
	}
	var wce *goroce.WCError
	if !errors.As(err, &wce) || wce.WRID != 7 || wce.QPN != p.qpa.QPN() || wce.Status != goroce.StatusRemAccessErr {
		t.Fatalf("WCError %+v", wce)
	}
	if !strings.HasPrefix(err.Error(), "goroce: ") {
		t.Errorf("error text %q", err)
	}
	if e := waitEvent(t, p.a, goroce.EventQPFatal); e.QP != p.qpa {
		t.Fatalf("event %v for another QP", e)
	}
	if p.qpa.State() != goroce.StateErr {
		t.Fatalf("state %v", p.qpa.State())
	}
	if (&goroce.Completion{}).Err() != nil {
		t.Fatal("a successful completion has an error")
	}
}

// A CQ too small for its completions says so: EventCQError for it, Overflowed, and its QP fails.
func TestCQOverflowEvent(t *testing.T) {
	p := newAPIPair(t, nil)
	small, _ := p.b.CreateCQ(1)
	q, err := p.pdb.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: small, RecvCQ: small})
	ok(t, err)
	qa, err := p.pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cqa, RecvCQ: p.cqa})
	ok(t, err)
	ok(t, q.Connect(qa.Endpoint(), nil))
	ok(t, qa.Connect(q.Endpoint(), nil))
	recv, _ := p.pdb.AllocMR(64, goroce.LocalWrite)
	ok(t, q.PostRecv(&goroce.RecvWR{WRID: 1, SGL: []goroce.SGE{recv.SGE(0, 32)}},
		&goroce.RecvWR{WRID: 2, SGL: []goroce.SGE{recv.SGE(32, 32)}}))
	ok(t, qa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, InlineData: []byte("one"), Flags: goroce.Inline},
		&goroce.SendWR{Opcode: goroce.WRSend, InlineData: []byte("two"), Flags: goroce.Inline}))
	e := waitEvent(t, p.b, goroce.EventCQError)
	if e.CQ != small || e.QP != q {
		t.Fatalf("event %v: CQ %p QP %p", e, e.CQ, e.QP)
	}
	if !small.Overflowed() || p.cqb.Overflowed() {
		t.Fatal("Overflowed does not tell which CQ overflowed")
	}
	waitEvent(t, p.b, goroce.EventQPFatal)
}

// SRQ events: the limit, once armed, and the last WQE of a QP on the SRQ leaving.
func TestSRQEvents(t *testing.T) {
	p := newAPIPair(t, nil)
	srq, err := p.pdb.CreateSRQ(16, 1)
	ok(t, err)
	recv, _ := p.pdb.AllocMR(16*64, goroce.LocalWrite)
	for i := range 4 {
		ok(t, srq.PostRecv(&goroce.RecvWR{WRID: uint64(i), SGL: []goroce.SGE{recv.SGE(i*64, 64)}}))
	}
	srq.SetLimit(4) // fewer than 4 left: the first receive taken fires it
	q, err := p.pdb.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cqb, RecvCQ: p.cqb, SRQ: srq})
	ok(t, err)
	qa, err := p.pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cqa, RecvCQ: p.cqa})
	ok(t, err)
	ok(t, q.Connect(qa.Endpoint(), nil))
	ok(t, qa.Connect(q.Endpoint(), nil))
	if err := q.PostRecv(&goroce.RecvWR{}); !errors.Is(err, goroce.ErrBadWR) {
		t.Errorf("PostRecv on a QP with an SRQ: %v", err)
	}
	ok(t, qa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: []byte("x")}))
	if e := waitEvent(t, p.b, goroce.EventSRQLimitReached); e.SRQ != srq {
		t.Fatalf("event %v", e)
	}
	if wc := waitOne(t, p.cqb); wc.Err() != nil || srq.Len() != 3 {
		t.Fatalf("%#v, %d left", wc, srq.Len())
	}
	ok(t, q.Close())
	if e := waitEvent(t, p.b, goroce.EventQPLastWQEReached); e.QP != q {
		t.Fatalf("event %v", e)
	}
}

// The old spin: Wait with no room for a completion returns at once with ErrNoRoom, also with a
// completion queued.
func TestWaitWithoutRoom(t *testing.T) {
	p := newAPIPair(t, nil)
	ok(t, p.qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
		SGL: []goroce.SGE{p.srca.SGE(0, 8)}, RemoteAddr: p.dstb.Addr(), RKey: p.dstb.RKey()}))
	for _, wc := range [][]goroce.Completion{nil, {}} {
		if n, err := p.cqa.Wait(context.Background(), wc); n != 0 || !errors.Is(err, goroce.ErrNoRoom) {
			t.Fatalf("Wait(%v): %d, %v", wc, n, err)
		}
		if n, err := p.cqa.WaitSolicited(context.Background(), wc); n != 0 || !errors.Is(err, goroce.ErrNoRoom) {
			t.Fatalf("WaitSolicited(%v): %d, %v", wc, n, err)
		}
	}
	if wc := waitOne(t, p.cqa); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
}

// Wait returns ctx's error when it ends, and ErrClosed when the device closes under it.
func TestWaitEnds(t *testing.T) {
	p := newAPIPair(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.cqa.Wait(ctx, make([]goroce.Completion, 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: %v", err)
	}
	done := make(chan error)
	go func() {
		_, err := p.cqb.Wait(context.Background(), make([]goroce.Completion, 1))
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	p.b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, goroce.ErrClosed) {
			t.Fatalf("Wait on a closed device: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait outlived its device")
	}
}

// WaitSolicited wakes for a SEND with the Solicited flag and not for one without.
func TestWaitSolicited(t *testing.T) {
	p := newAPIPair(t, nil)
	recv, _ := p.pdb.AllocMR(128, goroce.LocalWrite)
	ok(t, p.qpb.PostRecv(&goroce.RecvWR{WRID: 1, SGL: []goroce.SGE{recv.SGE(0, 64)}},
		&goroce.RecvWR{WRID: 2, SGL: []goroce.SGE{recv.SGE(64, 64)}}))
	got := make(chan int, 1)
	go func() {
		wc := make([]goroce.Completion, 4)
		n, _ := p.cqb.WaitSolicited(context.Background(), wc)
		got <- n
	}()
	time.Sleep(10 * time.Millisecond) // the waiter arms first, as ibv_req_notify_cq comes before the event
	ok(t, p.qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline | goroce.Signaled, InlineData: []byte("plain")}))
	waitOne(t, p.cqa)
	select {
	case n := <-got:
		t.Fatalf("a SEND without Solicited ended a solicited wait with %d completions", n)
	case <-time.After(50 * time.Millisecond):
	}
	ok(t, p.qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline | goroce.Solicited, InlineData: []byte("wake")}))
	select {
	case n := <-got:
		if n != 2 {
			t.Fatalf("solicited wait polled %d completions, want both receives", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a solicited SEND did not end the wait")
	}
}

// SGEs are checked when posted: outside the region, a wrong key, a region without the rights the
// operation needs, another PD's region.
func TestSGEChecksAtPost(t *testing.T) {
	p := newAPIPair(t, nil)
	ro, _ := p.pda.AllocMR(64, 0)
	other, _ := p.a.AllocPD()
	foreign, _ := other.AllocMR(64, goroce.LocalWrite)
	write := func(sge goroce.SGE) *goroce.SendWR {
		return &goroce.SendWR{Opcode: goroce.WRRDMAWrite, SGL: []goroce.SGE{sge}, RemoteAddr: p.dstb.Addr(), RKey: p.dstb.RKey()}
	}
	cases := []struct {
		name string
		wr   *goroce.SendWR
	}{
		{"past the end", write(p.srca.SGE(1<<16-8, 16))},
		{"before the start", write(goroce.SGE{Addr: p.srca.Addr() - 1, Length: 8, LKey: p.srca.LKey()})},
		{"unknown lkey", write(goroce.SGE{Addr: p.srca.Addr(), Length: 8, LKey: p.srca.LKey() + 1})},
		{"another PD", write(foreign.SGE(0, 8))},
		{"READ into a read-only region", &goroce.SendWR{Opcode: goroce.WRRDMARead, SGL: []goroce.SGE{ro.SGE(0, 8)},
			RemoteAddr: p.dstb.Addr(), RKey: p.dstb.RKey()}},
	}
	for _, c := range cases {
		err := p.qpa.PostSend(c.wr)
		var pe *goroce.PostError
		if !errors.Is(err, goroce.ErrBadSGE) || !errors.As(err, &pe) || pe.Index != 0 {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if err := p.qpb.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{ro.SGE(0, 8)}}); !errors.Is(err, goroce.ErrBadSGE) {
		t.Errorf("receive into another device's region: %v", err)
	}
	if c := p.qpa.Counters(); c.SentPkts != 0 {
		t.Errorf("refused requests sent %d packets", c.SentPkts)
	}
	if p.qpa.State() != goroce.StateRTS {
		t.Errorf("a refused post moved the QP to %v", p.qpa.State())
	}
}

// PostSend of a list posts in order up to the first bad request and says which one it was.
func TestPostList(t *testing.T) {
	p := newAPIPair(t, nil)
	wr := func(id uint64, off int) *goroce.SendWR {
		return &goroce.SendWR{WRID: id, Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled, SGL: []goroce.SGE{p.srca.SGE(off, 8)},
			RemoteAddr: p.dstb.Addr() + uint64(off), RKey: p.dstb.RKey()}
	}
	err := p.qpa.PostSend(wr(1, 0), wr(2, 8), wr(3, 1<<20), wr(4, 16))
	var pe *goroce.PostError
	if !errors.As(err, &pe) || pe.Index != 2 || !errors.Is(err, goroce.ErrBadSGE) {
		t.Fatalf("PostSend: %v", err)
	}
	for want := uint64(1); want <= 2; want++ {
		if wc := waitOne(t, p.cqa); wc.WRID != want || wc.Err() != nil {
			t.Fatalf("completion %#v, want WRID %d", wc, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if n, _ := p.cqa.Wait(ctx, make([]goroce.Completion, 4)); n != 0 {
		t.Fatal("requests after the bad one were posted")
	}
}

// Every Close is idempotent, on every object, before and after the device closes.
func TestCloseTwice(t *testing.T) {
	p := newAPIPair(t, nil)
	srq, _ := p.pdb.CreateSRQ(4, 1)
	for _, c := range []interface{ Close() error }{p.qpa, p.srca, srq, p.qpa, p.srca, srq} {
		if err := c.Close(); err != nil {
			t.Fatalf("%T.Close: %v", c, err)
		}
	}
	ok(t, p.a.Close())
	for _, c := range []interface{ Close() error }{p.cqa, p.pda, p.a, p.cqa, p.pda, p.a} {
		if err := c.Close(); err != nil {
			t.Fatalf("%T.Close after the device: %v", c, err)
		}
	}
	if _, ok := <-p.a.Events(); ok {
		t.Fatal("Events still open after Close")
	}
}

// Using an object after Close gets ErrClosed, never a crash.
func TestUseAfterClose(t *testing.T) {
	p := newAPIPair(t, nil)
	m, _ := p.pda.AllocMR(4096, goroce.LocalWrite)
	ok(t, m.Close())
	b := m.Bytes()
	for i := range b { // the memory stays the program's: no SIGSEGV
		b[i] = byte(i)
	}
	if err := p.qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMAWrite, SGL: []goroce.SGE{m.SGE(0, 8)},
		RemoteAddr: p.dstb.Addr(), RKey: p.dstb.RKey()}); !errors.Is(err, goroce.ErrBadSGE) {
		t.Fatalf("post with a closed region's key: %v", err)
	}
	ok(t, p.qpa.Close())
	if err := p.qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend}); !errors.Is(err, goroce.ErrClosed) {
		t.Fatalf("PostSend on a closed QP: %v", err)
	}
	if err := p.qpa.PostRecv(&goroce.RecvWR{}); !errors.Is(err, goroce.ErrClosed) {
		t.Fatalf("PostRecv on a closed QP: %v", err)
	}
	if err := p.qpa.Connect(p.qpb.Endpoint(), nil); !errors.Is(err, goroce.ErrClosed) {
		t.Fatalf("Connect on a closed QP: %v", err)
	}
	ok(t, p.srca.Close())
	ok(t, p.pda.Close())
	if _, err := p.pda.AllocMR(64, goroce.LocalWrite); !errors.Is(err, goroce.ErrClosed) {
		t.Fatalf("AllocMR on a closed PD: %v", err)
	}
	if _, err := p.pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cqa, RecvCQ: p.cqa}); !errors.Is(err, goroce.ErrClosed) {
		t.Fatalf("CreateQP on a closed PD: %v", err)
	}
	ok(t, p.cqa.Close())
	if _, err := p.cqa.Wait(context.Background(), make([]goroce.Completion, 1)); !errors.Is(err, goroce.ErrClosed) {
		t.Fatalf("Wait on a closed CQ: %v", err)
	}
}

// A busy address gives an error that names goroce and matches the socket's errno.
func TestOpenBusyAddress(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	a, err := goroce.Open(goroce.Config{Addr: addr})
	ok(t, err)
	defer a.Close()
	_, err = goroce.Open(goroce.Config{Addr: addr, Port: a.LocalAddr().Port()})
	if err == nil || !errors.Is(err, syscall.EADDRINUSE) || !strings.HasPrefix(err.Error(), "goroce: ") ||
		strings.Contains(err.Error(), "conn:") {
		t.Fatalf("Open on a busy address: %v", err)
	}
}

// Port 0 gives each device a port of its own, so two devices on one IP address talk: the Endpoint
// carries the port.
func TestTwoDevicesOneAddress(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	a, err := goroce.Open(goroce.Config{Addr: addr})
	ok(t, err)
	defer a.Close()
	b, err := goroce.Open(goroce.Config{Addr: addr})
	ok(t, err)
	defer b.Close()
	if a.LocalAddr().Port() == 0 || a.LocalAddr() == b.LocalAddr() {
		t.Fatalf("ports %v %v", a.LocalAddr(), b.LocalAddr())
	}
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	cqa, _ := a.CreateCQ(8)
	cqb, _ := b.CreateCQ(8)
	qa, err := pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqa, RecvCQ: cqa})
	ok(t, err)
	qb, err := pdb.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqb, RecvCQ: cqb})
	ok(t, err)
	ea, eb := qa.Endpoint(), qb.Endpoint()
	if eb.Port != b.LocalAddr().Port() || eb.MTU != goroce.MTU4096 {
		t.Fatalf("endpoint %v of a device on %v", eb, b.LocalAddr())
	}
	ok(t, qa.Connect(eb, nil))
	ok(t, qb.Connect(ea, nil))
	if mtu := qa.Query().PathMTU; mtu != goroce.MTU4096 {
		t.Errorf("path MTU %v on loopback, want 4096", mtu)
	}
	src, _ := pda.RegMR([]byte("same address, another port"), goroce.LocalWrite)
	dst, _ := pdb.AllocMR(64, goroce.LocalWrite|goroce.RemoteWrite)
	// The receiver learns of the data from its own completion, as an RDMA program does: WRITE with
	// immediate consumes a receive.
	ok(t, qb.PostRecv(&goroce.RecvWR{WRID: 1}))
	ok(t, qa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMAWriteImm, Flags: goroce.Signaled, SGL: []goroce.SGE{src.SGE(0, 26)},
		RemoteAddr: dst.Addr(), RKey: dst.RKey(), Imm: 26}))
	if wc := waitOne(t, cqa); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	if wc := waitOne(t, cqb); wc.Err() != nil || wc.Imm != 26 || wc.Opcode != goroce.CompRecvRDMAWithImm {
		t.Fatalf("%#v", wc)
	}
	if !bytes.Equal(dst.Bytes()[:26], src.Bytes()) {
		t.Fatalf("got %q", dst.Bytes()[:26])
	}
}

// A forgotten receive fails the SEND with ErrRNRRetryExceeded under the defaults instead of hanging,
// and RNRRetry 7 still means forever.
func TestRNRRetryDefault(t *testing.T) {
	p := newAPIPair(t, nil)
	start := time.Now()
	ok(t, p.qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Signaled, SGL: []goroce.SGE{p.srca.SGE(0, 8)}}))
	wc := waitOne(t, p.cqa)
	if !errors.Is(wc.Err(), goroce.ErrRNRRetryExceeded) {
		t.Fatalf("SEND without a receive: %#v", wc)
	}
	t.Logf("failed after %v and %d RNR NAKs", time.Since(start).Round(time.Millisecond), p.qpa.Counters().RcvdRNRErr)

	forever := goroce.DefaultConnectOptions()
	forever.RNRRetry = 7
	q := newAPIPair(t, &forever)
	ok(t, q.qpa.PostSend(&goroce.SendWR{WRID: 1, Opcode: goroce.WRSend, Flags: goroce.Signaled, SGL: []goroce.SGE{q.srca.SGE(0, 8)}}))
	time.Sleep(100 * time.Millisecond) // several RNR NAK rounds
	ok(t, q.qpb.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{q.dstb.SGE(0, 8)}}))
	if wc := waitOne(t, q.cqa); wc.Err() != nil {
		t.Fatalf("RNRRetry 7: %v", wc.Err())
	}
}

// ConnectOptions say zero when they mean it, and Query shows what Connect set.
func TestConnectOptionsZero(t *testing.T) {
	o := goroce.DefaultConnectOptions()
	o.RetryCnt, o.RNRRetry, o.Timeout = 0, 0, 0
	p := newAPIPair(t, &o)
	a := p.qpa.Query()
	if a.RetryCnt != 0 || a.RNRRetry != 0 || a.Timeout != 0 {
		t.Fatalf("asked for zeros, got retry %d, RNR retry %d, timeout %d", a.RetryCnt, a.RNRRetry, a.Timeout)
	}
	if a.PathMTU != goroce.MTU4096 {
		t.Fatalf("path MTU %v between two devices that allow 4096", a.PathMTU)
	}
	// A peer that does not say its MTU (ibv_rc_pingpong does not) gets 1024.
	e := p.qpb.Endpoint()
	e.MTU = 0
	q, _ := p.pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cqa, RecvCQ: p.cqa})
	ok(t, q.Connect(e, nil))
	if mtu := q.Query().PathMTU; mtu != goroce.MTU1024 {
		t.Fatalf("path MTU %v toward a peer of unknown MTU", mtu)
	}
	if err := q.Connect(goroce.Endpoint{}, nil); !errors.Is(err, goroce.ErrBadConfig) {
		t.Fatalf("Connect to nowhere: %v", err)
	}
}

// An Endpoint survives its binary and text forms, and malformed forms are refused.
func TestEndpointForms(t *testing.T) {
	e := goroce.Endpoint{GID: goroce.GIDFromAddr(netip.MustParseAddr("192.0.2.7")), Port: 4791, QPN: 0x11, PSN: 0xa1b2c3, MTU: goroce.MTU4096}
	b, err := e.MarshalBinary()
	ok(t, err)
	var back goroce.Endpoint
	if len(b) != goroce.EndpointLen || back.UnmarshalBinary(b) != nil || back != e {
		t.Fatalf("binary %x gives %v", b, back)
	}
	if s := e.String(); s != "000011:a1b2c3@192.0.2.7:4791/4096" {
		t.Fatalf("text %q", s)
	}
	v6 := goroce.Endpoint{GID: goroce.GIDFromAddr(netip.MustParseAddr("fd00::9")), Port: 50000, QPN: 0xffffff, PSN: 0}
	for _, want := range []goroce.Endpoint{e, v6} {
		got, err := goroce.ParseEndpoint(want.String())
		if err != nil || got != want {
			t.Fatalf("ParseEndpoint(%q) = %v, %v", want.String(), got, err)
		}
	}
	for _, bad := range []string{"", "11:22", "1000000:0@1.2.3.4:1", "11:22@1.2.3.4", "11:22@1.2.3.4:4791/1500", "zz:22@1.2.3.4:1"} {
		if _, err := goroce.ParseEndpoint(bad); !errors.Is(err, goroce.ErrBadEndpoint) {
			t.Errorf("ParseEndpoint(%q): %v", bad, err)
		}
	}
	for _, bad := range [][]byte{nil, b[:25], append(b[:25:25], 9), append([]byte{2}, b[1:]...)} {
		if err := back.UnmarshalBinary(bad); !errors.Is(err, goroce.ErrBadEndpoint) {
			t.Errorf("UnmarshalBinary(%x): %v", bad, err)
		}
	}
}

func FuzzEndpoint(f *testing.F) {
	f.Add("000011:a1b2c3@192.0.2.7:4791/4096")
	f.Add("ffffff:000000@[fd00::9]:50000")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := goroce.ParseEndpoint(s)
		if err != nil {
			return
		}
		again, err := goroce.ParseEndpoint(e.String())
		if err != nil || again != e {
			t.Fatalf("%q parses to %v, whose text %q parses to %v, %v", s, e, e.String(), again, err)
		}
		b, _ := e.MarshalBinary()
		var back goroce.Endpoint
		if err := back.UnmarshalBinary(b); err != nil || back != e {
			t.Fatalf("binary of %v: %v, %v", e, back, err)
		}
	})
}

// The in-memory network's impairments: losses recovered by retransmission, CE marks answered by CNPs.
func TestMemNetworkImpairments(t *testing.T) {
	p := newAPIPair(t, nil)
	ok(t, p.net.Impair(goroce.Impairment{Loss: 0.05, Reorder: 0.05, Duplicate: 0.02, Seed: 3}))
	data := p.srca.Bytes()
	for i := range data {
		data[i] = byte(i * 7)
	}
	for range 16 { // 256 packets
		ok(t, p.qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled, SGL: []goroce.SGE{p.srca.SGE(0, len(data))},
			RemoteAddr: p.dstb.Addr(), RKey: p.dstb.RKey()}))
		if wc := waitOne(t, p.cqa); wc.Err() != nil {
			t.Fatal(wc.Err())
		}
	}
	p.net.Wait()
	if !bytes.Equal(p.dstb.Bytes(), data) {
		t.Fatal("data differs")
	}
	s := p.net.Stats()
	if s.Dropped == 0 || s.Reordered == 0 {
		t.Fatalf("impairments did nothing: %+v", s)
	}
	t.Logf("%+v, %d retransmission rounds", s, p.qpa.Counters().CompleterRetryErr)
	if err := p.net.Impair(goroce.Impairment{Loss: 1.5}); !errors.Is(err, goroce.ErrBadConfig) {
		t.Fatalf("loss 1.5: %v", err)
	}
}

// CE marks on a MemNetwork reach a DCQCN device, which answers with CNPs that reach the sender. (That
// they slow it is TestDCQCNLoopback's.)
func TestMemNetworkCE(t *testing.T) {
	net := goroce.NewMemNetwork()
	ok(t, net.Impair(goroce.Impairment{CE: 0.2, Seed: 1}))
	params := goroce.DefaultDCQCN(10e9)
	open := func(addr string) *goroce.Device {
		d, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr(addr), Network: net, DCQCN: &params})
		ok(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	a, b := open("10.0.0.1"), open("10.0.0.2")
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	cqa, _ := a.CreateCQ(8)
	cqb, _ := b.CreateCQ(8)
	qa, _ := pda.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqa, RecvCQ: cqa})
	qb, _ := pdb.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cqb, RecvCQ: cqb})
	ok(t, qa.Connect(qb.Endpoint(), nil))
	ok(t, qb.Connect(qa.Endpoint(), nil))
	src, _ := pda.AllocMR(4<<20, goroce.LocalWrite)
	dst, _ := pdb.AllocMR(4<<20, goroce.LocalWrite|goroce.RemoteWrite)
	ok(t, qa.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled, SGL: []goroce.SGE{src.SGE(0, 4<<20)},
		RemoteAddr: dst.Addr(), RKey: dst.RKey()}))
	if wc := waitOne(t, cqa); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	if net.Stats().Marked == 0 || b.Stats().CNPSent == 0 || qa.Counters().RcvdCNP == 0 {
		t.Fatalf("marked %d, CNPs sent %d, received %d", net.Stats().Marked, b.Stats().CNPSent, qa.Counters().RcvdCNP)
	}
}

// An atomic's result lands in the local buffer in the host's byte order, as in libibverbs.
func TestAtomicResultByteOrder(t *testing.T) {
	p := newAPIPair(t, nil)
	binary.NativeEndian.PutUint64(p.dstb.Bytes(), 40)
	ok(t, p.qpa.PostSend(&goroce.SendWR{Opcode: goroce.WRFetchAdd, Flags: goroce.Signaled, SGL: []goroce.SGE{p.srca.SGE(0, 8)},
		RemoteAddr: p.dstb.Addr(), RKey: p.dstb.RKey(), CompareAdd: 2}))
	if wc := waitOne(t, p.cqa); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	if old, now := binary.NativeEndian.Uint64(p.srca.Bytes()), binary.NativeEndian.Uint64(p.dstb.Bytes()); old != 40 || now != 42 {
		t.Fatalf("fetch-and-add: original %d, now %d", old, now)
	}
}

// Impairment.From impairs one direction only.
func TestImpairOneDirection(t *testing.T) {
	p := newAPIPair(t, nil)
	var mu sync.Mutex
	froms := map[netip.Addr]int{}
	ok(t, p.net.Impair(goroce.Impairment{Loss: 0.2, Seed: 5, From: p.b.LocalAddr().Addr(),
		Dropped: func(_ []byte, from, _ netip.AddrPort) {
			mu.Lock()
			froms[from.Addr()]++
			mu.Unlock()
		}}))
	recv, _ := p.pdb.AllocMR(64, goroce.LocalWrite)
	for i := range 20 {
		ok(t, p.qpb.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{recv.SGE(0, 64)}}))
		ok(t, p.qpa.PostSend(&goroce.SendWR{WRID: uint64(i), Opcode: goroce.WRSend, Flags: goroce.Signaled | goroce.Inline,
			InlineData: []byte("ping")}))
		if wc := waitOne(t, p.cqa); wc.Err() != nil {
			t.Fatal(wc.Err())
		}
		waitOne(t, p.cqb)
	}
	mu.Lock()
	defer mu.Unlock()
	if froms[p.b.LocalAddr().Addr()] == 0 || len(froms) != 1 {
		t.Fatalf("drops by sender: %v", froms)
	}
}

// Receives posted in INIT, before Connect, take the peer's first SEND; in RESET they are refused.
func TestInitThenConnect(t *testing.T) {
	net := goroce.NewMemNetwork()
	open := func(addr string) (*goroce.PD, *goroce.CQ, *goroce.QP) {
		d, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr(addr), Network: net})
		ok(t, err)
		t.Cleanup(func() { d.Close() })
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(8)
		q, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
		ok(t, err)
		return pd, cq, q
	}
	_, cqa, qa := open("10.0.0.1")
	pdb, cqb, qb := open("10.0.0.2")
	recv, _ := pdb.AllocMR(64, goroce.LocalWrite)
	if err := qb.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{recv.SGE(0, 64)}}); !errors.Is(err, goroce.ErrBadState) {
		t.Fatalf("PostRecv in RESET: %v", err)
	}
	ok(t, qb.Init())
	ok(t, qb.PostRecv(&goroce.RecvWR{WRID: 5, SGL: []goroce.SGE{recv.SGE(0, 64)}}))
	ok(t, qa.Connect(qb.Endpoint(), nil))
	ok(t, qb.Connect(qa.Endpoint(), nil))
	ok(t, qa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline | goroce.Signaled, InlineData: []byte("first")}))
	if wc := waitOne(t, cqa); wc.Err() != nil {
		t.Fatal(wc.Err())
	}
	if wc := waitOne(t, cqb); wc.Err() != nil || wc.WRID != 5 || string(recv.Bytes()[:wc.ByteLen]) != "first" {
		t.Fatalf("%#v", wc)
	}
}

// TestErrorAfterReceive: a program that moves its QP to ERR as soon as a receive completes (as a
// connection's Close does) still acknowledges that SEND. The ACK may be waiting for company
// (Config.AckDelay, here a long 5 ms so that it always is); it leaves before the QP stops, and the
// sender's SEND completes with success instead of resending into a dead QP until its retries run out.
func TestErrorAfterReceive(t *testing.T) {
	net := goroce.NewMemNetwork()
	open := func(addr string) (*goroce.PD, *goroce.CQ, *goroce.QP) {
		d, err := goroce.Open(goroce.Config{Addr: netip.MustParseAddr(addr), Network: net, AckDelay: 5 * time.Millisecond})
		ok(t, err)
		t.Cleanup(func() { d.Close() })
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(8)
		q, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
		ok(t, err)
		return pd, cq, q
	}
	for i := range 5 {
		_, cqa, qa := open(fmt.Sprintf("10.0.%d.1", i))
		pdb, cqb, qb := open(fmt.Sprintf("10.0.%d.2", i))
		recv, _ := pdb.AllocMR(64, goroce.LocalWrite)
		o := goroce.DefaultConnectOptions()
		o.Timeout, o.RetryCnt = 12, 1 // 16.8 ms, one retry: a lost ACK fails the SEND in ~34 ms
		ok(t, qb.Init())
		ok(t, qb.PostRecv(&goroce.RecvWR{WRID: 5, SGL: []goroce.SGE{recv.SGE(0, 64)}}))
		ok(t, qa.Connect(qb.Endpoint(), &o))
		ok(t, qb.Connect(qa.Endpoint(), &o))
		ok(t, qa.PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline | goroce.Signaled, InlineData: []byte("bye")}))
		if wc := waitOne(t, cqb); wc.Err() != nil {
			t.Fatal(wc.Err())
		}
		ok(t, qb.Modify(&goroce.Attr{State: goroce.StateErr}, goroce.AttrState))
		if wc := waitOne(t, cqa); wc.Err() != nil {
			t.Fatalf("run %d: the SEND the peer received completed with %v", i, wc.Err())
		}
	}
}

// TestCounterNames: the counters carry the names rxe's and mlx5's hardware counters have, so that a
// user who knows `rdma statistic` finds them: rxe's where rxe has the counter, mlx5's where only mlx5
// does, the field's name otherwise.
func TestCounterNames(t *testing.T) {
	var s goroce.Stats
	s.CNPSent, s.DropICRC, s.RxMADs, s.QP.Timeouts, s.QP.RcvdCNP, s.QP.RcvdCE, s.QP.ImpliedNAKs, s.QP.DuplicateRequest = 1, 2, 3, 4, 5, 6, 7, 8
	got := map[string]uint64{}
	s.Each(func(name string, v uint64) {
		if _, dup := got[name]; dup {
			t.Errorf("two counters named %s", name)
		}
		got[name] = v
	})
	for name, want := range map[string]uint64{"np_cnp_sent": 1, "DropICRC": 2, "RxMADs": 3, "local_ack_timeout_err": 4,
		"rp_cnp_handled": 5, "np_ecn_marked_roce_packets": 6, "implied_nak_seq_err": 7, "duplicate_request": 8,
		"out_of_seq_request": 0, "rcvd_seq_err": 0, "TxPackets": 0, "DropNotReady": 0, "cm_Received": 0} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s: %d (present %v), want %d", name, v, ok, want)
		}
	}
}
