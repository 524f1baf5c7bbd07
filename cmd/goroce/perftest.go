package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/wire"
)

// goroce perf <test>: a peer for the perftest programs (ib_write_bw, ib_read_lat, ...): the same
// out-of-band exchange over TCP, the same traffic on one RC QP, and the same tables.

// perftestVerb is the operation a test measures, in perftest's order (testsStr).
type perftestVerb int

const (
	perftestSend perftestVerb = iota
	perftestWrite
	perftestRead
	perftestAtomic
)

var perftestVerbNames = [...]string{"Send", "RDMA_Write", "RDMA_Read", "Atomic"}

// perftestTest is one perftest program and the shape of its exchange. The handshake counts are those
// perftest 6.06 uses, taken from captures between two rxe guests (see perftest_oob.go): every
// handshake is the same key message again, so only their number and place matter.
type perftestTest struct {
	name string
	verb perftestVerb
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

var perftestTests = []perftestTest{
	{name: "write_bw", verb: perftestWrite, pre: 3, reports: true, close: true, all: true},
	{name: "read_bw", verb: perftestRead, pre: 3, reports: true, close: true, all: true},
	{name: "atomic_bw", verb: perftestAtomic, pre: 3, reports: true, close: true},
	{name: "send_bw", verb: perftestSend, pre: 3, perSize: true, close: true},
	{name: "read_lat", verb: perftestRead, lat: true, pre: 4, close: true, all: true},
	{name: "send_lat", verb: perftestSend, lat: true, pre: 3, perSize: true, close: true, all: true},
	// ib_write_lat 6.06 closes the TCP connection after the traffic without a last handshake.
	{name: "write_lat", verb: perftestWrite, lat: true, pre: 4, all: true},
}

func findPerftest(name string) *perftestTest {
	name = strings.TrimPrefix(name, "ib_")
	for i := range perftestTests {
		if perftestTests[i].name == name {
			return &perftestTests[i]
		}
	}
	return nil
}

// title is the test's name line, as ctx_print_test_info prints it.
func (t *perftestTest) title(atomicCAS bool) string {
	s := perftestVerbNames[t.verb] + " "
	if t.verb == perftestAtomic {
		if atomicCAS {
			s += "CMP_AND_SWAP "
		} else {
			s += "FETCH_AND_ADD "
		}
	}
	if t.lat {
		return s + "Latency Test"
	}
	return s + "BW Test"
}

type perftestOptions struct {
	host      string // server to connect to; empty: be the server
	port      int
	size      int
	iters     int
	mtu       int // path MTU in bytes; 0: 4096, the largest goroce supports
	gidx      int
	all       bool
	txDepth   int
	rxDepth   int
	cqMod     int
	outReads  int
	atomicCAS bool
	addr      string // local IP address of the device; empty: the TCP connection's local address
	timeout   time.Duration
	stats     bool // print the device's counters to stderr at the end
}

func perftestUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: goroce perf <test> [perftest flags] [host]")
	fmt.Fprintln(w, "  a peer for perftest's ib_<test>: server without a host, client with one")
	names := make([]string, len(perftestTests))
	for i, t := range perftestTests {
		names[i] = t.name
	}
	fmt.Fprintf(w, "  tests: %s\n", strings.Join(names, ", "))
}

func runPerftest(t *perftestTest, args []string) error {
	fs := flag.NewFlagSet("perf "+t.name, flag.ContinueOnError)
	o := perftestOptions{}
	both := func(p *int, short, long string, def int, help string) {
		fs.IntVar(p, short, def, help)
		if long != "" {
			fs.IntVar(p, long, def, help)
		}
	}
	defSize, defIters := 65536, 5000
	switch {
	case t.verb == perftestAtomic:
		defSize = 8
	case t.lat:
		defSize, defIters = 2, 1000
	}
	var dev, atomicType, connType string
	var ibPort, qps int
	var ignored, rdmaCM bool
	var duration int
	both(&o.port, "p", "port", 18515, "listen on/connect to TCP port")
	fs.StringVar(&dev, "d", "", "IB device (ignored: goroce is the device)")
	fs.StringVar(&dev, "ib-dev", "", "IB device (ignored)")
	both(&ibPort, "i", "ib-port", 1, "port of the IB device (ignored)")
	both(&o.size, "s", "size", defSize, "size of message to exchange")
	both(&o.iters, "n", "iters", defIters, "number of exchanges")
	both(&o.mtu, "m", "mtu", 0, "path MTU (256 to 4096; default: 4096, lowered to the peer's)")
	both(&o.gidx, "x", "gid-index", -1, "GID index (goroce has one GID, the IPv4-mapped address)")
	both(&qps, "q", "qp", 1, "number of QPs (only 1)")
	both(&o.txDepth, "t", "tx-depth", 128, "size of the send queue")
	both(&o.rxDepth, "r", "rx-depth", 512, "receives kept posted")
	both(&o.cqMod, "Q", "cq-mod", 100, "completion every this many sends")
	both(&o.outReads, "o", "outs", 128, "outstanding READs and atomics")
	both(&duration, "D", "duration", 0, "run for seconds (not supported)")
	fs.BoolVar(&o.all, "a", false, "run all message sizes from 2 to 2^23")
	fs.BoolVar(&o.all, "all", false, "run all message sizes")
	fs.BoolVar(&ignored, "F", false, "ignore CPU frequency warnings (goroce measures with the monotonic clock)")
	fs.BoolVar(&ignored, "e", false, "use events (goroce always waits on the CQ)")
	fs.BoolVar(&rdmaCM, "R", false, "connect with rdma_cm (not supported)")
	fs.StringVar(&atomicType, "A", "FETCH_AND_ADD", "atomic type: FETCH_AND_ADD or CMP_AND_SWAP")
	fs.StringVar(&atomicType, "atomic_type", "FETCH_AND_ADD", "atomic type")
	fs.StringVar(&connType, "c", "RC", "connection type (only RC)")
	fs.StringVar(&o.addr, "addr", "", "local IP address of the goroce device (default: the address the TCP exchange uses)")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long (0: never)")
	fs.BoolVar(&o.stats, "stats", false, "print the goroce device's counters to stderr at the end (goroce's own flag)")
	fs.Usage = func() {
		perftestUsage(fs.Output())
		fs.PrintDefaults()
	}
	var err error
	if o.host, err = parseWithHost(fs, args); err != nil {
		return err
	}
	switch {
	case rdmaCM:
		return errors.New("-R: rdma_cm is not supported by goroce; use the Ethernet exchange")
	case duration != 0:
		return errors.New("-D: duration mode is not supported; use -n")
	case qps != 1:
		return errors.New("-q: goroce perf runs one QP")
	case !strings.EqualFold(connType, "RC"):
		return fmt.Errorf("-c %s: goroce perf runs RC", connType)
	case o.all && !t.all:
		return fmt.Errorf("-a is not supported for %s", t.name)
	case o.port <= 0 || o.port > 65535, o.size <= 0, o.iters < 2, o.txDepth < 1, o.rxDepth < 1, o.cqMod < 1,
		o.outReads < 1 || o.outReads > 128:
		fs.Usage()
		return errUsage
	}
	switch strings.ToUpper(atomicType) {
	case "FETCH_AND_ADD":
	case "CMP_AND_SWAP":
		o.atomicCAS = true
	default:
		return fmt.Errorf("-A %s: FETCH_AND_ADD or CMP_AND_SWAP", atomicType)
	}
	if t.verb == perftestAtomic {
		o.size = 8
	}
	if o.mtu != 0 {
		if _, ok := wire.MTUFromBytes(o.mtu); !ok {
			return fmt.Errorf("-m %d: 256, 512, 1024, 2048 or 4096", o.mtu)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	if err := perftest(ctx, os.Stdout, t, o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitError(1)
	}
	return nil
}

// perftestSizes returns the message sizes of a run: -s, or with -a 2, 4, ... 2^23.
func perftestSizes(o perftestOptions) []int {
	if !o.all {
		return []int{o.size}
	}
	var s []int
	for i := 1; i < 24; i++ {
		s = append(s, 1<<i)
	}
	return s
}

// perftestPeer is the verbs objects of one run, as perftest's struct pingpong_context. The region
// has two halves of maxSize bytes, as perftest's buffer: the local half is what this side sends from
// and reads into, the remote half is what it offers the peer (its vaddr) and receives into.
type perftestPeer struct {
	t       *perftestTest
	o       perftestOptions
	dev     *goroce.Device
	pd      *goroce.PD
	mr      *goroce.MR
	cq      *goroce.CQ
	qp      *goroce.QP
	maxSize int
	local   perftestDest
	rem     perftestDest
	routs   int // receives posted and not completed
}

func newPerftestPeer(addr netip.Addr, t *perftestTest, o perftestOptions) (*perftestPeer, error) {
	p := &perftestPeer{t: t, o: o}
	for _, s := range perftestSizes(o) {
		p.maxSize = max(p.maxSize, s)
	}
	p.maxSize = max(p.maxSize, os.Getpagesize())
	var err error
	if p.dev, err = goroce.Open(goroce.Config{Addr: addr, Port: goroce.DefaultPort}); err != nil {
		return nil, err
	}
	fail := func(err error) (*perftestPeer, error) {
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
	if p.cq, err = p.dev.CreateCQ(o.txDepth + o.rxDepth + 16); err != nil {
		return fail(err)
	}
	p.qp, err = p.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cq, RecvCQ: p.cq,
		MaxSendWR: max(o.txDepth, 16), MaxRecvWR: o.rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return fail(err)
	}
	i := p.qp.Info()
	p.local = perftestDest{outReads: 1, qpn: i.QPN, psn: i.PSN, rkey: p.mr.RKey(),
		vaddr: p.mr.Addr() + uint64(p.maxSize), gid: i.GID}
	if t.verb == perftestRead || t.verb == perftestAtomic {
		p.local.outReads = o.outReads
	}
	return p, nil
}

// connect moves the QP to RTS towards the peer's key message.
func (p *perftestPeer) connect(rem perftestDest, mtu wire.MTU, tcpPeer netip.Addr) error {
	p.rem = rem
	peer := goroce.RemoteInfo{QPN: rem.qpn, PSN: rem.psn, GID: rem.gid}
	if rem.gid == (goroce.GID{}) {
		// The peer runs without a GID index and sent none; RoCE needs one: take the TCP peer's address.
		peer.GID = goroce.GIDFromAddr(tcpPeer)
	}
	rd := uint8(1)
	if p.t.verb == perftestRead || p.t.verb == perftestAtomic {
		rd = uint8(max(1, min(p.local.outReads, rem.outReads)))
	}
	opts := goroce.DefaultConnectOptions()
	opts.MTU, opts.RdAtomic, opts.RNRRetry = mtu, rd, 7 // perftest's rnr_retry: forever
	if err := p.qp.Connect(peer, &opts); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %v", err)
	}
	return nil
}

// postRecvs tops the receive queue up to rx depth; receives land in the remote half.
func (p *perftestPeer) postRecvs(limit int) error {
	for p.routs < min(p.o.rxDepth, limit) {
		if err := p.qp.PostRecv(&goroce.RecvWR{WRID: perftestRecvWRID, SGL: []goroce.SGE{p.mr.SGE(p.maxSize, p.maxSize)}}); err != nil {
			return fmt.Errorf("couldn't post receive: %v", err)
		}
		p.routs++
	}
	return nil
}

// perftestRecvWRID marks receive completions; send work requests are numbered from 0.
const perftestRecvWRID = 1 << 63

// perftest runs one perftest program's side: the exchange, the traffic and the report.
func perftest(ctx context.Context, w io.Writer, t *perftestTest, o perftestOptions) error {
	var local netip.Addr
	if o.addr != "" {
		a, err := netip.ParseAddr(o.addr)
		if err != nil {
			return fmt.Errorf("-addr: %v", err)
		}
		local = a.Unmap()
	}
	client := o.host != ""
	var conn net.Conn
	if client {
		var d net.Dialer
		var err error
		if conn, err = d.DialContext(ctx, "tcp4", net.JoinHostPort(o.host, strconv.Itoa(o.port))); err != nil {
			return fmt.Errorf("couldn't connect to %s:%d: %v", o.host, o.port, err)
		}
	} else {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp4", ":"+strconv.Itoa(o.port))
		if err != nil {
			return fmt.Errorf("couldn't listen to port %d: %v", o.port, err)
		}
		fmt.Fprintln(w, "\n************************************")
		fmt.Fprintln(w, "* Waiting for client to connect... *")
		fmt.Fprintln(w, "************************************")
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		conn, err = ln.Accept()
		stop()
		ln.Close()
		if err != nil {
			return fmt.Errorf("accept() failed: %v", err)
		}
	}
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	tcpPeer := conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	if !local.IsValid() {
		local = conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	}
	p, err := newPerftestPeer(local, t, o)
	if err != nil {
		return err
	}
	// Closing the device first sends what it still holds back, such as the ACK of the peer's last
	// message.
	defer p.dev.Close()
	if o.stats {
		defer func() { printDeviceStats(os.Stderr, p.dev.Stats()) }()
	}
	pc := &perftestConn{c: conn, client: client}

	mtu := wire.MTU4096
	if o.mtu != 0 {
		mtu, _ = wire.MTUFromBytes(o.mtu)
	}
	h, err := pc.hello(os.Getpagesize(), mtu)
	if err != nil {
		return err
	}
	p.printInfo(w, h, client)
	p.printDest(w, "local", p.local)
	rem, err := pc.handshake(p.local)
	if err != nil {
		return err
	}
	p.printDest(w, "remote", rem)
	fmt.Fprintln(w, perftestLine)
	if err := p.connect(rem, h.mtu, tcpPeer); err != nil {
		return err
	}
	barrier := func() error {
		_, err := pc.handshake(p.local)
		return err
	}
	for i := 1; i < t.pre; i++ {
		if err := barrier(); err != nil {
			return err
		}
	}
	bwServer := !t.lat && !client && t.verb != perftestSend
	if t.lat {
		if client || t.verb != perftestRead {
			fmt.Fprint(w, perftestLatHeader)
		}
	} else {
		fmt.Fprint(w, perftestBWHeader)
	}
	var last perftestBWReport
	for _, size := range perftestSizes(o) {
		if t.verb == perftestSend {
			if err := p.postRecvs(o.iters); err != nil {
				return err
			}
		}
		if t.perSize {
			if err := barrier(); err != nil {
				return err
			}
		}
		switch {
		case bwServer:
			// The client drives the traffic; this side's device answers it.
		case t.lat && t.verb == perftestRead && !client:
		case t.lat:
			samples, err := p.latency(ctx, size, client)
			if err != nil {
				return err
			}
			printPerftestLat(w, size, o.iters, samples)
		case t.verb == perftestSend && !client:
			r, err := p.sendBWServer(ctx, size)
			if err != nil {
				return err
			}
			last = r
			printPerftestBW(w, r)
		default:
			r, err := p.bwClient(ctx, size)
			if err != nil {
				return err
			}
			last = r
			printPerftestBW(w, r)
		}
	}
	if t.reports {
		if err := barrier(); err != nil {
			return err
		}
		r, err := pc.xchgReports(last, h.remoteVersion)
		if err != nil {
			return err
		}
		if bwServer {
			// The server measured nothing: it prints the client's report.
			printPerftestBW(w, r)
		}
	}
	fmt.Fprintln(w, perftestLine)
	if t.close {
		if err := barrier(); err != nil {
			return err
		}
		if err := pc.closeConn(); err != nil {
			return fmt.Errorf("couldn't write done: %v", err)
		}
	}
	return nil
}

// printDeviceStats prints a device's counters on one line, name=value, for tests and curious users:
// what went out in GSO runs, what came in, and whether anything was retransmitted or dropped.
func printDeviceStats(w io.Writer, s goroce.Stats) {
	fmt.Fprintf(w, "goroce stats: tx_packets=%d tx_gso=%d gso_fallback=%d rx_packets=%d rx_gro=%d drop_icrc=%d drop_malformed=%d "+
		"completer_retry_err=%d duplicate_request=%d out_of_seq_request=%d\n",
		s.TxPackets, s.TxGSO, s.GSOFallback, s.RxPackets, s.RxGRO, s.DropICRC, s.DropMalformed,
		s.QP.CompleterRetryErr, s.QP.DuplicateRequest, s.QP.OutOfSeqRequest)
}
