package rping

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/internal/syncbuf"
)

var (
	serverAddr = netip.MustParseAddr("10.0.0.2")
	clientAddr = netip.MustParseAddr("10.0.0.1")
)

// devices opens a server and a client device on the RoCEv2 port: on net, or on the host's loopback
// sockets when net is nil.
func devices(t *testing.T, net goroce.Network, server, client netip.Addr) (s, c *goroce.Device) {
	t.Helper()
	open := func(a netip.Addr) *goroce.Device {
		d, err := goroce.Open(goroce.Config{Addr: a, Port: goroce.DefaultPort, Network: net})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	return open(server), open(client)
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestFill: rping's text, byte for byte as rping.c writes it: the ping number, letters from 'A' on
// that start one later each ping and wrap after 'z', a NUL at the end.
func TestFill(t *testing.T) {
	for _, c := range []struct {
		size, ping int
		want       string
	}{
		{MinSize, 0, "rdma-ping-0: ABCDEFGHIJKL\x00"},
		{MinSize, 1, "rdma-ping-1: BCDEFGHIJKLM\x00"},
		{MinSize, 57, "rdma-ping-57: zABCDEFGHIJ\x00"},
		{MinSize, 58, "rdma-ping-58: ABCDEFGHIJK\x00"},
		{MinSize, 2147483647, "rdma-ping-2147483647: HIJ\x00"},
		{80, 3, "rdma-ping-3: DEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyzABCDEFGHIJK\x00"},
	} {
		b := make([]byte, c.size)
		Fill(b, c.ping)
		if string(b) != c.want {
			t.Errorf("Fill(%d, %d) = %q, want %q", c.size, c.ping, b, c.want)
		}
	}
}

// TestOptions: the sizes and counts rping refuses.
func TestOptions(t *testing.T) {
	for _, o := range []Options{{Size: MinSize - 1}, {Size: MaxSize + 1}, {Size: 64, Count: -1}} {
		if err := o.Validate(); !errors.Is(err, ErrBadOptions) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	for _, o := range []Options{DefaultOptions(), {Size: MinSize}, {Size: MaxSize, Count: 3}} {
		if err := o.Validate(); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// run runs a goroce server and a goroce client with opts and returns both sides' output.
func run(t *testing.T, net goroce.Network, sa, ca netip.Addr, opts Options) (sres, cres Result, sout, serr, cout, cerr string) {
	t.Helper()
	ctx := testCtx(t)
	sd, cd := devices(t, net, sa, ca)
	srv, err := Listen(sd, DefaultPort, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var so, se, co, ce syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		var err error
		sres, err = srv.Serve(ctx, &so, &se)
		done <- err
	}()
	cres, err = Connect(ctx, cd, netip.AddrPortFrom(sa, DefaultPort).String(), opts, &co, &ce)
	if err != nil {
		t.Fatalf("client: %v\n%s%s", err, co.String(), ce.String())
	}
	if err := <-done; err != nil {
		t.Fatalf("server: %v\n%s%s", err, so.String(), se.String())
	}
	return sres, cres, so.String(), se.String(), co.String(), ce.String()
}

// wantLines returns the -v lines of count pings of size bytes, each with prefix.
func wantLines(prefix string, size, count int) string {
	var b strings.Builder
	buf := make([]byte, size)
	for i := range count {
		Fill(buf, i)
		fmt.Fprintf(&b, "%s%s\n", prefix, cString(buf))
	}
	return b.String()
}

// TestRping: goroce's client and server, -v -V, at several sizes and counts in memory, and once over
// the host's loopback sockets: every ping's data printed by both sides is rping's text for it (the
// server READ it, the client got it back by the server's WRITE), both count the pings, and the server
// reports the client's disconnection.
func TestRping(t *testing.T) {
	for _, c := range []struct {
		size, count int
		sockets     bool
	}{
		{MinSize, 1, false}, {64, 10, false}, {1000, 5, false}, {4096, 3, false}, {10000, 4, false},
		{MaxSize, 2, false}, {64, 3, true}, {MaxSize, 2, true},
	} {
		name := fmt.Sprintf("S%d-C%d", c.size, c.count)
		var net goroce.Network = goroce.NewMemNetwork()
		sa, ca := serverAddr, clientAddr
		if c.sockets {
			name += "-loopback"
			net, sa, ca = nil, netip.MustParseAddr("127.0.74.2"), netip.MustParseAddr("127.0.74.1")
		}
		t.Run(name, func(t *testing.T) {
			o := Options{Size: c.size, Count: c.count, Verbose: true, Check: true}
			sres, cres, sout, serr, cout, cerr := run(t, net, sa, ca, o)
			if cres.Pings != c.count || sres.Pings != c.count || sres.Conns != 1 {
				t.Errorf("pings: client %d, server %d (%d conns); want %d", cres.Pings, sres.Pings, sres.Conns, c.count)
			}
			if want := wantLines("ping data: ", c.size, c.count); cout != want {
				t.Errorf("client output:\n%q\nwant\n%q", cout, want)
			}
			if want := wantLines("server ping data: ", c.size, c.count); sout != want {
				t.Errorf("server output:\n%q\nwant\n%q", sout, want)
			}
			if serr != "server DISCONNECT EVENT...\n" || cerr != "" {
				t.Errorf("server stderr %q, client stderr %q", serr, cerr)
			}
		})
	}
}

// TestDebug: -d prints rping's debug lines, "rdma_listen" first on the server, and both sides' buffer
// advertisements.
func TestDebug(t *testing.T) {
	_, _, sout, _, cout, _ := run(t, goroce.NewMemNetwork(), serverAddr, clientAddr, Options{Size: 64, Count: 2, Debug: true})
	if !strings.HasPrefix(sout, "rdma_listen\n") || strings.Count(sout, "Received rkey ") != 4 ||
		strings.Count(sout, "server rdma write complete") != 2 {
		t.Errorf("server debug output:\n%s", sout)
	}
	if strings.Count(cout, "RDMA addr ") != 4 || !strings.Contains(cout, "rdma_connect successful") {
		t.Errorf("client debug output:\n%s", cout)
	}
}

// TestPersistent: a -P server takes several clients at once and serves each; it ends with its
// context, having counted every connection and ping.
func TestPersistent(t *testing.T) {
	const clients, count = 4, 5
	net := goroce.NewMemNetwork()
	sd, _ := devices(t, net, serverAddr, clientAddr)
	ctx := testCtx(t)
	srv, err := Listen(sd, 0, Options{Size: 200, Persistent: true, Check: true})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	var serr syncbuf.Buffer
	done := make(chan Result, 1)
	go func() {
		res, err := srv.Serve(sctx, nil, &serr)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Serve: %v", err)
		}
		done <- res
	}()
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := goroce.Open(goroce.Config{Addr: netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)}), Port: goroce.DefaultPort, Network: net})
			if err != nil {
				t.Error(err)
				return
			}
			defer d.Close()
			res, err := Connect(ctx, d, srv.Addr().String(), Options{Size: 200, Count: count, Check: true}, nil, nil)
			if err != nil || res.Pings != count {
				t.Errorf("client %d: %d pings, %v", i, res.Pings, err)
			}
		}()
	}
	wg.Wait()
	// Each connection ends when its DREQ arrives; wait for all to report before stopping.
	for deadline := time.Now().Add(10 * time.Second); strings.Count(serr.String(), "DISCONNECT") < clients; {
		if time.Now().After(deadline) {
			t.Fatalf("server stderr:\n%s", serr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	res := <-done
	if res.Conns != clients || res.Pings != clients*count {
		t.Errorf("server: %+v, want %d connections and %d pings", res, clients, clients*count)
	}
	if strings.Contains(serr.String(), "failed") {
		t.Errorf("server stderr:\n%s", serr.String())
	}
}

// TestClientForever: -C 0 pings until the context ends, which ends the run without an error.
func TestClientForever(t *testing.T) {
	sd, cd := devices(t, goroce.NewMemNetwork(), serverAddr, clientAddr)
	ctx := testCtx(t)
	srv, err := Listen(sd, DefaultPort, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ctx, nil, nil)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	res, err := Connect(cctx, cd, "10.0.0.2:7174", Options{Size: 64, Check: true}, nil, nil)
	if err != nil || res.Pings == 0 {
		t.Fatalf("%d pings, %v", res.Pings, err)
	}
}

// TestServerDisconnects: the server goes away in the middle of a run (its context ends): the client
// hears the DREQ and ends without an error, as rping's client does on RDMA_CM_EVENT_DISCONNECTED.
func TestServerDisconnects(t *testing.T) {
	sd, cd := devices(t, goroce.NewMemNetwork(), serverAddr, clientAddr)
	ctx := testCtx(t)
	srv, err := Listen(sd, DefaultPort, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	var sout syncbuf.Buffer
	go srv.Serve(sctx, &sout, nil)
	var cerr syncbuf.Buffer
	done := make(chan error, 1)
	var res Result
	go func() {
		var err error
		res, err = Connect(ctx, cd, "10.0.0.2:7174", Options{Size: 64, Check: true}, nil, &cerr)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("client: %v", err)
	}
	if res.Pings == 0 || cerr.String() != "client DISCONNECT EVENT...\n" {
		t.Errorf("%d pings, stderr %q", res.Pings, cerr.String())
	}
}

// TestNoServer: nobody listens: the client's connection is refused.
func TestNoServer(t *testing.T) {
	_, cd := devices(t, goroce.NewMemNetwork(), serverAddr, clientAddr)
	_, err := Connect(testCtx(t), cd, "10.0.0.2:7174", DefaultOptions(), nil, nil)
	var rej *goroce.RejectError
	if !errors.Is(err, goroce.ErrConnRefused) || !errors.As(err, &rej) || rej.Reason != goroce.RejectInvalidServiceID {
		t.Fatalf("Connect: %v", err)
	}
}

// fakeClient connects to the server at addr with a QP of its own, a receive posted, and returns it.
func fakeClient(t *testing.T, ctx context.Context, d *goroce.Device, addr string) (*goroce.Conn, *goroce.PD, *goroce.CQ) {
	t.Helper()
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(32)
	q, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Init(); err != nil {
		t.Fatal(err)
	}
	o := goroce.DefaultCMOptions()
	o.QP = q
	c, err := d.Dial(ctx, addr, &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); q.Close() })
	return c, pd, cq
}

// TestServerChecks: a goroce server with Check refuses a READ that is not rping's text, and any
// server refuses a message that is not a 16-byte advertisement and a buffer larger than its own.
func TestServerChecks(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  func(mr *goroce.MR) []byte
		want error
	}{
		{"bad data", func(mr *goroce.MR) []byte {
			Fill(mr.Bytes(), 0)
			mr.Bytes()[20] = '!'
			return info{addr: mr.Addr(), rkey: mr.RKey(), size: 64}.marshal()
		}, ErrBadData},
		{"short message", func(mr *goroce.MR) []byte { return make([]byte, 8) }, ErrProtocol},
		{"large buffer", func(mr *goroce.MR) []byte {
			return info{addr: mr.Addr(), rkey: mr.RKey(), size: 65}.marshal()
		}, ErrProtocol},
	} {
		t.Run(c.name, func(t *testing.T) {
			sd, cd := devices(t, goroce.NewMemNetwork(), serverAddr, clientAddr)
			ctx := testCtx(t)
			srv, err := Listen(sd, DefaultPort, Options{Size: 64, Check: true})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := srv.Serve(ctx, nil, nil); done <- err }()
			conn, pd, _ := fakeClient(t, ctx, cd, "10.0.0.2:7174")
			mr, err := pd.AllocMR(128, goroce.LocalWrite|goroce.RemoteRead|goroce.RemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			defer mr.Close()
			if err := conn.QP().PostSend(&goroce.SendWR{Opcode: goroce.WRSend, Flags: goroce.Inline, InlineData: c.msg(mr)}); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, c.want) {
				t.Errorf("Serve: %v, want %v", err, c.want)
			}
		})
	}
}

// TestClientChecks: a server that writes back other data than it read: the client with Check ends
// with ErrBadData at that ping; without Check it goes on, as rping does.
func TestClientChecks(t *testing.T) {
	for _, check := range []bool{true, false} {
		t.Run(fmt.Sprint("check=", check), func(t *testing.T) {
			sd, cd := devices(t, goroce.NewMemNetwork(), serverAddr, clientAddr)
			ctx := testCtx(t)
			ln, err := sd.Listen(DefaultPort, nil)
			if err != nil {
				t.Fatal(err)
			}
			go badServer(ctx, sd, ln)
			res, err := Connect(ctx, cd, "10.0.0.2:7174", Options{Size: 64, Count: 2, Check: check}, nil, nil)
			if check && (!errors.Is(err, ErrBadData) || res.Pings != 0) || !check && (err != nil || res.Pings != 2) {
				t.Errorf("check %v: %d pings, %v", check, res.Pings, err)
			}
		})
	}
}

// badServer follows rping's protocol but writes back the wrong letters.
func badServer(ctx context.Context, d *goroce.Device, ln *goroce.Listener) {
	r, err := ln.Request(ctx)
	if err != nil {
		return
	}
	o := DefaultOptions()
	p, err := newPeer(d, &o, false, nil)
	if err != nil {
		return
	}
	defer p.close()
	if p.conn, err = r.Accept(ctx, p.options()); err != nil {
		return
	}
	for {
		src, err := p.recvInfo(ctx)
		if err != nil {
			return
		}
		if p.qp.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMARead, Flags: goroce.Signaled,
			SGL: []goroce.SGE{p.rdma.SGE(0, int(src.size))}, RemoteAddr: src.addr, RKey: src.rkey}) != nil {
			return
		}
		if _, err := p.next(ctx, goroce.CompRDMARead); err != nil || p.send(make([]byte, infoLen)) != nil {
			return
		}
		sink, err := p.recvInfo(ctx)
		if err != nil {
			return
		}
		p.rdma.Bytes()[30] ^= 0x20 // a letter in the other case
		if p.qp.PostSend(&goroce.SendWR{Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
			SGL: []goroce.SGE{p.rdma.SGE(0, int(sink.size))}, RemoteAddr: sink.addr, RKey: sink.rkey}) != nil {
			return
		}
		if _, err := p.next(ctx, goroce.CompRDMAWrite); err != nil || p.send(make([]byte, infoLen)) != nil {
			return
		}
	}
}

// TestDescribeMismatch: the error of a failed check names the first differing byte and shows both
// buffers there, and counts the zeros a sink that was never written holds from there.
func TestDescribeMismatch(t *testing.T) {
	src, stale, empty := make([]byte, 100), make([]byte, 100), make([]byte, 100)
	Fill(src, 1)
	Fill(stale, 0)
	copy(empty, src[:50])
	for _, c := range []struct {
		sink []byte
		want []string
	}{
		{stale, []string{"at byte 10 of 100 (0 zero bytes", `got back "ma-ping-0: ABC`, `at byte 2;`}},
		{empty, []string{"at byte 50 of 100 (50 zero bytes", `got back "`}},
	} {
		got := describeMismatch(src, c.sink)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("describeMismatch = %s\nwant it to contain %q", got, w)
			}
		}
	}
}
