package pingpong

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/internal/syncbuf"
	"github.com/goroce/goroce/internal/testaddr"
)

// The lines the C tools print, which interop/interop_test.go looks for in goroce's output too.
func outputLines(local, remote netip.Addr) []*regexp.Regexp {
	q := regexp.QuoteMeta
	return []*regexp.Regexp{
		regexp.MustCompile(`(?m)^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}[,:] GID ::ffff:` + q(local.String()) + `$`),
		regexp.MustCompile(`(?m)^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:` + q(remote.String()) + `$`),
		ppBytes, ppIters,
	}
}

var (
	ppBytes = regexp.MustCompile(`(?m)^(\d+) bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`)
	ppIters = regexp.MustCompile(`(?m)^(\d+) iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`)
)

type side struct {
	out string
	res Result
	err error
}

// runPair runs a goroce server and client against each other on loopback: TCP on an ephemeral port of
// the server's address, the devices on srv.Addr (the TCP address when unset) and cli.Addr.
func runPair(t *testing.T, srvAddr netip.Addr, srv, cli Options) (s, c side) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := Listen(ctx, netip.AddrPortFrom(srvAddr, 0).String(), srv)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var sb, cb syncbuf.Buffer
	done := make(chan side, 1)
	go func() {
		r, err := ln.Serve(ctx, &sb)
		done <- side{res: r, err: err}
	}()
	c.res, c.err = Connect(ctx, ln.Addr().String(), cli, &cb)
	s = <-done
	s.out, c.out = sb.String(), cb.String()
	return s, c
}

func TestLoopback(t *testing.T) {
	for _, tc := range []struct {
		name      string
		typ       goroce.QPType
		size      int
		mtu       goroce.MTU
		iters     int
		chk       bool
		tcpDevice bool // the server's device takes the TCP connection's address
		mem       bool // the devices talk over a goroce.MemNetwork
	}{
		{name: "1B", typ: goroce.RC, size: 1, mtu: goroce.MTU1024, iters: 200},
		{name: "4KiB-chk", typ: goroce.RC, size: 4096, mtu: goroce.MTU1024, iters: 200, chk: true},
		{name: "multipage-mtu4096-chk", typ: goroce.RC, size: 3*4096 + 100, mtu: goroce.MTU4096, iters: 100, chk: true},
		{name: "64KiB-mtu1024-tcpaddr", typ: goroce.RC, size: 65536, mtu: goroce.MTU1024, iters: 50, chk: true, tcpDevice: true},
		{name: "UC-4KiB", typ: goroce.UC, size: 4096, mtu: goroce.MTU1024, iters: 200, chk: true},
		{name: "UD-1KiB", typ: goroce.UD, size: 1024, mtu: goroce.MTU1024, iters: 200},
		{name: "UD-2KiB-mtu2048-tcpaddr", typ: goroce.UD, size: 2048, mtu: goroce.MTU2048, iters: 200, tcpDevice: true},
		{name: "RC-memnetwork-chk", typ: goroce.RC, size: 8192, mtu: goroce.MTU4096, iters: 100, chk: true, mem: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sa, ca := testaddr.Pair()
			o := DefaultOptions(tc.typ)
			o.Size, o.MTU, o.Iters, o.Check = tc.size, tc.mtu, tc.iters, tc.chk
			if tc.mem {
				o.Network = goroce.NewMemNetwork()
			}
			srv, cli := o, o
			cli.Addr = ca
			if !tc.tcpDevice {
				srv.Addr = sa
			}
			s, c := runPair(t, sa, srv, cli)
			if s.err != nil || c.err != nil {
				t.Fatalf("server: %v\n%s\nclient: %v\n%s", s.err, s.out, c.err, c.out)
			}
			for _, x := range []struct {
				name          string
				side          side
				local, remote netip.Addr
			}{{"server", s, sa, ca}, {"client", c, ca, sa}} {
				for _, re := range outputLines(x.local, x.remote) {
					if !re.MatchString(x.side.out) {
						t.Errorf("%s output lacks %v:\n%s", x.name, re, x.side.out)
					}
				}
				want := int64(2 * tc.size * tc.iters)
				if m := ppBytes.FindStringSubmatch(x.side.out); m != nil && m[1] != strconv.FormatInt(want, 10) {
					t.Errorf("%s: %s bytes, want %d", x.name, m[1], want)
				}
				if m := ppIters.FindStringSubmatch(x.side.out); m != nil && m[1] != strconv.Itoa(tc.iters) {
					t.Errorf("%s: %s iters, want %d", x.name, m[1], tc.iters)
				}
				if strings.Contains(x.side.out, "invalid data") {
					t.Errorf("%s: %s", x.name, x.side.out)
				}
				r := x.side.res
				if r.Bytes != want || r.Iters != tc.iters || r.Elapsed <= 0 {
					t.Errorf("%s: result %+v, want %d bytes, %d iters", x.name, r, want, tc.iters)
				}
				if r.Local.GID != goroce.GIDFromAddr(x.local) || r.Remote.GID != goroce.GIDFromAddr(x.remote) {
					t.Errorf("%s: local GID %v, remote %v; want %v, %v", x.name, r.Local.GID, r.Remote.GID, x.local, x.remote)
				}
			}
			if s.res.Remote != c.res.Local || c.res.Remote != s.res.Local {
				t.Errorf("the sides disagree on the addresses: server %+v, client %+v", s.res, c.res)
			}
		})
	}
}

// TestSRQLoopback runs goroce against goroce as ibv_srq_pingpong: NumQP QPs on each side, their
// receives from one SRQ, every QP's address printed and exchanged, the data checked on both sides.
func TestSRQLoopback(t *testing.T) {
	for _, tc := range []struct {
		name           string
		numQP, size    int
		rxDepth, iters int
		mem, chk       bool
	}{
		{name: "q1", numQP: 1, size: 4096, rxDepth: 500, iters: 200, chk: true},
		{name: "q4", numQP: 4, size: 4096, rxDepth: 500, iters: 400, chk: true},
		// One receive per QP: the SRQ is refilled after every receive.
		{name: "q4-rx4-multipage", numQP: 4, size: 3*4096 + 100, rxDepth: 4, iters: 100, chk: true},
		// Fewer exchanges than QPs: the client's first sends already exceed them, as in srq_pingpong.
		{name: "q8-n3", numQP: 8, size: 64, rxDepth: 16, iters: 3},
		{name: "q16-memnetwork", numQP: 16, size: 1024, rxDepth: 500, iters: 320, mem: true, chk: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sa, ca := testaddr.Pair()
			o := DefaultSRQOptions()
			o.NumQP, o.Size, o.RxDepth, o.Iters, o.Check = tc.numQP, tc.size, tc.rxDepth, tc.iters, tc.chk
			if tc.mem {
				o.Network = goroce.NewMemNetwork()
			}
			srv, cli := o, o
			srv.Addr, cli.Addr = sa, ca
			s, c := runPair(t, sa, srv, cli)
			if s.err != nil || c.err != nil {
				t.Fatalf("server: %v\n%s\nclient: %v\n%s", s.err, s.out, c.err, c.out)
			}
			for _, x := range []struct {
				name          string
				side          side
				local, remote netip.Addr
			}{{"server", s, sa, ca}, {"client", c, ca, sa}} {
				lines := outputLines(x.local, x.remote)
				for i, re := range lines {
					n := 1
					if i < 2 {
						n = tc.numQP // a local and a remote address line per QP
					}
					if got := len(re.FindAllString(x.side.out, -1)); got != n {
						t.Errorf("%s output has %d lines matching %v, want %d:\n%s", x.name, got, re, n, x.side.out)
					}
				}
				want := int64(2 * tc.size * tc.iters)
				if m := ppBytes.FindStringSubmatch(x.side.out); m != nil && m[1] != strconv.FormatInt(want, 10) {
					t.Errorf("%s: %s bytes, want %d", x.name, m[1], want)
				}
				if strings.Contains(x.side.out, "invalid data") {
					t.Errorf("%s: %s", x.name, x.side.out)
				}
				r := x.side.res
				if len(r.LocalQPs) != tc.numQP || len(r.RemoteQPs) != tc.numQP || r.Local != r.LocalQPs[0] || r.Remote != r.RemoteQPs[0] {
					t.Errorf("%s: %d local and %d remote QPs (first %+v, %+v), want %d", x.name, len(r.LocalQPs), len(r.RemoteQPs), r.Local, r.Remote, tc.numQP)
				}
				qpns := map[goroce.QPN]bool{}
				for _, d := range r.LocalQPs {
					qpns[d.QPN] = true
				}
				if len(qpns) != tc.numQP {
					t.Errorf("%s: QPNs %+v are not distinct", x.name, r.LocalQPs)
				}
			}
			for i := range tc.numQP {
				if s.res.RemoteQPs[i] != c.res.LocalQPs[i] || c.res.RemoteQPs[i] != s.res.LocalQPs[i] {
					t.Errorf("QP %d: the sides disagree on the addresses: server %+v, client %+v", i, s.res, c.res)
				}
			}
		})
	}
}

// TestSRQQPCountMismatch: an SRQ server and client with different -q both fail with ErrQPCount, after
// the whole exchange of addresses, instead of running QPs that have no peer: the server sees the
// client's QPs and answers with none.
func TestSRQQPCountMismatch(t *testing.T) {
	sa, ca := testaddr.Pair()
	o := DefaultSRQOptions()
	o.Iters = 10
	srv, cli := o, o
	srv.Addr, cli.Addr = sa, ca
	srv.NumQP, cli.NumQP = 4, 2
	s, c := runPair(t, sa, srv, cli)
	for _, x := range []struct {
		name string
		side side
	}{{"server", s}, {"client", c}} {
		if !errors.Is(x.side.err, ErrQPCount) {
			t.Errorf("%s: error %v, want ErrQPCount:\n%s", x.name, x.side.err, x.side.out)
		}
	}
	// The server saw the client's two QPs and answered with none.
	if len(s.res.RemoteQPs) != 2 || len(c.res.RemoteQPs) != 0 || !strings.Contains(c.err.Error(), "announced no QPs") {
		t.Errorf("the server saw %d QPs of the client, the client %d of the server (%v); want 2 and 0", len(s.res.RemoteQPs), len(c.res.RemoteQPs), c.err)
	}
}

// TestSRQCheckCatchesWrongData: an SRQ server with Check reports the pages a client filled with
// anything but srq_pingpong's zeros, and a receive shorter than Size. The client is a bare goroce QP
// that runs the exchange and the pingpong itself.
func TestSRQCheckCatchesWrongData(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sendSize int // what the client sends; the server expects 2*4096+1
		fill     byte
		want     string
	}{
		{"nonzero", 2*4096 + 1, 0x55, "invalid data in page 2\n"},
		{"short", 4096, 0, "a receive of 4096 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sa, ca := testaddr.Pair()
			o := DefaultSRQOptions()
			o.NumQP, o.Size, o.RxDepth, o.Iters, o.Check, o.Addr = 1, 2*4096+1, 8, 3, true, sa
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ln, err := Listen(ctx, netip.AddrPortFrom(sa, 0).String(), o)
			if err != nil {
				t.Fatal(err)
			}
			var out syncbuf.Buffer
			done := make(chan error, 1)
			go func() {
				_, err := ln.Serve(ctx, &out)
				done <- err
			}()
			// The server may end the run at the first bad receive: the client then ends with it.
			cctx, ccancel := context.WithCancel(ctx)
			cdone := make(chan error, 1)
			go func() { cdone <- bareSRQClient(cctx, ln.Addr().String(), ca, tc.sendSize, tc.fill, o.Iters) }()
			err = <-done
			ccancel()
			if cerr := <-cdone; cerr != nil && !errors.Is(cerr, context.Canceled) {
				t.Errorf("client: %v", cerr)
			}
			if !errors.Is(err, ErrBadData) {
				t.Fatalf("server: error %v, want ErrBadData:\n%s", err, out.String())
			}
			if !strings.Contains(out.String()+err.Error(), tc.want) {
				t.Errorf("server: %v, output lacks %q:\n%s", err, tc.want, out.String())
			}
		})
	}
}

// bareSRQClient runs an srq_pingpong client of one QP, built from goroce's verbs: it sends size bytes
// of fill each time, from a buffer its receives do not touch.
func bareSRQClient(ctx context.Context, address string, addr netip.Addr, size int, fill byte, iters int) error {
	dev, err := goroce.Open(goroce.Config{Addr: addr, Port: goroce.DefaultPort})
	if err != nil {
		return err
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	mr, err := pd.AllocMR(2*(2*4096+1), goroce.LocalWrite) // sends from the first half, receives into the second
	if err != nil {
		return err
	}
	for i := range mr.Bytes() {
		mr.Bytes()[i] = fill
	}
	cq, _ := dev.CreateCQ(8)
	qp, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", address)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = ExchangeSRQClient(conn, []Dest{DestFromEndpoint(qp.Endpoint())}, func(rem []Dest) error {
		if err := qp.Connect(rem[0].Endpoint(), nil); err != nil {
			return err
		}
		for range iters {
			if err := qp.PostRecv(&goroce.RecvWR{WRID: recvWRID, SGL: []goroce.SGE{mr.SGE(2*4096+1, 2*4096+1)}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	wc := make([]goroce.Completion, 2)
	for sent, done := 0, 0; done < 2*iters; {
		if sent == done/2 && sent < iters {
			if err := qp.PostSend(&goroce.SendWR{WRID: sendWRID, Opcode: goroce.WRSend, Flags: goroce.Signaled,
				SGL: []goroce.SGE{mr.SGE(0, size)}}); err != nil {
				return err
			}
			sent++
		}
		n, err := cq.Wait(ctx, wc)
		if err != nil {
			return err
		}
		for _, e := range wc[:n] {
			if e.Status != goroce.StatusSuccess {
				return &CompletionError{Completion: e}
			}
		}
		done += n
	}
	return nil
}

// TestCheckCatchesWrongData runs a server with Check against a client without it: the client sends
// its buffer without rc_pingpong's check pattern, so the server must report every page.
func TestCheckCatchesWrongData(t *testing.T) {
	sa, ca := testaddr.Pair()
	o := DefaultOptions(goroce.RC)
	o.Size, o.Iters, o.RxDepth = 2*4096+1, 10, 16
	srv, cli := o, o
	srv.Addr, cli.Addr = sa, ca
	srv.Check = true
	s, c := runPair(t, sa, srv, cli)
	if c.err != nil {
		t.Fatalf("client: %v\n%s", c.err, c.out)
	}
	if !errors.Is(s.err, ErrBadData) {
		t.Fatalf("server with Check: error %v, want ErrBadData:\n%s", s.err, s.out)
	}
	for _, p := range []string{"0", "1", "2"} {
		if !strings.Contains(s.out, "invalid data in page "+p+"\n") {
			t.Errorf("server output lacks page %s:\n%s", p, s.out)
		}
	}
}

// TestServeCanceled: a server nobody connects to ends with its context, and says so.
func TestServeCanceled(t *testing.T) {
	sa, _ := testaddr.Pair()
	o := DefaultOptions(goroce.RC)
	o.Addr = sa
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	srv, err := Listen(ctx, netip.AddrPortFrom(sa, 0).String(), o)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, err = srv.Serve(ctx, &out)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Serve = %v, want context.DeadlineExceeded", err)
	}
	if !strings.HasPrefix(out.String(), "  local address:  LID 0x0000") {
		t.Errorf("a server with Addr prints its address before a client connects; printed %q", out.String())
	}
	if err := srv.Close(); err != nil {
		t.Errorf("Close after Serve: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, typ := range []goroce.QPType{goroce.RC, goroce.UC, goroce.UD} {
		o := DefaultOptions(typ)
		if err := o.Validate(); err != nil {
			t.Errorf("DefaultOptions(%v): %v", typ, err)
		}
	}
	if o := DefaultSRQOptions(); o.Validate() != nil || o.NumQP != 16 || o.Type != goroce.RC || o.Size != 4096 || o.RxDepth != 500 {
		t.Errorf("DefaultSRQOptions() = %+v (%v), want srq_pingpong's defaults", o, o.Validate())
	}
	for name, mod := range map[string]func(*Options){
		"rx depth 1":         func(o *Options) { o.RxDepth = 1 },
		"size 0":             func(o *Options) { o.Size = 0 },
		"iters 0":            func(o *Options) { o.Iters = 0 },
		"MTU 0":              func(o *Options) { o.MTU = 0 },
		"UD larger than MTU": func(o *Options) { o.Type, o.Size = goroce.UD, 1025 },
		"SRQ over UC":        func(o *Options) { *o = DefaultSRQOptions(); o.Type = goroce.UC },
		"SRQ of 0 QPs":       func(o *Options) { *o = DefaultSRQOptions(); o.NumQP = 0 },
		"SRQ of 256 QPs":     func(o *Options) { *o = DefaultSRQOptions(); o.NumQP, o.RxDepth = MaxQP, 1000 },
		"SRQ rx depth < QPs": func(o *Options) { *o = DefaultSRQOptions(); o.RxDepth = o.NumQP - 1 },
		"2 QPs without SRQ":  func(o *Options) { o.NumQP = 2 },
	} {
		o := DefaultOptions(goroce.RC)
		mod(&o)
		if err := o.Validate(); !errors.Is(err, ErrBadOptions) {
			t.Errorf("%s: Validate = %v, want ErrBadOptions", name, err)
		}
		if _, err := Connect(context.Background(), "127.0.0.1:1", o, nil); !errors.Is(err, ErrBadOptions) {
			t.Errorf("%s: Connect = %v, want ErrBadOptions", name, err)
		}
	}
}

// TestDestFormat checks the out-of-band message against one ibv_rc_pingpong sent (captured in the rxe
// lab: QPN 0x11, PSN 0x10b60a, GID ::ffff:10.77.0.12).
func TestDestFormat(t *testing.T) {
	golden := "0000:000011:10b60a:00000000000000000000ffff0a4d000c\x00"
	if len(golden) != DestLen {
		t.Fatalf("golden message is %d bytes, want %d", len(golden), DestLen)
	}
	d, err := ParseDest([]byte(golden))
	if err != nil {
		t.Fatal(err)
	}
	if d.QPN != 0x11 || d.PSN != 0x10b60a || d.GID.String() != "10.77.0.12" {
		t.Errorf("parsed %+v", d)
	}
	if got := string(d.Marshal()); got != golden {
		t.Errorf("Marshal = %q, want %q", got, golden)
	}
	if got, want := d.line("remote address:"), "  remote address: LID 0x0000, QPN 0x000011, PSN 0x10b60a, GID ::ffff:10.77.0.12"; got != want {
		t.Errorf("line = %q, want %q", got, want)
	}
	if got, want := d.udLocalLine(), "  local address:  LID 0x0000, QPN 0x000011, PSN 0x10b60a: GID ::ffff:10.77.0.12"; got != want {
		t.Errorf("udLocalLine = %q, want %q", got, want)
	}
	if e := d.Endpoint(); e.QPN != d.QPN || e.PSN != d.PSN || e.GID != d.GID || DestFromEndpoint(e) != d {
		t.Errorf("Endpoint = %+v, back %+v", e, DestFromEndpoint(e))
	}
	for _, bad := range []string{"", "0000:000011:10b60a", "0000:1000000:10b60a:00000000000000000000ffff0a4d000c",
		"0000:000011:10b60a:zz000000000000000000ffff0a4d000c"} {
		if _, err := ParseDest([]byte(bad)); !errors.Is(err, ErrBadDest) {
			t.Errorf("ParseDest(%q) = %v, want ErrBadDest", bad, err)
		}
	}
}

// TestExchange runs both sides of the exchange over a pipe: each learns the other's Dest, and the
// server's QP is connected before the client reads where it is, as rc_pingpong's order requires.
func TestExchange(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cd := Dest{QPN: 0x11, PSN: 0x123456, GID: goroce.GIDFromAddr(netip.MustParseAddr("127.0.0.2"))}
	sd := Dest{QPN: 0x12, PSN: 0xabcdef, GID: goroce.GIDFromAddr(netip.MustParseAddr("127.0.0.1"))}
	var order []string
	var mu sync.Mutex
	log := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	type got struct {
		d   Dest
		err error
	}
	sc := make(chan got, 1)
	go func() {
		d, err := ExchangeServer(b, sd, func(Dest) error { log("server connected"); return nil })
		sc <- got{d, err}
	}()
	d, err := ExchangeClient(a, cd, func(Dest) error { log("client connected"); return nil })
	if err != nil || d != sd {
		t.Fatalf("client got %+v, %v; want %+v", d, err, sd)
	}
	if s := <-sc; s.err != nil || s.d != cd {
		t.Fatalf("server got %+v, %v; want %+v", s.d, s.err, cd)
	}
	if strings.Join(order, ", ") != "server connected, client connected" {
		t.Errorf("order: %v", order)
	}

	// A connect that fails on the server ends its exchange with the error.
	a2, b2 := net.Pipe()
	defer a2.Close()
	defer b2.Close()
	boom := errors.New("boom")
	go ExchangeClient(a2, cd, func(Dest) error { return nil })
	if _, err := ExchangeServer(b2, sd, func(Dest) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("ExchangeServer = %v, want the connect error", err)
	}
}

// TestExchangeSRQ plays srq_pingpong's client against ExchangeSRQServer over a pipe: MaxQP messages
// each way whatever the number of QPs, the QPs without an address sent as zero Dests, then "done";
// and when the server's connect fails it still answers, with zero Dests only, which srq_pingpong's
// client waits for.
func TestExchangeSRQ(t *testing.T) {
	gid := goroce.GIDFromAddr(netip.MustParseAddr("127.0.0.1"))
	cli := []Dest{{QPN: 0x11, PSN: 1, GID: gid}, {QPN: 0x12, PSN: 2, GID: gid}}
	srv := []Dest{{QPN: 0x21, PSN: 3, GID: gid}, {QPN: 0x22, PSN: 4, GID: gid}, {QPN: 0x23, PSN: 5, GID: gid}}
	for _, fail := range []bool{false, true} {
		a, b := net.Pipe()
		type got struct {
			d   []Dest
			err error
		}
		sc := make(chan got, 1)
		boom := errors.New("boom")
		go func() {
			d, err := ExchangeSRQServer(b, srv, func(rem []Dest) error {
				if fail {
					return boom
				}
				return nil
			})
			sc <- got{d, err}
		}()
		// The C client: all its messages, then the server's, then done.
		var msgs []byte
		for i := range MaxQP {
			var d Dest
			if i < len(cli) {
				d = cli[i]
			}
			msgs = d.Append(msgs)
		}
		if _, err := a.Write(msgs); err != nil {
			t.Fatal(err)
		}
		reply := make([]byte, MaxQP*DestLen)
		if _, err := io.ReadFull(a, reply); err != nil {
			t.Fatalf("fail=%v: reading the server's %d messages: %v", fail, MaxQP, err)
		}
		for i := range MaxQP {
			d, err := ParseDest(reply[i*DestLen : (i+1)*DestLen])
			want := Dest{}
			if i < len(srv) && !fail {
				want = srv[i]
			}
			if err != nil || d != want {
				t.Errorf("fail=%v: server message %d = %+v, %v; want %+v", fail, i, d, err, want)
			}
		}
		if !fail {
			a.Write([]byte(doneMsg))
		}
		g := <-sc
		switch {
		case fail && !errors.Is(g.err, boom):
			t.Errorf("ExchangeSRQServer = %v, want the connect error", g.err)
		case !fail && (g.err != nil || len(g.d) != len(cli) || g.d[0] != cli[0] || g.d[1] != cli[1]):
			t.Errorf("ExchangeSRQServer = %+v, %v; want %+v", g.d, g.err, cli)
		}
		a.Close()
		b.Close()
	}

	// Client and server: each learns the other's QPs, however many.
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	sc := make(chan []Dest, 1)
	go func() {
		d, _ := ExchangeSRQServer(b, srv, func([]Dest) error { return nil })
		sc <- d
	}()
	d, err := ExchangeSRQClient(a, cli, func(rem []Dest) error { return nil })
	if err != nil || len(d) != len(srv) || d[2] != srv[2] {
		t.Errorf("ExchangeSRQClient = %+v, %v; want %+v", d, err, srv)
	}
	if d := <-sc; len(d) != len(cli) {
		t.Errorf("ExchangeSRQServer got %+v, want %+v", d, cli)
	}
	if _, err := ExchangeSRQClient(a, make([]Dest, MaxQP+1), nil); err == nil {
		t.Errorf("ExchangeSRQClient with %d addresses: no error", MaxQP+1)
	}
}

// TestCompletionError: a failed completion's error matches its status's goroce error.
func TestCompletionError(t *testing.T) {
	err := error(&CompletionError{Completion: goroce.Completion{WRID: sendWRID, Status: goroce.StatusRetryExcErr}})
	if !errors.Is(err, goroce.ErrRetryExceeded) {
		t.Errorf("%v does not match goroce.ErrRetryExceeded", err)
	}
	if want := "failed status transport retry counter exceeded (12) for wr_id 2"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}
