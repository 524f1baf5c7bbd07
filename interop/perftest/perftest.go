// Package perftest is a goroce peer for the linux-rdma perftest programs (ib_write_bw, ib_read_lat,
// ...): the same out-of-band exchange over TCP (perftest_communication.c, "Data ex. method :
// Ethernet"), the same traffic on one or several RC QPs (perftest_resources.c's run_iter_bw,
// run_iter_bi, run_iter_lat and friends), and the same tables, so that either side of a run may be
// goroce or perftest.
//
// A server listens, a client connects, and both print what perftest prints:
//
//	srv, err := perftest.Listen(ctx, ":18515", perftest.DefaultOptions(perftest.WriteBW))
//	res, err := srv.Serve(ctx, os.Stdout)
//
//	res, err := perftest.Connect(ctx, "10.0.0.2:18515", perftest.DefaultOptions(perftest.WriteBW), os.Stdout)
//
// Listen accepts port 0 (an ephemeral port; Server.Addr says which), so tests need no fixed port.
// Dest, Conn and BWReport are the exchange itself, for a test that brings its own queue pair.
//
// perftest's exchange is lock-step and unframed: both sides must take the same steps, which the
// flags decide (-q, -b, -a, -D, the test itself). perftest does not check that they do, and a
// difference makes it print garbage. This package does: a step that finds the peer elsewhere in
// the exchange, or a report that cannot be the peer's run of the same settings, ends the run with
// an error that matches ErrMismatch and says which setting differs.
//
// The goroce devices this package opens use the RoCEv2 port, goroce.DefaultPort, because perftest's
// peers (rxe, RoCE NICs) send there.
package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce"
)

// DefaultPort is the TCP port perftest listens on and connects to unless -p says otherwise
// (DEF_PORT).
const DefaultPort = 18515

// Limits perftest's parser enforces (perftest_parameters.h).
const (
	// MinIters is the fewest messages a run may have (MIN_ITER).
	MinIters = 5
	// MaxQPs is the most QPs a run may have (MAX_QP_NUM).
	MaxQPs = 16384
	// MaxInline is the largest inline size (MAX_INLINE).
	MaxInline = 912
	// MaxSize is the largest message, the last size of -a (MAX_SIZE, 8 MiB).
	MaxSize = 1 << 23
	// atomicSize is what an atomic moves (DEF_SIZE_ATOMIC).
	atomicSize = 8
)

// Verb is the operation a test measures, as perftest's VerbType (perftest_parameters.h).
type Verb int

// Verbs.
const (
	Send Verb = iota
	Write
	Read
	Atomic
)

var verbNames = [...]string{"Send", "RDMA_Write", "RDMA_Read", "Atomic"}

// String returns the verb as perftest's test titles name it (testsStr): "Send", "RDMA_Write",
// "RDMA_Read", "Atomic".
func (v Verb) String() string {
	if v < 0 || int(v) >= len(verbNames) {
		return fmt.Sprintf("Verb(%d)", int(v))
	}
	return verbNames[v]
}

// Test is one perftest program, named as its binary without "ib_".
type Test string

// The perftest programs goroce can be the peer of.
const (
	WriteBW   Test = "write_bw"   // ib_write_bw
	ReadBW    Test = "read_bw"    // ib_read_bw
	AtomicBW  Test = "atomic_bw"  // ib_atomic_bw
	SendBW    Test = "send_bw"    // ib_send_bw
	ReadLat   Test = "read_lat"   // ib_read_lat
	SendLat   Test = "send_lat"   // ib_send_lat
	WriteLat  Test = "write_lat"  // ib_write_lat
	AtomicLat Test = "atomic_lat" // ib_atomic_lat
)

// shape is one program's verb and, for the latency tests, the shape of their exchange. The
// bandwidth tests' exchanges depend on more than the program (-q, -b, -a, -D); run.go builds them.
// The handshake counts are those perftest 6.06 uses, taken from captures between two rxe guests:
// every handshake but the first is the same key message again, so only their number and place
// matter.
type shape struct {
	verb Verb
	lat  bool
	// pre is the number of handshakes before a latency test's traffic; the first carries the QP's
	// address.
	pre int
	// perSize adds one handshake before each message size's traffic: perftest posts the receives of
	// a SEND test and then synchronizes, so that no SEND arrives before its receive.
	perSize bool
	// close: ctx_close_connection at the end, a handshake and "done".
	close bool
}

// tests holds every Test in the order Tests lists them.
var tests = []struct {
	t Test
	s shape
}{
	{WriteBW, shape{verb: Write}},
	{ReadBW, shape{verb: Read}},
	{AtomicBW, shape{verb: Atomic}},
	{SendBW, shape{verb: Send}},
	{ReadLat, shape{verb: Read, lat: true, pre: 4, close: true}},
	{SendLat, shape{verb: Send, lat: true, pre: 3, perSize: true, close: true}},
	// ib_write_lat 6.06 closes the TCP connection after the traffic without a last handshake.
	{WriteLat, shape{verb: Write, lat: true, pre: 4}},
	{AtomicLat, shape{verb: Atomic, lat: true, pre: 4, close: true}},
}

// Tests returns the programs goroce can be the peer of.
func Tests() []Test {
	ts := make([]Test, len(tests))
	for i, t := range tests {
		ts[i] = t.t
	}
	return ts
}

// ParseTest returns the test a program name names, with or without "ib_": "write_bw" or
// "ib_write_bw".
func ParseTest(name string) (Test, bool) {
	t := Test(strings.TrimPrefix(name, "ib_"))
	_, ok := t.shape()
	return t, ok
}

func (t Test) shape() (shape, bool) {
	for _, x := range tests {
		if x.t == t {
			return x.s, true
		}
	}
	return shape{}, false
}

// Verb returns the operation t measures.
func (t Test) Verb() Verb { s, _ := t.shape(); return s.verb }

// Latency reports whether t is a latency test (ib_*_lat) rather than a bandwidth test.
func (t Test) Latency() bool { s, _ := t.shape(); return s.lat }

// AllSizes reports whether t takes -a, every message size from 2 bytes to 8 MiB: every test but the
// atomic ones, whose message is always 8 bytes.
func (t Test) AllSizes() bool { _, ok := t.shape(); return ok && t.Verb() != Atomic }

// Title returns the test's name line as ctx_print_test_info prints it, for example "RDMA_Write BW
// Test" or "Atomic CMP_AND_SWAP BW Test"; cas says which atomic.
func (t Test) Title(cas bool) string { return t.title(cas, false) }

func (t Test) title(cas, bidirectional bool) string {
	s, _ := t.shape()
	title := s.verb.String() + " "
	if s.verb == Atomic {
		if cas {
			title += "CMP_AND_SWAP "
		} else {
			title += "FETCH_AND_ADD "
		}
	}
	switch {
	case s.lat:
		return title + "Latency Test"
	case bidirectional:
		return title + "Bidirectional BW Test"
	}
	return title + "BW Test"
}

// Options are a run's parameters, perftest's flags. Every field means what it says, but for MTU and
// Margin; start from DefaultOptions, which gives perftest's defaults for the test.
//
// The two sides of a run must agree on Test, Size, Iters (or Duration), All, QPs, Bidirectional and
// NoVersionExchange, as perftest's do: they decide the steps of the exchange and the figures the
// reports carry. A run that finds they differ fails with an error matching ErrMismatch.
type Options struct {
	// Test is the program.
	Test Test
	// Size is the message size in bytes (-s): 65536 for bandwidth tests, 2 for latency tests. Atomic
	// tests always move 8 bytes, and All runs every size, so both ignore it.
	Size int
	// Iters is the number of messages per QP (-n): 5000 for write_bw, 1000 for the others; at least
	// MinIters. Duration and RunInfinitely ignore it.
	Iters int
	// MTU is the path MTU (-m). The zero MTU means 4096, the largest goroce allows, as perftest's
	// default is the port's active MTU; both sides then take the smaller of theirs.
	MTU goroce.MTU
	// GIDIndex is the GID index (-x). goroce has one GID, its address (IPv4-mapped, or IPv6), and only prints
	// the index, as perftest does; -1, the default, prints none.
	GIDIndex int
	// All runs every message size from 2 bytes to 8 MiB (-a), for tests where Test.AllSizes.
	All bool
	// QPs is the number of queue pairs (-q): 1. Bandwidth tests only; each QP runs Iters messages.
	QPs int
	// Bidirectional measures both directions at once (-b): both sides send, and each prints the sum
	// of both sides' figures. Bandwidth tests only.
	Bidirectional bool
	// Duration runs the traffic for this long instead of Iters messages (-D); the figures leave Margin
	// out at each end. Zero runs Iters messages. perftest's -D takes whole seconds; a fraction is
	// allowed here (the peer does not learn the duration), for tests that need a short run.
	Duration time.Duration
	// Margin is the time at each end of a Duration run that the figures leave out (-f, whole
	// seconds). Negative means perftest's default: a quarter of Duration, in whole seconds.
	Margin time.Duration
	// RunInfinitely streams until the context ends, printing a result line every Duration (5 s
	// unless set) (--run_infinitely). Bandwidth tests only; the peer must run it too.
	RunInfinitely bool
	// TxDepth is the size of each send queue (-t): 128 for bandwidth tests, 1 for latency tests.
	TxDepth int
	// RxDepth is the receives kept posted per QP (-r): 512.
	RxDepth int
	// CQMod asks for a completion every CQMod sends (-Q): 100.
	CQMod int
	// OutReads is the READs and atomics outstanding (-o): 128, at most 128.
	OutReads int
	// AtomicCAS runs compare-and-swap instead of fetch-and-add (-A CMP_AND_SWAP).
	AtomicCAS bool
	// NoPeak leaves the peak bandwidth out (-N); perftest also does beyond 20000 iterations.
	NoPeak bool
	// ReportGbits reports bandwidths in Gbit/s (10^9 bits) instead of MiB/s (--report_gbits).
	ReportGbits bool
	// ReportBoth prints a bidirectional run's local and remote figures apart, after their sum
	// (--report-both).
	ReportBoth bool
	// InlineSize sends messages of up to this many bytes inline (-I): 0, at most MaxInline. READs and
	// atomics carry no data and ignore it.
	InlineSize int
	// PostList posts send work requests in lists of this many, of which the last asks for a
	// completion (-l): 1. A list longer than 1 sets CQMod to its length, as perftest does.
	PostList int
	// RecvPostList posts receives in lists of this many (--recv_post_list): 1.
	RecvPostList int
	// TrafficClass is the IP TOS byte of the QPs' packets (--tclass): 0.
	TrafficClass uint8
	// Timeout is the QPs' local ACK timeout, 4.096 us * 2^Timeout (-u): 14.
	Timeout uint8
	// Histogram prints every latency sample, sorted, before the result line (-H); Unsorted prints
	// them in the order taken first (-U, which implies -H).
	Histogram, Unsorted bool
	// MRPerQP registers a memory region per QP instead of one for all (--mr_per_qp).
	MRPerQP bool
	// LimitBW and LimitMsgRate fail a bandwidth run whose average falls below them (-w in the unit
	// of the report, -y in Mpps); 0 sets no limit.
	LimitBW, LimitMsgRate float64
	// WarmUp runs a tx depth of messages before each size's measurement (--perform_warm_up). WRITE,
	// READ and atomic bandwidth tests only.
	WarmUp bool
	// NoVersionExchange leaves out the versions, system data and MTU steps (--dont_xchg_versions).
	NoVersionExchange bool
	// SourceIP is the local address of a client's TCP connection (--source_ip); the zero Addr lets the
	// routing table choose.
	SourceIP netip.Addr
	// Addr is the local IP address of the goroce device (goroce's -addr). The zero Addr takes the local
	// address of the TCP connection.
	Addr netip.Addr
	// RDMACM connects the QPs with rdma_cm and runs the exchange over an rdma_cm connection of its own
	// on the same port (-R, as perftest's -R implies -z): Listen and Connect then take the rdma_cm
	// port, not a TCP one. The peer must run -R too.
	RDMACM bool
	// Network is where the device's packets travel (goroce.Config.Network): the host's UDP sockets
	// when nil, or a *goroce.MemNetwork for a test whose two sides both run goroce.
	Network goroce.Network
	// Tracer, if set, sees every packet the run's devices send and receive (goroce.Config.Tracer): a
	// capture.Writer's Tracer writes them to a pcapng file, as goroce perf -pcap does.
	Tracer goroce.Tracer
}

// DefaultOptions returns perftest's defaults for t.
func DefaultOptions(t Test) Options {
	o := Options{Test: t, Size: 65536, Iters: 1000, GIDIndex: -1, QPs: 1, TxDepth: 128, RxDepth: 512,
		CQMod: 100, OutReads: 128, PostList: 1, RecvPostList: 1, Timeout: 14, Margin: -1}
	switch {
	case t == WriteBW:
		o.Iters = 5000 // DEF_ITERS_WB
	case t.Verb() == Atomic:
		o.Size = atomicSize
	}
	if t.Latency() {
		o.Size, o.TxDepth = 2, 1
		if t.Verb() == Atomic {
			o.Size = atomicSize
		}
	}
	return o
}

// ErrBadOptions is the error of options Options.Validate refuses; it matches with errors.Is.
var ErrBadOptions = errors.New("perftest: invalid options")

// Validate reports options perftest would refuse, as an error matching ErrBadOptions. Where perftest
// has a message for the refusal, the error says it in perftest's words.
func (o *Options) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadOptions, fmt.Sprintf(format, a...))
	}
	sh, ok := o.Test.shape()
	if !ok {
		return bad("unknown test %q", o.Test)
	}
	timed := o.Duration > 0 || o.RunInfinitely
	switch {
	case o.All && sh.verb == Atomic:
		return bad("message size cannot be changed for Atomic tests (-a)")
	case o.QPs > 1 && sh.lat:
		return bad("multiple QPs only available on bw tests (-q)")
	case o.Bidirectional && sh.lat:
		return bad("bidirectional is only available in BW test (-b)")
	case o.RunInfinitely && sh.lat:
		return bad("run_infinitely exists only in BW tests for now (--run_infinitely)")
	case o.RunInfinitely && o.Bidirectional && sh.verb == Send:
		return bad("run_infinitely mode is not supported in SEND Bidirectional BW test")
	case o.RunInfinitely && o.All:
		return bad("run_infinitely does not run all sizes (-a)")
	case o.Duration > 0 && o.All:
		return bad("duration mode currently doesn't support running on all sizes (-D with -a)")
	case o.Duration < 0:
		return bad("duration %v: not negative", o.Duration)
	case o.Duration > 0 && o.Duration <= 2*o.margin():
		return bad("please check that DURATION > 2*MARGIN (-D %v, -f %v)", o.Duration, o.margin())
	case o.Size <= 0 && !o.All && sh.verb != Atomic, o.Size > MaxSize && sh.verb != Atomic:
		return bad("size %d: 1 to %d", o.Size, MaxSize)
	case !timed && o.Iters < MinIters:
		return bad("iteration num should be at least %d (-n %d)", MinIters, o.Iters)
	case o.QPs < 1 || o.QPs > MaxQPs:
		return bad("number of QPs %d: 1 to %d", o.QPs, MaxQPs)
	case o.TxDepth < 1, o.RxDepth < 1, o.CQMod < 1:
		return bad("tx depth %d, rx depth %d, CQ moderation %d: at least 1", o.TxDepth, o.RxDepth, o.CQMod)
	case o.OutReads < 1 || o.OutReads > 128:
		return bad("outstanding reads %d: 1 to 128", o.OutReads)
	case o.MTU != 0 && !o.MTU.Valid():
		return bad("MTU %v", o.MTU)
	case o.InlineSize < 0 || o.InlineSize > MaxInline:
		return bad("inline size %d: 0 to %d", o.InlineSize, MaxInline)
	case o.PostList < 1 || o.RecvPostList < 1:
		return bad("post list %d, receive post list %d: at least 1", o.PostList, o.RecvPostList)
	case o.PostList > 1 && sh.lat:
		return bad("post list is only available in BW tests (-l)")
	case o.Timeout > 31:
		return bad("QP timeout %d: 0 to 31", o.Timeout)
	case (o.Histogram || o.Unsorted) && !sh.lat:
		return bad("histograms are only available in latency tests (-H, -U)")
	case o.LimitBW < 0 || o.LimitMsgRate < 0:
		return bad("limits %v and %v: not negative", o.LimitBW, o.LimitMsgRate)
	case o.WarmUp && (sh.lat || sh.verb == Send):
		return bad("warm up is valid in Atomic, Read and Write BW tests only (--perform_warm_up)")
	}
	return nil
}

// margin returns the margin a Duration run leaves out at each end (-f, or a quarter of -D).
func (o *Options) margin() time.Duration {
	if o.Margin >= 0 {
		return o.Margin
	}
	return (o.Duration / 4).Truncate(time.Second)
}

// period returns the time between result lines of RunInfinitely.
func (o *Options) period() time.Duration {
	if o.Duration > 0 {
		return o.Duration
	}
	return 5 * time.Second // DEF_DURATION
}

// Sizes returns the message sizes of a run: Size, or with All 2, 4, ... 2^23; 8 for atomics.
func (o *Options) Sizes() []int {
	if o.Test.Verb() == Atomic {
		return []int{atomicSize}
	}
	if !o.All {
		return []int{o.Size}
	}
	var s []int
	for i := 1; 1<<i <= MaxSize; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// Result is what a run settled and measured.
type Result struct {
	// Hello is what the first steps of the exchange settled, the MTU among them.
	Hello Hello
	// Local and Remote are the key messages of the first QP of each side; Locals and Remotes hold
	// every QP's.
	Local, Remote   Dest
	Locals, Remotes []Dest
	// BW holds a bandwidth test's result lines, one per message size this side measured (a
	// bidirectional run's hold both sides' sum). The server of a WRITE, READ or atomic test measures
	// nothing: it holds the client's report it received.
	BW []BWReport
	// Lat holds a latency test's result lines, one per message size. ib_read_lat's and
	// ib_atomic_lat's servers have none. A Duration run's lines hold only Size, Iters, Avg and TPS.
	Lat []LatReport
	// Stats is the device's counters at the end of the run, nil if no device was opened.
	Stats *goroce.Stats
}

// CompletionError is a work request of the run that failed, as perftest reports "Completion with
// error". It unwraps to Completion.Err, so errors.Is(err, goroce.ErrRemoteAccess) and friends match.
type CompletionError struct {
	// Side is "client" or "server" where perftest names it, else "".
	Side       string
	Completion goroce.Completion
}

// Error returns perftest's message.
func (e *CompletionError) Error() string {
	at := ""
	if e.Side != "" {
		at = " at " + e.Side
	}
	wc := &e.Completion
	return fmt.Sprintf("completion with error%s: %v (%d), wr_id %d", at, wc.Status, int(wc.Status), wc.WRID)
}

// Unwrap returns the completion's *goroce.WCError.
func (e *CompletionError) Unwrap() error { return e.Completion.Err() }

// ErrBelowLimit is the error of a run whose figures fall below LimitBW or LimitMsgRate, as perftest
// ends with "Error: BW result is below bw limit".
var ErrBelowLimit = errors.New("result is below the limit")

// Server is a perftest server that listens for one client, as perftest runs without a host argument.
type Server struct {
	ln net.Listener
	o  Options
	// dev and cmLn are an rdma_cm server's (Options.RDMACM) instead of ln.
	dev  *goroce.Device
	cmLn *goroce.Listener
}

// Listen checks o and listens on the TCP address (":18515" as perftest, or "127.0.0.1:0" for an
// ephemeral port), over IPv4 as perftest does; Serve then accepts one client.
func Listen(ctx context.Context, address string, o Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.RDMACM {
		host, port, err := net.SplitHostPort(address)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadOptions, err)
		}
		pn, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("%w: port %q", ErrBadOptions, port)
		}
		a, _ := netip.ParseAddr(host) // no host: Options.Addr
		dev, l, err := listenCM(netip.AddrPortFrom(a, uint16(pn)), o)
		if err != nil {
			return nil, err
		}
		return &Server{o: o, dev: dev, cmLn: l}, nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp4", address)
	if err != nil {
		return nil, fmt.Errorf("couldn't listen on %s: %w", address, err)
	}
	return &Server{ln: ln, o: o}, nil
}

// Addr returns the address the server listens on (an rdma_cm port as a *net.TCPAddr).
func (s *Server) Addr() net.Addr {
	if s.cmLn != nil {
		return tcpAddr(s.cmLn.Addr())
	}
	return s.ln.Addr()
}

// Close stops listening; Serve, if it waits for a client, fails.
func (s *Server) Close() error {
	if s.cmLn != nil {
		s.cmLn.Close()
		return nil
	}
	if err := s.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// Serve prints perftest's "Waiting for client to connect..." banner to w (nil discards the output),
// waits for one client, closes the listener, and runs the exchange, the traffic and the report. It
// returns when the run is over, ctx ends, or the run fails; on failure the Result holds what the run
// got to.
func (s *Server) Serve(ctx context.Context, w io.Writer) (Result, error) {
	if w == nil {
		w = io.Discard
	}
	defer s.Close()
	fmt.Fprintln(w, "\n************************************")
	fmt.Fprintln(w, "* Waiting for client to connect... *")
	fmt.Fprintln(w, "************************************")
	if s.cmLn != nil {
		ch, err := acceptChannel(ctx, s.dev, s.cmLn)
		if err != nil {
			s.dev.Close()
			return Result{}, fmt.Errorf("unable to perform rdma_server function: %w", err)
		}
		return run(ctx, ch, s.o, false, w)
	}
	stop := context.AfterFunc(ctx, func() { s.ln.Close() })
	conn, err := s.ln.Accept()
	stop()
	s.ln.Close()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return Result{}, fmt.Errorf("accept() failed: %w", err)
	}
	return run(ctx, conn, s.o, false, w)
}

// Connect is the client: it connects to the server at the TCP address (host:port) over IPv4, from
// o.SourceIP if set, runs the exchange, the traffic and the report, and writes perftest's client
// output to w (nil discards it). On failure the Result holds what the run got to.
func Connect(ctx context.Context, address string, o Options, w io.Writer) (Result, error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	if w == nil {
		w = io.Discard
	}
	if o.RDMACM {
		ch, err := dialChannel(ctx, address, o)
		if err != nil {
			return Result{}, err
		}
		return run(ctx, ch, o, true, w)
	}
	var d net.Dialer
	if o.SourceIP.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: o.SourceIP.AsSlice()}
	}
	conn, err := d.DialContext(ctx, "tcp4", address)
	if err != nil {
		return Result{}, fmt.Errorf("couldn't connect to %s: %w", address, err)
	}
	return run(ctx, conn, o, true, w)
}

// addrOf returns the IP address of a TCP address, or the zero Addr for any other.
func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
