// Package perftest is a goroce peer for the linux-rdma perftest programs (ib_write_bw, ib_read_lat,
// ...): the same out-of-band exchange over TCP (perftest_communication.c, "Data ex. method :
// Ethernet"), the same traffic on one RC QP (perftest_resources.c's run_iter_bw, run_iter_lat and
// friends), and the same tables, so that either side of a run may be goroce or perftest.
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
	"os"
	"strings"

	"github.com/goroce/goroce"
)

// DefaultPort is the TCP port perftest listens on and connects to unless -p says otherwise
// (DEF_PORT).
const DefaultPort = 18515

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
	WriteBW  Test = "write_bw"  // ib_write_bw
	ReadBW   Test = "read_bw"   // ib_read_bw
	AtomicBW Test = "atomic_bw" // ib_atomic_bw
	SendBW   Test = "send_bw"   // ib_send_bw
	ReadLat  Test = "read_lat"  // ib_read_lat
	SendLat  Test = "send_lat"  // ib_send_lat
	WriteLat Test = "write_lat" // ib_write_lat
)

// shape is one program's verb and the shape of its exchange. The handshake counts are those perftest
// 6.06 uses, taken from captures between two rxe guests: every handshake is the same key message
// again, so only their number and place matter.
type shape struct {
	verb Verb
	lat  bool
	// pre is the number of handshakes before the traffic; the first carries the QPs' addresses.
	pre int
	// perSize adds one handshake before each message size's traffic: perftest posts the receives of
	// a SEND test and then synchronizes, so that no SEND arrives before its receive.
	perSize bool
	// reports: after the traffic, one more handshake and the bandwidth reports (xchg_bw_reports).
	reports bool
	// close: ctx_close_connection at the end, a handshake and "done".
	close bool
	// all: -a (every size from 2 to 8 MiB) is supported.
	all bool
}

// tests holds every Test in the order Tests lists them.
var tests = []struct {
	t Test
	s shape
}{
	{WriteBW, shape{verb: Write, pre: 3, reports: true, close: true, all: true}},
	{ReadBW, shape{verb: Read, pre: 3, reports: true, close: true, all: true}},
	{AtomicBW, shape{verb: Atomic, pre: 3, reports: true, close: true}},
	{SendBW, shape{verb: Send, pre: 3, perSize: true, close: true}},
	{ReadLat, shape{verb: Read, lat: true, pre: 4, close: true, all: true}},
	{SendLat, shape{verb: Send, lat: true, pre: 3, perSize: true, close: true, all: true}},
	// ib_write_lat 6.06 closes the TCP connection after the traffic without a last handshake.
	{WriteLat, shape{verb: Write, lat: true, pre: 4, all: true}},
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

// AllSizes reports whether t takes -a, every message size from 2 bytes to 8 MiB.
func (t Test) AllSizes() bool { s, _ := t.shape(); return s.all }

// Title returns the test's name line as ctx_print_test_info prints it, for example "RDMA_Write BW
// Test" or "Atomic CMP_AND_SWAP BW Test"; cas says which atomic.
func (t Test) Title(cas bool) string {
	s, _ := t.shape()
	title := s.verb.String() + " "
	if s.verb == Atomic {
		if cas {
			title += "CMP_AND_SWAP "
		} else {
			title += "FETCH_AND_ADD "
		}
	}
	if s.lat {
		return title + "Latency Test"
	}
	return title + "BW Test"
}

// Options are a run's parameters, perftest's flags. Every field means what it says, but for MTU;
// start from DefaultOptions, which gives perftest's defaults for the test.
type Options struct {
	// Test is the program.
	Test Test
	// Size is the message size in bytes (-s): 65536 for bandwidth tests, 2 for latency tests. Atomic
	// tests always move 8 bytes, and All runs every size, so both ignore it.
	Size int
	// Iters is the number of messages (-n): 5000 for bandwidth tests, 1000 for latency tests; at
	// least 2.
	Iters int
	// MTU is the path MTU (-m). The zero MTU means 4096, the largest goroce allows, as perftest's
	// default is the port's active MTU; both sides then take the smaller of theirs.
	MTU goroce.MTU
	// GIDIndex is the GID index (-x). goroce has one GID, the IPv4-mapped address, and only prints
	// the index, as perftest does; -1, the default, prints none.
	GIDIndex int
	// All runs every message size from 2 bytes to 8 MiB (-a), for tests where Test.AllSizes.
	All bool
	// TxDepth is the size of the send queue (-t): 128.
	TxDepth int
	// RxDepth is the receives kept posted (-r): 512.
	RxDepth int
	// CQMod asks for a completion every CQMod sends (-Q): 100.
	CQMod int
	// OutReads is the READs and atomics outstanding (-o): 128, at most 128.
	OutReads int
	// AtomicCAS runs compare-and-swap instead of fetch-and-add (-A CMP_AND_SWAP).
	AtomicCAS bool
	// Addr is the local IP address of the goroce device (goroce's -addr). The zero Addr takes the local
	// address of the TCP connection.
	Addr netip.Addr
	// Network is where the device's packets travel (goroce.Config.Network): the host's UDP sockets
	// when nil, or a *goroce.MemNetwork for a test whose two sides both run goroce.
	Network goroce.Network
}

// DefaultOptions returns perftest's defaults for t.
func DefaultOptions(t Test) Options {
	o := Options{Test: t, Size: 65536, Iters: 5000, GIDIndex: -1, TxDepth: 128, RxDepth: 512, CQMod: 100, OutReads: 128}
	switch {
	case t.Verb() == Atomic:
		o.Size = 8
	case t.Latency():
		o.Size, o.Iters = 2, 1000
	}
	return o
}

// ErrBadOptions is the error of options Options.Validate refuses; it matches with errors.Is.
var ErrBadOptions = errors.New("perftest: invalid options")

// Validate reports options perftest would refuse, as an error matching ErrBadOptions.
func (o *Options) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadOptions, fmt.Sprintf(format, a...))
	}
	switch _, ok := o.Test.shape(); {
	case !ok:
		return bad("unknown test %q", o.Test)
	case o.All && !o.Test.AllSizes():
		return bad("all sizes (-a) is not supported for %s", o.Test)
	case o.Size <= 0 && !o.All && o.Test.Verb() != Atomic:
		return bad("size %d", o.Size)
	case o.Iters < 2:
		return bad("iters %d: at least 2", o.Iters)
	case o.TxDepth < 1, o.RxDepth < 1, o.CQMod < 1:
		return bad("tx depth %d, rx depth %d, CQ moderation %d: at least 1", o.TxDepth, o.RxDepth, o.CQMod)
	case o.OutReads < 1 || o.OutReads > 128:
		return bad("outstanding reads %d: 1 to 128", o.OutReads)
	case o.MTU != 0 && !o.MTU.Valid():
		return bad("MTU %v", o.MTU)
	}
	return nil
}

// Sizes returns the message sizes of a run: Size, or with All 2, 4, ... 2^23; 8 for atomics.
func (o *Options) Sizes() []int {
	if o.Test.Verb() == Atomic {
		return []int{8}
	}
	if !o.All {
		return []int{o.Size}
	}
	var s []int
	for i := 1; i < 24; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// Result is what a run settled and measured.
type Result struct {
	// Hello is what the first steps of the exchange settled, the MTU among them.
	Hello Hello
	// Local and Remote are the key messages of the two QPs.
	Local, Remote Dest
	// BW holds a bandwidth test's result lines, one per message size this side measured. The server
	// of a WRITE, READ or atomic test measures nothing: it holds the client's report it received.
	BW []BWReport
	// Lat holds a latency test's result lines, one per message size. ib_read_lat's server has none.
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

// Server is a perftest server that listens for one client, as perftest runs without a host argument.
type Server struct {
	ln net.Listener
	o  Options
}

// Listen checks o and listens on the TCP address (":18515" as perftest, or "127.0.0.1:0" for an
// ephemeral port), over IPv4 as perftest does; Serve then accepts one client.
func Listen(ctx context.Context, address string, o Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp4", address)
	if err != nil {
		return nil, fmt.Errorf("couldn't listen on %s: %w", address, err)
	}
	return &Server{ln: ln, o: o}, nil
}

// Addr returns the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops listening; Serve, if it waits for a client, fails.
func (s *Server) Close() error {
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

// Connect is the client: it connects to the server at the TCP address (host:port) over IPv4, runs the
// exchange, the traffic and the report, and writes perftest's client output to w (nil discards it).
// On failure the Result holds what the run got to.
func Connect(ctx context.Context, address string, o Options, w io.Writer) (Result, error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	if w == nil {
		w = io.Discard
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp4", address)
	if err != nil {
		return Result{}, fmt.Errorf("couldn't connect to %s: %w", address, err)
	}
	return run(ctx, conn, o, true, w)
}

// run runs one side on conn: the exchange, the traffic and the report.
func run(ctx context.Context, conn net.Conn, o Options, client bool, w io.Writer) (res Result, err error) {
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	defer func() {
		if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
	}()
	sh, _ := o.Test.shape()
	tcpPeer := addrOf(conn.RemoteAddr())
	local := o.Addr.Unmap()
	if !local.IsValid() {
		if local = addrOf(conn.LocalAddr()); !local.IsValid() {
			return res, fmt.Errorf("no IP address to open the device on: the connection is from %v", conn.LocalAddr())
		}
	}
	p, err := newPeer(local, sh, o)
	if err != nil {
		return res, err
	}
	// Closing the device first sends what it still holds back, such as the ACK of the peer's last
	// message.
	defer p.dev.Close()
	defer func() {
		st := p.dev.Stats()
		res.Stats = &st
	}()
	res.Local = p.local
	pc := NewConn(conn, client)

	mtu := goroce.MTU4096
	if o.MTU != 0 {
		mtu = o.MTU
	}
	if res.Hello, err = pc.Hello(os.Getpagesize(), mtu); err != nil {
		return res, err
	}
	h := res.Hello
	p.printInfo(w, h, client)
	p.printDest(w, "local", p.local)
	if res.Remote, err = pc.Handshake(p.local); err != nil {
		return res, err
	}
	p.printDest(w, "remote", res.Remote)
	fmt.Fprintln(w, resultLine)
	if err := p.connect(res.Remote, h.MTU, tcpPeer); err != nil {
		return res, err
	}
	barrier := func() error {
		_, err := pc.Handshake(p.local)
		return err
	}
	for i := 1; i < sh.pre; i++ {
		if err := barrier(); err != nil {
			return res, err
		}
	}
	bwServer := !sh.lat && !client && sh.verb != Send
	if sh.lat {
		if client || sh.verb != Read {
			fmt.Fprint(w, latHeader)
		}
	} else {
		fmt.Fprint(w, bwHeader)
	}
	var last BWReport
	for _, size := range o.Sizes() {
		if sh.verb == Send {
			if err := p.postRecvs(o.Iters); err != nil {
				return res, err
			}
		}
		if sh.perSize {
			if err := barrier(); err != nil {
				return res, err
			}
		}
		switch {
		case bwServer:
			// The client drives the traffic; this side's device answers it.
		case sh.lat && sh.verb == Read && !client:
		case sh.lat:
			samples, err := p.latency(ctx, size, client)
			if err != nil {
				return res, err
			}
			if l, ok := latReport(size, o.Iters, samples); ok {
				res.Lat = append(res.Lat, l)
				printLat(w, l)
			}
		case sh.verb == Send && !client:
			r, err := p.sendBWServer(ctx, size)
			if err != nil {
				return res, err
			}
			last = r
			res.BW = append(res.BW, r)
			printBW(w, r)
		default:
			r, err := p.bwClient(ctx, size)
			if err != nil {
				return res, err
			}
			last = r
			res.BW = append(res.BW, r)
			printBW(w, r)
		}
	}
	if sh.reports {
		if err := barrier(); err != nil {
			return res, err
		}
		r, err := pc.ExchangeReports(last, h.RemoteVersion)
		if err != nil {
			return res, err
		}
		if bwServer {
			// The server measured nothing: it prints the client's report.
			res.BW = append(res.BW, r)
			printBW(w, r)
		}
	}
	fmt.Fprintln(w, resultLine)
	if sh.close {
		if err := barrier(); err != nil {
			return res, err
		}
		if err := pc.Close(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// peer is the verbs objects of one run, as perftest's struct pingpong_context. The region has two
// halves of maxSize bytes, as perftest's buffer: the local half is what this side sends from and
// reads into, the remote half is what it offers the peer (its vaddr) and receives into.
type peer struct {
	sh      shape
	o       Options
	dev     *goroce.Device
	pd      *goroce.PD
	mr      *goroce.MR
	cq      *goroce.CQ
	qp      *goroce.QP
	maxSize int
	local   Dest
	rem     Dest
	routs   int // receives posted and not completed
}

func newPeer(addr netip.Addr, sh shape, o Options) (*peer, error) {
	p := &peer{sh: sh, o: o}
	for _, s := range o.Sizes() {
		p.maxSize = max(p.maxSize, s)
	}
	p.maxSize = max(p.maxSize, os.Getpagesize())
	var err error
	if p.dev, err = goroce.Open(goroce.Config{Addr: addr, Port: goroce.DefaultPort, Network: o.Network}); err != nil {
		return nil, err
	}
	fail := func(err error) (*peer, error) {
		p.dev.Close()
		return nil, err
	}
	if p.pd, err = p.dev.AllocPD(); err != nil {
		return fail(err)
	}
	access := goroce.LocalWrite | goroce.RemoteWrite | goroce.RemoteRead | goroce.RemoteAtomic
	if p.mr, err = p.pd.AllocMR(2*p.maxSize, access); err != nil {
		return fail(err)
	}
	if p.cq, err = p.dev.CreateCQ(o.TxDepth + o.RxDepth + 16); err != nil {
		return fail(err)
	}
	p.qp, err = p.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cq, RecvCQ: p.cq,
		MaxSendWR: max(o.TxDepth, 16), MaxRecvWR: o.RxDepth, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return fail(err)
	}
	e := p.qp.Endpoint()
	p.local = Dest{OutReads: 1, QPN: e.QPN, PSN: e.PSN, RKey: p.mr.RKey(),
		VAddr: p.mr.Addr() + uint64(p.maxSize), GID: e.GID}
	if sh.verb == Read || sh.verb == Atomic {
		p.local.OutReads = o.OutReads
	}
	return p, nil
}

// connect moves the QP to RTS towards the peer's key message.
func (p *peer) connect(rem Dest, mtu goroce.MTU, tcpPeer netip.Addr) error {
	p.rem = rem
	peer := rem.Endpoint()
	if rem.GID == (goroce.GID{}) {
		// The peer runs without a GID index and sent none; RoCE needs one: take the TCP peer's address.
		peer.GID = goroce.GIDFromAddr(tcpPeer)
	}
	rd := uint8(1)
	if p.sh.verb == Read || p.sh.verb == Atomic {
		rd = uint8(max(1, min(p.local.OutReads, rem.OutReads)))
	}
	opts := goroce.DefaultConnectOptions()
	opts.MTU, opts.RdAtomic, opts.RNRRetry = mtu, rd, 7 // perftest's rnr_retry: forever
	if err := p.qp.Connect(peer, &opts); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %w", err)
	}
	return nil
}

// recvWRID marks receive completions; send work requests are numbered from 0.
const recvWRID = 1 << 63

// postRecvs tops the receive queue up to rx depth; receives land in the remote half.
func (p *peer) postRecvs(limit int) error {
	for p.routs < min(p.o.RxDepth, limit) {
		if err := p.qp.PostRecv(&goroce.RecvWR{WRID: recvWRID, SGL: []goroce.SGE{p.mr.SGE(p.maxSize, p.maxSize)}}); err != nil {
			return fmt.Errorf("couldn't post receive: %w", err)
		}
		p.routs++
	}
	return nil
}

// addrOf returns the IP address of a TCP address, or the zero Addr for any other.
func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
