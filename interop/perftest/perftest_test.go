package perftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
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

// The result lines interop/perftest_test.go parses in perftest's output and goroce's.
var (
	bwLine  = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+(\d+\.\d{6})$`)
	latLine = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)(\s+\d+\.\d\d){7}\s*$`)
)

type side struct {
	out string
	res Result
	err error
}

// runPair runs a goroce server and client of one test against each other on loopback: TCP on an
// ephemeral port of the server's address, the devices on srv.Addr (the TCP address when unset) and
// cli.Addr.
func runPair(t *testing.T, srvAddr netip.Addr, srv, cli Options) (s, c side) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
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
	if c.err != nil || s.err != nil {
		t.Fatalf("client: %v\n%s\nserver: %v\n%s", c.err, c.out, s.err, s.out)
	}
	return s, c
}

func TestLoopback(t *testing.T) {
	cases := []struct {
		test      Test
		size      int
		cas, all  bool
		srvResult bool // the server prints a result line
		same      bool // ... and it is the client's (bandwidth reports)
		tcpDevice bool // the server's device takes the TCP connection's address
		mem       bool // the devices talk over a goroce.MemNetwork
	}{
		{test: WriteBW, size: 65536, srvResult: true, same: true},
		{test: ReadBW, size: 10000, srvResult: true, same: true, tcpDevice: true},
		{test: AtomicBW, size: 8, srvResult: true, same: true},
		{test: AtomicBW, size: 8, cas: true, srvResult: true, same: true},
		{test: SendBW, size: 4096, srvResult: true},
		{test: ReadLat, size: 64},
		{test: SendLat, size: 3000, srvResult: true},
		{test: WriteBW, all: true, srvResult: true, same: true},
		{test: SendLat, all: true, srvResult: true},
		{test: WriteLat, size: 64, srvResult: true},
		{test: WriteBW, size: 100000, srvResult: true, same: true, mem: true},
	}
	for _, c := range cases {
		n := fmt.Sprintf("%s-%d", c.test, c.size)
		if c.cas {
			n += "-cas"
		}
		if c.all {
			n = string(c.test) + "-all"
		}
		if c.tcpDevice {
			n += "-tcpaddr"
		}
		if c.mem {
			n += "-memnetwork"
		}
		t.Run(n, func(t *testing.T) {
			if c.test == WriteLat && raceEnabled {
				t.Skip("write_lat polls memory the peer's WRITEs change, which the race detector reports")
			}
			sa, ca := loopbackAddrs()
			o := DefaultOptions(c.test)
			o.Size, o.Iters, o.GIDIndex, o.MTU = c.size, 50, 1, goroce.MTU1024
			o.AtomicCAS, o.All = c.cas, c.all
			if c.all {
				o.Iters = 5
			}
			if c.mem {
				o.Network = goroce.NewMemNetwork()
			}
			srv, cli := o, o
			cli.Addr = ca
			if !c.tcpDevice {
				srv.Addr = sa
			}
			s, cl := runPair(t, sa, srv, cli)
			re := bwLine
			if c.test.Latency() {
				re = latLine
			}
			sizes := o.Sizes()
			lines := re.FindAllStringSubmatch(cl.out, -1)
			if len(lines) != len(sizes) {
				t.Fatalf("client printed %d result lines, want %d:\n%s", len(lines), len(sizes), cl.out)
			}
			for i, m := range lines {
				if m[1] != fmt.Sprint(sizes[i]) || m[2] != fmt.Sprint(o.Iters) {
					t.Errorf("client result line %q: want size %d, %d iterations", m[0], sizes[i], o.Iters)
				}
			}
			sl := re.FindAllStringSubmatch(s.out, -1)
			switch {
			case !c.srvResult && len(sl) != 0:
				t.Errorf("server printed results:\n%s", s.out)
			case c.srvResult && len(sl) == 0:
				t.Errorf("server printed no result:\n%s", s.out)
			case c.same && sl[len(sl)-1][0] != lines[len(lines)-1][0]:
				t.Errorf("server printed %q, not the client's %q", sl[len(sl)-1][0], lines[len(lines)-1][0])
			}
			for _, out := range []string{s.out, cl.out} {
				if !strings.Contains(out, c.test.Title(c.cas)) || !strings.Contains(out, " Mtu             : 1024[B]") ||
					!strings.Contains(out, " GID index       : 1\n") {
					t.Errorf("header block missing:\n%s", out)
				}
			}
			if !strings.Contains(s.out, "* Waiting for client to connect... *") {
				t.Errorf("server printed no banner:\n%s", s.out)
			}

			// The results say what the output says.
			if c.test.Latency() {
				if len(cl.res.Lat) != len(sizes) || cl.res.BW != nil {
					t.Errorf("client result: %+v", cl.res)
				}
				for i, l := range cl.res.Lat {
					if l.Size != sizes[i] || l.Iters != o.Iters || l.Min <= 0 || l.Min > l.Typical || l.Typical > l.Max {
						t.Errorf("client latency %+v", l)
					}
				}
			} else {
				if len(cl.res.BW) != len(sizes) || cl.res.Lat != nil {
					t.Errorf("client result: %+v", cl.res)
				}
				for i, r := range cl.res.BW {
					if r.Size != uint64(sizes[i]) || r.Iters != uint64(o.Iters) || r.BWAvg <= 0 {
						t.Errorf("client bandwidth %+v", r)
					}
				}
				if c.same && (len(s.res.BW) != 1 || s.res.BW[0] != cl.res.BW[len(cl.res.BW)-1]) {
					t.Errorf("server reports %+v, not the client's last %+v", s.res.BW, cl.res.BW)
				}
			}
			if s.res.Remote != cl.res.Local || cl.res.Remote != s.res.Local {
				t.Errorf("the sides disagree on the keys: server %+v / %+v, client %+v / %+v",
					s.res.Local, s.res.Remote, cl.res.Local, cl.res.Remote)
			}
			if s.res.Local.GID != goroce.GIDFromAddr(sa) || cl.res.Local.GID != goroce.GIDFromAddr(ca) {
				t.Errorf("GIDs %v and %v, want %v and %v", s.res.Local.GID, cl.res.Local.GID, sa, ca)
			}
			if s.res.Hello.MTU != goroce.MTU1024 || cl.res.Hello.RemoteVersion != Version {
				t.Errorf("hello: server %+v, client %+v", s.res.Hello, cl.res.Hello)
			}
			for _, st := range []*goroce.Stats{s.res.Stats, cl.res.Stats} {
				if st == nil || st.RxPackets == 0 || st.TxPackets == 0 {
					t.Errorf("stats: %+v", st)
				}
			}
		})
	}
}

// TestMTUNegotiation: the sides run at the smaller of their MTUs, and the zero MTU means 4096.
func TestMTUNegotiation(t *testing.T) {
	sa, ca := loopbackAddrs()
	o := DefaultOptions(WriteBW)
	o.Iters = 10
	srv, cli := o, o
	srv.Addr, cli.Addr = sa, ca
	cli.MTU = goroce.MTU2048
	s, c := runPair(t, sa, srv, cli)
	for _, x := range []side{s, c} {
		if x.res.Hello.MTU != goroce.MTU2048 || !strings.Contains(x.out, " Mtu             : 2048[B]") {
			t.Errorf("MTU %v, want 2048:\n%s", x.res.Hello.MTU, x.out)
		}
		if strings.Contains(x.out, "GID index") {
			t.Errorf("GIDIndex -1 printed a GID index:\n%s", x.out)
		}
	}
}

// TestServeCanceled: a server nobody connects to ends with its context, and says so.
func TestServeCanceled(t *testing.T) {
	sa, _ := loopbackAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	srv, err := Listen(ctx, netip.AddrPortFrom(sa, 0).String(), DefaultOptions(ReadLat))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Serve(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Serve = %v, want context.DeadlineExceeded", err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("Close after Serve: %v", err)
	}
}

func TestOptions(t *testing.T) {
	for _, test := range Tests() {
		o := DefaultOptions(test)
		if err := o.Validate(); err != nil {
			t.Errorf("DefaultOptions(%s): %v", test, err)
		}
		if p, ok := ParseTest("ib_" + string(test)); !ok || p != test {
			t.Errorf("ParseTest(ib_%s) = %q, %v", test, p, ok)
		}
	}
	if o := DefaultOptions(AtomicBW); o.Size != 8 || o.Iters != 5000 || len(o.Sizes()) != 1 || o.Sizes()[0] != 8 {
		t.Errorf("atomic_bw defaults %+v, sizes %v", o, o.Sizes())
	}
	if o := DefaultOptions(SendLat); o.Size != 2 || o.Iters != 1000 {
		t.Errorf("send_lat defaults %+v", o)
	}
	o := DefaultOptions(WriteBW)
	o.All = true
	if s := o.Sizes(); len(s) != 23 || s[0] != 2 || s[22] != 1<<23 {
		t.Errorf("Sizes with All = %v", s)
	}
	if _, ok := ParseTest("rdma_bw"); ok {
		t.Error("ParseTest accepted rdma_bw")
	}
	for name, mod := range map[string]func(*Options){
		"unknown test":    func(o *Options) { o.Test = "rdma_bw" },
		"-a on atomics":   func(o *Options) { o.Test, o.All = AtomicBW, true },
		"iters 1":         func(o *Options) { o.Iters = 1 },
		"size 0":          func(o *Options) { o.Size = 0 },
		"tx depth 0":      func(o *Options) { o.TxDepth = 0 },
		"outs 129":        func(o *Options) { o.OutReads = 129 },
		"MTU 6":           func(o *Options) { o.MTU = 6 },
		"cq moderation 0": func(o *Options) { o.CQMod = 0 },
	} {
		o := DefaultOptions(WriteBW)
		mod(&o)
		if err := o.Validate(); !errors.Is(err, ErrBadOptions) {
			t.Errorf("%s: Validate = %v, want ErrBadOptions", name, err)
		}
		if _, err := Connect(context.Background(), "127.0.0.1:1", o, nil); !errors.Is(err, ErrBadOptions) {
			t.Errorf("%s: Connect = %v, want ErrBadOptions", name, err)
		}
	}
}

// TestCompletionError: a failed completion's error matches its status's goroce error.
func TestCompletionError(t *testing.T) {
	err := error(&CompletionError{Side: "client", Completion: goroce.Completion{WRID: 7, Status: goroce.StatusRemAccessErr}})
	if !errors.Is(err, goroce.ErrRemoteAccess) {
		t.Errorf("%v does not match goroce.ErrRemoteAccess", err)
	}
	if want := "completion with error at client: remote access error (10), wr_id 7"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}
