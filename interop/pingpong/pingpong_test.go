package pingpong

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// loopbackAddrs returns two distinct addresses in 127.0.0.0/8 for one test, so that tests whose
// devices bind port 4791 on loopback do not collide (as the root package's tests pick theirs).
func loopbackAddrs() (netip.Addr, netip.Addr) {
	x := rand.Uint32N(1 << 14)
	return netip.AddrFrom4([4]byte{127, byte(1 + x>>7), byte(x & 0x7F), 1}),
		netip.AddrFrom4([4]byte{127, byte(1 + x>>7), byte(x & 0x7F), 2})
}

// lockedBuffer is a bytes.Buffer one goroutine writes while another reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

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
	var sb, cb lockedBuffer
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
			sa, ca := loopbackAddrs()
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

// TestCheckCatchesWrongData runs a server with Check against a client without it: the client sends
// its buffer without rc_pingpong's check pattern, so the server must report every page.
func TestCheckCatchesWrongData(t *testing.T) {
	sa, ca := loopbackAddrs()
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
	sa, _ := loopbackAddrs()
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
	for name, mod := range map[string]func(*Options){
		"rx depth 1":         func(o *Options) { o.RxDepth = 1 },
		"size 0":             func(o *Options) { o.Size = 0 },
		"iters 0":            func(o *Options) { o.Iters = 0 },
		"MTU 0":              func(o *Options) { o.MTU = 0 },
		"UD larger than MTU": func(o *Options) { o.Type, o.Size = goroce.UD, 1025 },
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
