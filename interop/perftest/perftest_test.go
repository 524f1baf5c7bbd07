package perftest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/internal/syncbuf"
	"github.com/goroce/goroce/internal/testaddr"
)

// The result lines interop/perftest_test.go parses in perftest's output and goroce's.
var (
	bwLine     = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+(\d+\.\d{6})$`)
	bwLineAny  = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+(\d+\.\d{2,6})\s+(\d+\.\d{2,6})\s+(\d+\.\d{6})$`)
	latLine    = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)(\s+\d+\.\d\d){7}\s*$`)
	latDurLine = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s*$`)
)

type side struct {
	out string
	res Result
	err error
}

// serveConnect runs a goroce server on an ephemeral TCP port of srvAddr and a goroce client against
// it, and returns what each printed and returned once both have ended.
func serveConnect(ctx context.Context, t *testing.T, srvAddr netip.Addr, srv, cli Options) (s, c side) {
	t.Helper()
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

// runPair runs a goroce server and client of one test against each other on loopback: TCP on an
// ephemeral port of the server's address, the devices on srv.Addr (the TCP address when unset) and
// cli.Addr.
func runPair(t *testing.T, srvAddr netip.Addr, srv, cli Options) (s, c side) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, c = serveConnect(ctx, t, srvAddr, srv, cli)
	if c.err != nil || s.err != nil {
		t.Logf("client stats %+v\nserver stats %+v", c.res.Stats, s.res.Stats)
		t.Fatalf("client: %v\n%s\nserver: %v\n%s", c.err, c.out, s.err, s.out)
	}
	return s, c
}

// shortGraces shortens, for one test, the waits after which a side concludes that the peer runs
// other settings: on loopback the peer answers in milliseconds, and perftest's grace of seconds would
// make each mismatch take them.
func shortGraces(t *testing.T) {
	p, m, s := promptLimit, moveOnGrace, silentPeerGrace
	promptLimit, moveOnGrace, silentPeerGrace = 2*time.Second, 500*time.Millisecond, time.Second
	t.Cleanup(func() { promptLimit, moveOnGrace, silentPeerGrace = p, m, s })
}

// testTimeout is the QPs' ACK timeout in these tests: 4.096 us * 2^20, about 4 s, for eight
// attempts, where perftest's 14 (67 ms) gives up after half a second. The tests check what the
// perftest peer does, not the transport's timers, and a loaded machine running them under the race
// detector can leave a device's goroutines unscheduled for that long.
const testTimeout = 20

// loopbackCase is one goroce-to-goroce run of TestLoopback: a test, perftest's defaults changed by
// opts on both sides, and what each side prints.
type loopbackCase struct {
	name string
	test Test
	opts func(o *Options)
	// srvResult: the server prints result lines; same: the client's (reports, or a bidirectional
	// run's sum, which both sides print alike).
	srvResult, same bool
	tcpDevice       bool // the server's device takes the TCP connection's address
	mem             bool // the devices talk over a goroce.MemNetwork
	race            bool // the run polls memory the peer's WRITEs change: skipped under the race detector
}

func TestLoopback(t *testing.T) {
	sz := func(n int) func(o *Options) { return func(o *Options) { o.Size = n } }
	and := func(fs ...func(o *Options)) func(o *Options) {
		return func(o *Options) {
			for _, f := range fs {
				f(o)
			}
		}
	}
	cases := []loopbackCase{
		{name: "write_bw", test: WriteBW, opts: sz(65536), srvResult: true, same: true},
		{name: "read_bw-tcpaddr", test: ReadBW, opts: sz(10000), srvResult: true, same: true, tcpDevice: true},
		{name: "atomic_bw", test: AtomicBW, srvResult: true, same: true},
		{name: "atomic_bw-cas", test: AtomicBW, opts: func(o *Options) { o.AtomicCAS = true }, srvResult: true, same: true},
		{name: "send_bw", test: SendBW, opts: sz(4096), srvResult: true},
		{name: "read_lat", test: ReadLat, opts: sz(64)},
		{name: "atomic_lat", test: AtomicLat},
		{name: "atomic_lat-cas", test: AtomicLat, opts: func(o *Options) { o.AtomicCAS = true }},
		{name: "send_lat", test: SendLat, opts: sz(3000), srvResult: true},
		{name: "write_bw-all", test: WriteBW, opts: func(o *Options) { o.All, o.Iters = true, 5 }, srvResult: true, same: true},
		{name: "send_bw-all", test: SendBW, opts: func(o *Options) { o.All, o.Iters = true, 5 }, srvResult: true},
		{name: "read_bw-all", test: ReadBW, opts: func(o *Options) { o.All, o.Iters = true, 5 }, srvResult: true, same: true},
		{name: "send_lat-all", test: SendLat, opts: func(o *Options) { o.All, o.Iters = true, 5 }, srvResult: true},
		{name: "read_lat-all", test: ReadLat, opts: func(o *Options) { o.All, o.Iters = true, 5 }},
		{name: "write_lat", test: WriteLat, opts: sz(64), srvResult: true, race: true},
		{name: "write_lat-all", test: WriteLat, opts: func(o *Options) { o.All, o.Iters = true, 5 }, srvResult: true, race: true},
		{name: "write_bw-memnetwork", test: WriteBW, opts: sz(100000), srvResult: true, same: true, mem: true},
		{name: "write_bw-q4", test: WriteBW, opts: and(sz(8192), func(o *Options) { o.QPs = 4 }), srvResult: true, same: true},
		{name: "read_bw-q3", test: ReadBW, opts: and(sz(8192), func(o *Options) { o.QPs = 3 }), srvResult: true, same: true},
		{name: "atomic_bw-q2", test: AtomicBW, opts: func(o *Options) { o.QPs = 2 }, srvResult: true, same: true},
		{name: "send_bw-q3", test: SendBW, opts: and(sz(8192), func(o *Options) { o.QPs = 3 }), srvResult: true},
		{name: "write_bw-q2-mr_per_qp", test: WriteBW, opts: and(sz(8192), func(o *Options) { o.QPs, o.MRPerQP = 2, true }), srvResult: true, same: true},
		{name: "send_bw-q2-all", test: SendBW, opts: func(o *Options) { o.QPs, o.All, o.Iters = 2, true, 5 }, srvResult: true},
		{name: "write_bw-b", test: WriteBW, opts: and(sz(8192), func(o *Options) { o.Bidirectional = true }), srvResult: true, same: true},
		{name: "read_bw-b", test: ReadBW, opts: and(sz(8192), func(o *Options) { o.Bidirectional = true }), srvResult: true, same: true},
		{name: "atomic_bw-b", test: AtomicBW, opts: func(o *Options) { o.Bidirectional = true }, srvResult: true, same: true},
		{name: "send_bw-b", test: SendBW, opts: and(sz(8192), func(o *Options) { o.Bidirectional = true }), srvResult: true, same: true},
		{name: "write_bw-b-q2-all-report-both", test: WriteBW, opts: func(o *Options) { o.Bidirectional, o.QPs, o.All, o.Iters, o.ReportBoth = true, 2, true, 5, true },
			srvResult: true, same: true},
		{name: "send_bw-b-all", test: SendBW, opts: func(o *Options) { o.Bidirectional, o.All, o.Iters = true, true, 5 }, srvResult: true, same: true},
		{name: "write_bw-b-report-both", test: WriteBW, opts: and(sz(4096), func(o *Options) { o.Bidirectional, o.ReportBoth = true, true }), srvResult: true, same: true},
		{name: "write_bw-gbits", test: WriteBW, opts: and(sz(65536), func(o *Options) { o.ReportGbits = true }), srvResult: true, same: true},
		{name: "write_bw-inline-postlist", test: WriteBW, opts: and(sz(200), func(o *Options) { o.InlineSize, o.PostList, o.TxDepth = 256, 8, 32 }),
			srvResult: true, same: true},
		{name: "send_bw-inline-postlists", test: SendBW, opts: and(sz(100), func(o *Options) { o.InlineSize, o.PostList, o.RecvPostList = 128, 4, 4 }),
			srvResult: true},
		{name: "send_lat-inline", test: SendLat, opts: and(sz(64), func(o *Options) { o.InlineSize = 64 }), srvResult: true},
		{name: "write_bw-warmup-nopeak-tclass-timeout", test: WriteBW, opts: and(sz(4096), func(o *Options) { o.WarmUp, o.NoPeak, o.TrafficClass, o.Timeout = true, true, 0x20, 19 }),
			srvResult: true, same: true},
		{name: "read_bw-dont_xchg_versions", test: ReadBW, opts: and(sz(4096), func(o *Options) { o.NoVersionExchange = true }), srvResult: true, same: true},
		{name: "read_lat-histogram", test: ReadLat, opts: and(sz(64), func(o *Options) { o.Histogram, o.Unsorted = true, true })},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.race && raceEnabled {
				t.Skip("write_lat polls memory the peer's WRITEs change, which the race detector reports")
			}
			o := DefaultOptions(c.test)
			o.Iters, o.GIDIndex, o.MTU, o.Timeout = 50, 1, goroce.MTU1024, testTimeout
			if c.opts != nil {
				c.opts(&o)
			}
			s, cl := runLoopback(t, c, o)
			checkLoopback(t, c, o, s, cl)
		})
	}
}

// TestLoopbackDuration runs each test for a fifth of a second (no margin; perftest's -D takes whole
// seconds, the package fractions): the figures count what completed within the window.
func TestLoopbackDuration(t *testing.T) {
	for _, c := range []loopbackCase{
		{name: "write_bw", test: WriteBW, srvResult: true, same: true},
		{name: "read_bw-q2", test: ReadBW, opts: func(o *Options) { o.QPs = 2 }, srvResult: true, same: true},
		{name: "send_bw", test: SendBW, srvResult: true},
		{name: "send_bw-b", test: SendBW, opts: func(o *Options) { o.Bidirectional = true }, srvResult: true},
		{name: "write_bw-b", test: WriteBW, opts: func(o *Options) { o.Bidirectional = true }, srvResult: true, same: true},
		{name: "atomic_bw", test: AtomicBW, srvResult: true, same: true},
		{name: "read_lat", test: ReadLat},
		{name: "atomic_lat", test: AtomicLat},
		{name: "send_lat", test: SendLat, srvResult: true},
		{name: "write_lat", test: WriteLat, srvResult: true, race: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.race && raceEnabled {
				t.Skip("write_lat polls memory the peer's WRITEs change, which the race detector reports")
			}
			o := DefaultOptions(c.test)
			// A second, not less: a timed run counts what completes inside its window, and under the
			// race detector on a loaded machine the first completions of a bidirectional run came
			// after 200 ms, so a 200 ms run counted none.
			o.Size, o.Duration, o.GIDIndex, o.MTU, o.Timeout = 4096, time.Second, 1, goroce.MTU1024, testTimeout
			if c.test.Verb() == Atomic || c.test.Latency() {
				o.Size = DefaultOptions(c.test).Size
			}
			if c.opts != nil {
				c.opts(&o)
			}
			s, cl := runLoopback(t, c, o)
			checkLoopback(t, c, o, s, cl)
		})
	}
}

// runLoopback runs c with options o on both sides.
func runLoopback(t *testing.T, c loopbackCase, o Options) (s, cl side) {
	t.Helper()
	sa, ca := testaddr.Pair()
	if c.mem {
		o.Network = goroce.NewMemNetwork()
	}
	srv, cli := o, o
	cli.Addr = ca
	if !c.tcpDevice {
		srv.Addr = sa
	}
	return runPair(t, sa, srv, cli)
}

// checkLoopback checks both sides' output and results.
func checkLoopback(t *testing.T, c loopbackCase, o Options, s, cl side) {
	t.Helper()
	re := bwLine
	switch {
	case c.test.Latency() && o.Duration > 0:
		re = latDurLine
	case c.test.Latency():
		re = latLine
	case o.ReportGbits:
		re = bwLineAny
	}
	sizes := o.Sizes()
	timed := o.Duration > 0
	lines := re.FindAllStringSubmatch(cl.out, -1)
	both := o.ReportBoth && o.Bidirectional && !o.All
	if both && len(lines) == 3 {
		// The sum, then the local and the remote figures.
		lines = lines[:1]
	}
	if len(lines) != len(sizes) {
		t.Fatalf("client printed %d result lines, want %d:\n%s", len(lines), len(sizes), cl.out)
	}
	iters := o.Iters * o.QPs
	if c.test.Latency() {
		iters = o.Iters
	}
	for i, m := range lines {
		if m[1] != fmt.Sprint(sizes[i]) || (!timed && m[2] != fmt.Sprint(iters)) || (timed && m[2] == "0") {
			t.Errorf("client result line %q: want size %d, %d iterations", m[0], sizes[i], iters)
		}
	}
	sl := re.FindAllStringSubmatch(s.out, -1)
	if both {
		for _, x := range []string{" Local results: ", " Remote results: "} {
			if !strings.Contains(cl.out, x) || !strings.Contains(s.out, x) {
				t.Errorf("no %q:\n%s", x, cl.out)
			}
		}
		if len(sl) == 3 {
			sl = sl[:1]
		}
	}
	switch {
	case !c.srvResult && len(sl) != 0:
		t.Errorf("server printed results:\n%s", s.out)
	case c.srvResult && len(sl) == 0:
		t.Errorf("server printed no result:\n%s", s.out)
	case c.same && sl[len(sl)-1][0] != lines[len(lines)-1][0] && !(timed && o.Bidirectional):
		t.Errorf("server printed %q, not the client's %q", sl[len(sl)-1][0], lines[len(lines)-1][0])
	}
	title := c.test.title(o.AtomicCAS, o.Bidirectional)
	for _, out := range []string{s.out, cl.out} {
		if !strings.Contains(out, title) || !strings.Contains(out, " Mtu             : 1024[B]") ||
			!strings.Contains(out, " GID index       : 1\n") || !strings.Contains(out, fmt.Sprintf(" Number of qps   : %d\t", o.QPs)) {
			t.Errorf("header block missing:\n%s", out)
		}
		if n := strings.Count(out, " remote address: "); n != o.QPs {
			t.Errorf("%d remote addresses printed, want %d:\n%s", n, o.QPs, out)
		}
	}
	if !strings.Contains(s.out, "* Waiting for client to connect... *") {
		t.Errorf("server printed no banner:\n%s", s.out)
	}
	if (o.Histogram || o.Unsorted) && strings.Count(cl.out, "#, usec\n") != 2 {
		t.Errorf("want an unsorted and a sorted histogram:\n%s", cl.out)
	}

	// The results say what the output says.
	if c.test.Latency() {
		if len(cl.res.Lat) != len(sizes) || cl.res.BW != nil {
			t.Errorf("client result: %+v", cl.res)
		}
		for i, l := range cl.res.Lat {
			switch {
			case l.Size != sizes[i]:
				t.Errorf("client latency %+v", l)
			case timed && (l.Iters <= 0 || l.Avg <= 0 || l.TPS <= 0):
				t.Errorf("client latency of a timed run %+v", l)
			case !timed && (l.Iters != o.Iters || l.Min <= 0 || l.Min > l.Typical || l.Typical > l.Max):
				t.Errorf("client latency %+v", l)
			}
		}
	} else {
		want := len(sizes)
		if len(cl.res.BW) != want || cl.res.Lat != nil {
			t.Errorf("client result: %+v", cl.res)
		}
		for i, r := range cl.res.BW {
			if r.Size != uint64(sizes[i]) || (!timed && r.Iters != uint64(iters)) || r.BWAvg <= 0 || (timed && r.BWPeak != 0) {
				t.Errorf("client bandwidth %+v", r)
			}
		}
		if c.same && !o.Bidirectional && (len(s.res.BW) != 1 || s.res.BW[0] != cl.res.BW[len(cl.res.BW)-1]) {
			t.Errorf("server reports %+v, not the client's last %+v", s.res.BW, cl.res.BW)
		}
		if c.same && o.Bidirectional && !slices.EqualFunc(s.res.BW, cl.res.BW, func(a, b BWReport) bool {
			// Each side prints its own count of messages, which differ in a timed run.
			return a.BWAvg == b.BWAvg && a.BWPeak == b.BWPeak && a.MsgRate == b.MsgRate && (timed || a.Iters == b.Iters)
		}) {
			t.Errorf("bidirectional sums differ: server %+v, client %+v", s.res.BW, cl.res.BW)
		}
	}
	if !slices.Equal(s.res.Remotes, cl.res.Locals) || !slices.Equal(cl.res.Remotes, s.res.Locals) || len(s.res.Locals) != o.QPs {
		t.Errorf("the sides disagree on the keys: server %+v / %+v, client %+v / %+v",
			s.res.Locals, s.res.Remotes, cl.res.Locals, cl.res.Remotes)
	}
	if s.res.Local != s.res.Locals[0] || cl.res.Remote != cl.res.Remotes[0] {
		t.Errorf("Local and Remote are not the first QP's")
	}
	if s.res.Hello.MTU != goroce.MTU1024 || cl.res.Hello.RemoteVersion != Version {
		t.Errorf("hello: server %+v, client %+v", s.res.Hello, cl.res.Hello)
	}
	for _, st := range []*goroce.Stats{s.res.Stats, cl.res.Stats} {
		if st == nil || st.RxPackets == 0 || st.TxPackets == 0 {
			t.Errorf("stats: %+v", st)
		}
	}
}

// TestMTUNegotiation: the sides run at the smaller of their MTUs, and the zero MTU means 4096.
func TestMTUNegotiation(t *testing.T) {
	sa, ca := testaddr.Pair()
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
	sa, _ := testaddr.Pair()
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
	// perftest's defaults: DEF_ITERS_WB for write_bw only, DEF_ITERS for the others.
	if o := DefaultOptions(AtomicBW); o.Size != 8 || o.Iters != 1000 || len(o.Sizes()) != 1 || o.Sizes()[0] != 8 {
		t.Errorf("atomic_bw defaults %+v, sizes %v", o, o.Sizes())
	}
	if o := DefaultOptions(WriteBW); o.Size != 65536 || o.Iters != 5000 || o.TxDepth != 128 || o.QPs != 1 || o.Timeout != 14 {
		t.Errorf("write_bw defaults %+v", o)
	}
	if o := DefaultOptions(SendLat); o.Size != 2 || o.Iters != 1000 || o.TxDepth != 1 {
		t.Errorf("send_lat defaults %+v", o)
	}
	if o := DefaultOptions(AtomicLat); o.Size != 8 || AtomicLat.AllSizes() || !SendBW.AllSizes() {
		t.Errorf("atomic_lat defaults %+v", o)
	}
	for _, c := range []struct {
		d, f, want time.Duration
	}{{5 * time.Second, -1, time.Second}, {2 * time.Second, -1, 0}, {10 * time.Second, 3 * time.Second, 3 * time.Second}} {
		o := Options{Duration: c.d, Margin: c.f}
		if got := o.margin(); got != c.want {
			t.Errorf("margin of -D %v -f %v = %v, want %v", c.d, c.f, got, c.want)
		}
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
		"unknown test":              func(o *Options) { o.Test = "rdma_bw" },
		"-a on atomics":             func(o *Options) { o.Test, o.All = AtomicBW, true },
		"-a on atomic_lat":          func(o *Options) { o.Test, o.All = AtomicLat, true },
		"iters 1":                   func(o *Options) { o.Iters = 1 },
		"iters 4":                   func(o *Options) { o.Iters = 4 },
		"size 0":                    func(o *Options) { o.Size = 0 },
		"size 16 MiB":               func(o *Options) { o.Size = 16 << 20 },
		"tx depth 0":                func(o *Options) { o.TxDepth = 0 },
		"outs 129":                  func(o *Options) { o.OutReads = 129 },
		"MTU 6":                     func(o *Options) { o.MTU = 6 },
		"cq moderation 0":           func(o *Options) { o.CQMod = 0 },
		"-q 0":                      func(o *Options) { o.QPs = 0 },
		"-q on a latency test":      func(o *Options) { o.Test, o.QPs = SendLat, 2 },
		"-b on a latency test":      func(o *Options) { o.Test, o.Bidirectional = ReadLat, true },
		"-D with -a":                func(o *Options) { o.Duration, o.All = 5*time.Second, true },
		"-D 2 -f 1":                 func(o *Options) { o.Duration, o.Margin = 2*time.Second, time.Second },
		"-D negative":               func(o *Options) { o.Duration = -time.Second },
		"run_infinitely on latency": func(o *Options) { o.Test, o.RunInfinitely = WriteLat, true },
		"run_infinitely -b send_bw": func(o *Options) { o.Test, o.RunInfinitely, o.Bidirectional = SendBW, true, true },
		"inline 913":                func(o *Options) { o.InlineSize = 913 },
		"post list on a latency":    func(o *Options) { o.Test, o.PostList = SendLat, 4 },
		"post list 0":               func(o *Options) { o.PostList = 0 },
		"histogram on bandwidth":    func(o *Options) { o.Histogram = true },
		"warm up on send_bw":        func(o *Options) { o.Test, o.WarmUp = SendBW, true },
		"QP timeout 32":             func(o *Options) { o.Timeout = 32 },
		"negative bandwidth limit":  func(o *Options) { o.LimitBW = -1 },
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

// garbage matches a bandwidth result line whose size or count no run has: what perftest prints when
// it reads a key message as a report (3472328296395452464 is "00000000" read as an integer).
var garbage = regexp.MustCompile(`(?m)^ \d{10,}\s+\d+|^ \d+\s+\d{11,}\s`)

// runMismatch runs a goroce server and client of different options against each other: both must
// return well before ctx ends, and neither may print a garbage line.
func runMismatch(t *testing.T, srv, cli Options) (s, c side) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	sa, ca := testaddr.Pair()
	srv.Addr, cli.Addr = sa, ca
	s, c = serveConnect(ctx, t, sa, srv, cli)
	if ctx.Err() != nil {
		t.Fatalf("the run did not end: client %v, server %v\nclient:\n%s\nserver:\n%s", c.err, s.err, c.out, s.out)
	}
	for _, x := range []side{s, c} {
		if m := garbage.FindString(x.out); m != "" {
			t.Errorf("garbage result line %q:\n%s", m, x.out)
		}
	}
	return s, c
}

// TestMismatch runs goroce against goroce with one setting different on one side, each of which
// perftest itself misses (and then prints garbage or waits forever): the run must end on both sides,
// and at least one must say that the settings differ, with the flag.
func TestMismatch(t *testing.T) {
	shortGraces(t)
	base := func(test Test) Options {
		o := DefaultOptions(test)
		o.GIDIndex = 1
		o.Size, o.Iters, o.MTU, o.Timeout = 4096, 20, goroce.MTU1024, testTimeout
		if test.Latency() {
			o.Size = 64
		}
		return o
	}
	type mod func(o *Options)
	cases := []struct {
		name     string
		srv, cli Test
		srvMod   mod
		cliMod   mod
		// want is a word the mismatch error of one side must hold.
		want string
	}{
		{"write_bw client -q 2", WriteBW, WriteBW, nil, func(o *Options) { o.QPs = 2 }, "-q"},
		{"write_bw server -q 2", WriteBW, WriteBW, func(o *Options) { o.QPs = 2 }, nil, "-q"},
		{"read_bw client -q 3", ReadBW, ReadBW, nil, func(o *Options) { o.QPs = 3 }, "-q"},
		{"send_bw client -q 2", SendBW, SendBW, nil, func(o *Options) { o.QPs = 2 }, "-q"},
		{"send_bw server -q 2", SendBW, SendBW, func(o *Options) { o.QPs = 2 }, nil, "-q"},
		{"write_bw sizes", WriteBW, WriteBW, nil, func(o *Options) { o.Size = 8192 }, "-s"},
		{"write_bw iterations", WriteBW, WriteBW, nil, func(o *Options) { o.Iters = 40 }, "-n"},
		{"write_bw client -b", WriteBW, WriteBW, nil, func(o *Options) { o.Bidirectional = true }, "-b"},
		{"write_bw server -b", WriteBW, WriteBW, func(o *Options) { o.Bidirectional = true }, nil, "-b"},
		{"read_bw client -b", ReadBW, ReadBW, nil, func(o *Options) { o.Bidirectional = true }, "-b"},
		{"atomic_bw server -b", AtomicBW, AtomicBW, func(o *Options) { o.Bidirectional = true }, nil, "-b"},
		{"send_bw client -b", SendBW, SendBW, nil, func(o *Options) { o.Bidirectional = true }, "-b"},
		{"send_bw server -b", SendBW, SendBW, func(o *Options) { o.Bidirectional = true }, nil, "-b"},
		{"write_bw client -a", WriteBW, WriteBW, nil, func(o *Options) { o.All, o.Iters = true, 5 }, "-a"},
		{"write_bw server -a", WriteBW, WriteBW, func(o *Options) { o.All, o.Iters = true, 5 }, nil, "-a"},
		{"send_bw client -a", SendBW, SendBW, nil, func(o *Options) { o.All, o.Iters = true, 5 }, ""},
		{"write_bw client -D", WriteBW, WriteBW, nil, func(o *Options) { o.Duration = 200 * time.Millisecond }, "-D"},
		{"send_lat iterations", SendLat, SendLat, nil, func(o *Options) { o.Iters = 40 }, "-n"},
		{"write_bw server, send_bw client", WriteBW, SendBW, nil, nil, "the test"},
		{"write_bw client --report_gbits", WriteBW, WriteBW, nil, func(o *Options) { o.ReportGbits = true }, "--report_gbits"},
		{"read_bw client --dont_xchg_versions", ReadBW, ReadBW, nil, func(o *Options) { o.NoVersionExchange = true }, "--dont_xchg_versions"},
		{"read_bw server --dont_xchg_versions", ReadBW, ReadBW, func(o *Options) { o.NoVersionExchange = true }, nil, "--dont_xchg_versions"},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			srv, cli := base(c.srv), base(c.cli)
			if c.srvMod != nil {
				c.srvMod(&srv)
			}
			if c.cliMod != nil {
				c.cliMod(&cli)
			}
			s, cl := runMismatch(t, srv, cli)
			var found bool
			for _, x := range []side{s, cl} {
				if errors.Is(x.err, ErrMismatch) && strings.Contains(x.err.Error(), c.want) {
					found = true
				}
			}
			if !found {
				t.Errorf("no side reports the mismatch (%q):\nserver: %v\n%s\nclient: %v\n%s", c.want, s.err, s.out, cl.err, cl.out)
			}
			t.Logf("server: %v", s.err)
			t.Logf("client: %v", cl.err)
		})
	}
}

// TestAccess: the rights a run grants the peer are perftest's (create_mr and ctx_modify_qp_to_init in
// perftest_resources.c), on the region and on the QPs alike.
func TestAccess(t *testing.T) {
	for _, c := range []struct {
		v          Verb
		region, qp goroce.Access
	}{
		{Write, goroce.LocalWrite | goroce.RemoteWrite, goroce.RemoteWrite},
		{Read, goroce.LocalWrite | goroce.RemoteRead, goroce.RemoteRead},
		{Atomic, goroce.LocalWrite | goroce.RemoteAtomic, goroce.RemoteAtomic},
		{Send, goroce.LocalWrite, goroce.RemoteWrite},
	} {
		if r, q := access(c.v); r != c.region || q != c.qp {
			t.Errorf("%v: region %v, QPs %v; want %v, %v", c.v, r, q, c.region, c.qp)
		}
	}
}

// TestAccessRights: a goroce server grants the peer exactly what the perftest tool it imitates grants:
// a write_bw server takes WRITEs only, a read_bw server READs only, an atomic_bw server atomics only,
// and a send_bw server nothing but SENDs. A client of another test, whose exchange takes the same
// steps, has its first request refused. The server's QP refuses what its access flags leave out with
// NAK invalid request, as rxe does (check_op_valid, before the key is looked at); the send_bw
// server's QP allows WRITEs, as perftest's does, and its region refuses them: remote access error.
func TestAccessRights(t *testing.T) {
	shortGraces(t)
	for _, c := range []struct {
		srv, cli Test
		want     error
	}{
		{WriteBW, ReadBW, goroce.ErrRemoteInvalid}, {WriteBW, AtomicBW, goroce.ErrRemoteInvalid},
		{ReadBW, WriteBW, goroce.ErrRemoteInvalid}, {ReadBW, AtomicBW, goroce.ErrRemoteInvalid},
		{AtomicBW, WriteBW, goroce.ErrRemoteInvalid}, {AtomicBW, ReadBW, goroce.ErrRemoteInvalid},
		{SendBW, WriteBW, goroce.ErrRemoteAccess},
	} {
		t.Run(fmt.Sprintf("%s_server_%s_client", c.srv, c.cli), func(t *testing.T) {
			t.Parallel()
			srv, cli := DefaultOptions(c.srv), DefaultOptions(c.cli)
			for _, o := range []*Options{&srv, &cli} {
				o.Size, o.Iters, o.MTU, o.Timeout = 4096, 10, goroce.MTU1024, testTimeout
			}
			s, cl := runMismatch(t, srv, cli)
			var ce *CompletionError
			if !errors.Is(cl.err, c.want) || !errors.As(cl.err, &ce) || ce.Side != "client" {
				t.Fatalf("client: %v, want %v\n%s\nserver: %v", cl.err, c.want, cl.out, s.err)
			}
			if !errors.Is(cl.err, ErrMismatch) {
				t.Errorf("client: %v does not say that the settings differ", cl.err)
			}
			if s.err == nil {
				t.Errorf("the server ended well although its client failed:\n%s", s.out)
			}
			if len(cl.res.BW) != 0 || len(s.res.BW) != 0 {
				t.Errorf("results printed: client %+v, server %+v", cl.res.BW, s.res.BW)
			}
		})
	}
}

// TestRunInfinitely: --run_infinitely prints a line every period (-D) until the run is stopped; the
// client of a WRITE test then just ends, and the server, which waits for a barrier that never comes,
// ends with its context.
func TestRunInfinitely(t *testing.T) {
	for _, test := range []Test{WriteBW, SendBW} {
		t.Run(string(test), func(t *testing.T) {
			t.Parallel()
			o := DefaultOptions(test)
			o.Size, o.RunInfinitely, o.Duration, o.Timeout = 4096, true, 250*time.Millisecond, testTimeout
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			sa, ca := testaddr.Pair()
			srv, cli := o, o
			srv.Addr, cli.Addr = sa, ca
			s, c := serveConnect(ctx, t, sa, srv, cli)
			if c.err != nil || len(c.res.BW) < 2 || len(bwLine.FindAllString(c.out, -1)) != len(c.res.BW) {
				t.Fatalf("client: %v, %d lines %+v:\n%s", c.err, len(c.res.BW), c.res.BW, c.out)
			}
			for _, r := range c.res.BW {
				if r.Size != 4096 || r.Iters == 0 || r.BWAvg <= 0 || r.BWPeak != 0 {
					t.Errorf("client line %+v", r)
				}
			}
			if test == SendBW && (s.err != nil || len(s.res.BW) < 2) {
				t.Errorf("server: %v, %+v:\n%s", s.err, s.res.BW, s.out)
			}
			if test == WriteBW && !errors.Is(s.err, context.DeadlineExceeded) {
				t.Errorf("server: %v, want the context's end", s.err)
			}
		})
	}
}
