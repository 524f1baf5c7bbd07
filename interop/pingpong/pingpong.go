// Package pingpong is a goroce peer for rdma-core's ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong
// and ibv_srq_pingpong (libibverbs/examples/rc_pingpong.c, uc_pingpong.c, ud_pingpong.c,
// srq_pingpong.c): the same TCP exchange of QP addresses, the same traffic and the same output, so
// that either side of a run may be goroce or the C tool.
//
// A server listens, a client connects, and both print what the C tools print:
//
//	srv, err := pingpong.Listen(ctx, ":18515", pingpong.DefaultOptions(goroce.RC))
//	res, err := srv.Serve(ctx, os.Stdout)
//
//	res, err := pingpong.Connect(ctx, "10.0.0.2:18515", pingpong.DefaultOptions(goroce.RC), os.Stdout)
//
// DefaultSRQOptions gives ibv_srq_pingpong's run: several RC queue pairs (-q) that share one shared
// receive queue.
//
// Listen accepts port 0 (an ephemeral port; Server.Addr says which), so tests need no fixed port.
// Dest, ExchangeClient and ExchangeServer (ExchangeSRQClient and ExchangeSRQServer for srq_pingpong)
// are the exchange itself, for a test that brings its own queue pairs to a C tool.
//
// The goroce devices this package opens use the RoCEv2 port, goroce.DefaultPort, because the C tools'
// peers (rxe, RoCE NICs) send there.
package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/goroce/goroce"
)

// DefaultPort is the TCP port rc_pingpong listens on and connects to unless -p says otherwise.
const DefaultPort = 18515

// UDQKey is the Q_Key of every ud_pingpong datagram (ud_pingpong.c's 0x11111111); RC and UC QPs
// ignore it.
const UDQKey goroce.QKey = 0x11111111

// The work request IDs of rc_pingpong (PINGPONG_RECV_WRID, PINGPONG_SEND_WRID). The pending mask is
// made of them.
const (
	recvWRID = 1
	sendWRID = 2
)

// fill is the byte rc_pingpong fills its buffer with (memset 0x7b).
const fill = 0x7b

// grhLen is the room ud_pingpong keeps at the start of each receive buffer for the GRH (IBTA Annex
// A17.4.5.2), which its sends skip too.
const grhLen = 40

// linger is how long an RC run keeps its QP after its last completion. The peer's last SEND may come
// again: goroce's ACK to it can be lost, and the peer, whose run is not over until that SEND
// completes, retransmits it after its timeout (rc_pingpong sets timeout 14: 4.096 µs·2^14 = 67 ms).
// rc_pingpong destroys its QP at once, so a peer may then retry into nothing; goroce stays long enough
// for four such timeouts and re-ACKs the duplicate (IBTA 9.9.1.1).
const linger = 300 * time.Millisecond

// Errors of a run. They match with errors.Is.
var (
	// ErrBadOptions: Options.Validate refused the options.
	ErrBadOptions = errors.New("pingpong: invalid options")
	// ErrBadData: with Options.Check, the buffer after the run does not hold the client's pattern
	// (rc_pingpong -c's "invalid data in page"), or a receive did not carry Options.Size bytes.
	ErrBadData = errors.New("received data differs from the sent pattern")
	// ErrQPCount: the two sides of an SRQ run have different numbers of QPs (-q). srq_pingpong does
	// not notice: it connects its QPs to whatever the messages say, QPN 0 included, and on rxe, which
	// retries a retry_cnt of 7 forever (rxe_comp.c), a QP without a peer sends until it is killed.
	ErrQPCount = errors.New("the two sides run different numbers of QPs")
)

// CompletionError is a work request of the run that failed, as rc_pingpong reports "Failed status
// ... for wr_id". It unwraps to Completion.Err, so errors.Is(err, goroce.ErrRetryExceeded) and friends
// match.
type CompletionError struct {
	Completion goroce.Completion
}

// Error returns rc_pingpong's message.
func (e *CompletionError) Error() string {
	wc := &e.Completion
	return fmt.Sprintf("failed status %v (%d) for wr_id %d", wc.Status, int(wc.Status), wc.WRID)
}

// Unwrap returns the completion's *goroce.WCError.
func (e *CompletionError) Unwrap() error { return e.Completion.Err() }

// Options are a run's parameters, the flags of the pingpong tools. Every field means what it says;
// start from DefaultOptions, which gives the tools' defaults.
type Options struct {
	// Type is the transport and so the tool: goroce.RC (ibv_rc_pingpong), goroce.UC (ibv_uc_pingpong)
	// or goroce.UD (ibv_ud_pingpong).
	Type goroce.QPType
	// SRQ makes the run ibv_srq_pingpong's, with Type RC: NumQP queue pairs whose receives come from
	// one shared receive queue of RxDepth receives, one CQ of RxDepth+NumQP completions for them all,
	// and the exchange of MaxQP address messages each way (ExchangeSRQClient). Each QP runs its own
	// pingpong: the client sends first on every QP, and each sends its next message once its previous
	// send and a receive on it have completed.
	SRQ bool
	// NumQP is the number of queue pairs of an SRQ run (srq_pingpong's -q): 16, at most MaxQP-1.
	// Other runs have one and leave it 0.
	NumQP int
	// Size is the size of a message in bytes (-s): 4096, or 2048 for UD, where a message is one
	// datagram and must fit the MTU.
	Size int
	// MTU is the path MTU (-m): 1024, or 2048 for UD. ud_pingpong has no -m; its datagrams are bounded
	// by the port's MTU, which goroce takes from MTU, so that its default 2048-byte message fits.
	MTU goroce.MTU
	// RxDepth is the number of receives kept posted (-r): 500; at least 2, and at least NumQP.
	RxDepth int
	// Iters is the number of exchanges (-n): 1000. An SRQ run counts them across all its QPs, as
	// srq_pingpong's loop does (its usage says "per QP"; its loop does not).
	Iters int
	// Check validates the received buffer (-c). rc_pingpong's client puts a 0 at the start of each
	// page of its buffer (filled with 0x7b) and the server checks those bytes; goroce checks every
	// byte, on both sides, and that every receive carried Size bytes (not for UD). srq_pingpong's
	// buffer is all zeros, so its check cannot fail; goroce's SRQ run receives into a buffer of its
	// own that starts filled with 0x7b, and checks that received zeros replaced every byte.
	Check bool
	// Addr is the local IP address of the goroce device (goroce's -a). The zero Addr takes the local
	// address of the TCP connection, as rc_pingpong's device is the one the route points to.
	Addr netip.Addr
	// Network is where the device's packets travel (goroce.Config.Network): the host's UDP sockets
	// when nil, or a *goroce.MemNetwork for a test whose two sides both run goroce.
	Network goroce.Network
	// Tracer, if set, sees every packet the device sends and receives (goroce.Config.Tracer): a
	// capture.Writer's Tracer writes them to a pcapng file, as goroce pingpong -w does.
	Tracer goroce.Tracer
}

// DefaultOptions returns the defaults of the pingpong tool for t: ibv_rc_pingpong's for RC,
// ibv_uc_pingpong's for UC and ibv_ud_pingpong's (2048-byte messages, on a 2048-byte MTU) for UD.
func DefaultOptions(t goroce.QPType) Options {
	o := Options{Type: t, Size: 4096, MTU: goroce.MTU1024, RxDepth: 500, Iters: 1000}
	if t == goroce.UD {
		o.Size, o.MTU = 2048, goroce.MTU2048
	}
	return o
}

// DefaultSRQOptions returns ibv_srq_pingpong's defaults: 16 RC queue pairs on one shared receive
// queue, 4096-byte messages, path MTU 1024, 500 receives, 1000 exchanges.
func DefaultSRQOptions() Options {
	o := DefaultOptions(goroce.RC)
	o.SRQ, o.NumQP = true, 16
	return o
}

// numQP returns the number of queue pairs of the run.
func (o *Options) numQP() int {
	if o.SRQ {
		return o.NumQP
	}
	return 1
}

// Validate reports options the tools would refuse, as an error matching ErrBadOptions.
func (o *Options) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadOptions, fmt.Sprintf(format, a...))
	}
	switch {
	case o.Type != goroce.RC && o.Type != goroce.UC && o.Type != goroce.UD:
		return bad("type %v: RC, UC or UD", o.Type)
	case !o.MTU.Valid():
		return bad("MTU %v", o.MTU)
	case o.Size <= 0:
		return bad("size %d", o.Size)
	case o.Type == goroce.UD && o.Size > o.MTU.Bytes():
		return bad("size %d: a UD datagram must fit the %d-byte path MTU", o.Size, o.MTU.Bytes())
	case o.RxDepth <= 1:
		return bad("rx depth %d: at least 2", o.RxDepth)
	case o.Iters <= 0:
		return bad("iters %d", o.Iters)
	case o.SRQ && o.Type != goroce.RC:
		return bad("an SRQ run is RC, not %v", o.Type)
	case o.SRQ && (o.NumQP < 1 || o.NumQP >= MaxQP):
		return bad("%d QPs: 1 to %d", o.NumQP, MaxQP-1)
	case !o.SRQ && o.NumQP > 1:
		return bad("%d QPs: only an SRQ run has more than one", o.NumQP)
	case o.SRQ && o.RxDepth < o.NumQP:
		return bad("rx depth %d is too small for %d QPs: at least one receive per QP", o.RxDepth, o.NumQP)
	}
	return nil
}

// Result is what a run measured, the figures of rc_pingpong's last two lines.
type Result struct {
	// Local and Remote are the addresses of the run's first QP and of its peer.
	Local, Remote Dest
	// LocalQPs and RemoteQPs are the addresses of all the run's QPs and of their peers, in order: one
	// each but in an SRQ run.
	LocalQPs, RemoteQPs []Dest
	// Bytes is what the run moved both ways: Size × Iters × 2.
	Bytes int64
	Iters int
	// Elapsed runs from the first send to the last completion.
	Elapsed time.Duration
}

// MbitPerSec returns the throughput as rc_pingpong prints it: bits per microsecond.
func (r Result) MbitPerSec() float64 { return float64(r.Bytes) * 8 / r.usec() }

// UsecPerIter returns the time of one exchange in microseconds.
func (r Result) UsecPerIter() float64 { return r.usec() / float64(r.Iters) }

func (r Result) usec() float64 { return float64(r.Elapsed.Nanoseconds()) / 1e3 }

// Server is a pingpong server that listens for one client, as the C tools run without a host
// argument.
type Server struct {
	ln net.Listener
	o  Options
}

// Listen checks o and listens on the TCP address (":18515" as the C tools, or "127.0.0.1:0" for an
// ephemeral port); Serve then accepts one client.
func Listen(ctx context.Context, address string, o Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", address)
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

// Serve waits for one client, runs the exchange and the traffic, and closes the listener. It writes
// the server tool's output to w (nil discards it): its local address first, once it listens when
// Options.Addr is set (a client started after that line connects), or else once the client has
// connected. It returns when the run is over, ctx ends, or the run fails; on failure the Result holds
// what the run got to.
func (s *Server) Serve(ctx context.Context, w io.Writer) (Result, error) {
	defer s.Close()
	ss := newSession(s.o, false, w)
	defer ss.close()
	if s.o.Addr.IsValid() {
		if err := ss.open(s.o.Addr.Unmap()); err != nil {
			return Result{}, err
		}
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
	return ss.run(ctx, conn)
}

// Connect is the client: it connects to the server at the TCP address (host:port), runs the exchange
// and the traffic, and writes the client tool's output to w (nil discards it). On failure the Result
// holds what the run got to.
func Connect(ctx context.Context, address string, o Options, w io.Writer) (Result, error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	ss := newSession(o, true, w)
	defer ss.close()
	if o.Addr.IsValid() {
		if err := ss.open(o.Addr.Unmap()); err != nil {
			return Result{}, err
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return Result{}, fmt.Errorf("couldn't connect to %s: %w", address, err)
	}
	return ss.run(ctx, conn)
}

// session is one side of a run: its options, its role, where it prints, and its verbs objects once
// the device is open.
type session struct {
	o      Options
	client bool
	w      io.Writer
	r      *peer // nil until open
}

func newSession(o Options, client bool, w io.Writer) *session {
	if w == nil {
		w = io.Discard
	}
	return &session{o: o, client: client, w: w}
}

// open opens the device at addr and creates the run's objects.
func (s *session) open(addr netip.Addr) error {
	var err error
	s.r, err = newPeer(addr, s.o, s.client, s.w)
	return err
}

// close closes the device, if open. Closing the device first sends the ACK of the peer's last
// message, which the device may still be holding back for company (Config.AckDelay).
func (s *session) close() {
	if s.r != nil {
		s.r.dev.Close()
	}
}

// peer is the verbs objects of one side, as the tools' struct pingpong_context.
type peer struct {
	dev  *goroce.Device
	pd   *goroce.PD
	mr   *goroce.MR
	cq   *goroce.CQ
	srq  *goroce.SRQ // SRQ runs: the receives of every QP
	qps  []*goroce.QP
	qpn  map[goroce.QPN]int // index in qps, as srq_pingpong's find_qp
	send goroce.SGE         // what each send sends
	recv goroce.SGE         // where each receive lands
	ud   bool
	ah   *goroce.AddressHandle // UD: the peer
	// peerQPN is a UD run's peer QPN.
	peerQPN goroce.QPN
}

// newPeer opens the device at addr, creates the run's objects as pp_init_ctx does and prints the local
// address lines.
func newPeer(addr netip.Addr, o Options, client bool, w io.Writer) (*peer, error) {
	r := &peer{ud: o.Type == goroce.UD, qpn: make(map[goroce.QPN]int)}
	cfg := goroce.Config{Addr: addr, Port: goroce.DefaultPort, Network: o.Network, Tracer: o.Tracer}
	if o.SRQ {
		// All the QPs on one shard: their receives land in one buffer, which goroce then writes
		// from one goroutine at a time (and the waiter in CQ.Wait drives that shard itself).
		cfg.Shards = 1
	}
	var err error
	if r.dev, err = goroce.Open(cfg); err != nil {
		return nil, err
	}
	fail := func(err error) (*peer, error) {
		r.dev.Close()
		return nil, err
	}
	if r.pd, err = r.dev.AllocPD(); err != nil {
		return fail(err)
	}
	bufLen := o.Size
	switch {
	case r.ud:
		bufLen += grhLen
	case o.SRQ:
		bufLen *= 2
	}
	if r.mr, err = r.pd.AllocMR(bufLen, goroce.LocalWrite); err != nil {
		return fail(err)
	}
	buf := r.mr.Bytes()
	switch {
	case r.ud:
		r.send, r.recv = r.mr.SGE(grhLen, o.Size), r.mr.SGE(0, bufLen)
	case o.SRQ:
		// srq_pingpong sends from and receives into one buffer of zeros (memset 0), where every QP
		// receives at once. goroce sends the same zeros from the first half of its region, which
		// nothing writes, and receives into the second half, so that sends never read what a
		// receive is writing. With Check, the second half starts filled with rc_pingpong's 0x7b,
		// which the received zeros must replace.
		r.send, r.recv = r.mr.SGE(0, o.Size), r.mr.SGE(o.Size, o.Size)
		if o.Check {
			fillBytes(buf[o.Size:], fill)
		}
	default:
		r.send, r.recv = r.mr.SGE(0, o.Size), r.mr.SGE(0, o.Size)
	}
	if !o.SRQ {
		fillBytes(buf, fill)
		if client && o.Check && !r.ud {
			for i := 0; i < len(buf); i += os.Getpagesize() {
				buf[i] = 0 // rc_pingpong writes i / page_size % sizeof(char): always 0
			}
		}
	}
	n := o.numQP()
	if r.cq, err = r.dev.CreateCQ(o.RxDepth + n); err != nil {
		return fail(err)
	}
	init := goroce.QPInit{Type: o.Type, SendCQ: r.cq, RecvCQ: r.cq, MaxSendWR: 1, MaxRecvWR: o.RxDepth,
		MaxSendSGE: 1, MaxRecvSGE: 1}
	if o.SRQ {
		if r.srq, err = r.pd.CreateSRQ(o.RxDepth, 1); err != nil {
			return fail(fmt.Errorf("couldn't create SRQ: %w", err))
		}
		init.SRQ, init.MaxRecvWR, init.MaxRecvSGE = r.srq, 0, 0
	}
	for i := range n {
		qp, err := r.pd.CreateQP(init)
		if err != nil {
			return fail(fmt.Errorf("couldn't create QP[%d]: %w", i, err))
		}
		r.qps = append(r.qps, qp)
		r.qpn[qp.QPN()] = i
	}
	if o.SRQ {
		// srq_pingpong posts its receives before the exchange: the SRQ takes them in any QP state.
		if k := r.postRecv(o.RxDepth); k < o.RxDepth {
			return fail(fmt.Errorf("couldn't post receive (%d)", k))
		}
	}
	for _, d := range r.locals() {
		if r.ud {
			fmt.Fprintln(w, d.udLocalLine())
		} else {
			fmt.Fprintln(w, d.line("local address: "))
		}
	}
	return r, nil
}

// locals returns the Dests of the run's QPs.
func (r *peer) locals() []Dest {
	d := make([]Dest, len(r.qps))
	for i, qp := range r.qps {
		d[i] = DestFromEndpoint(qp.Endpoint())
	}
	return d
}

// postRecv posts n receives, on the SRQ or on the one QP, and returns how many it posted.
func (r *peer) postRecv(n int) int {
	wr := &goroce.RecvWR{WRID: recvWRID, SGL: []goroce.SGE{r.recv}}
	for i := range n {
		var err error
		if r.srq != nil {
			err = r.srq.PostRecv(wr)
		} else {
			err = r.qps[0].PostRecv(wr)
		}
		if err != nil {
			return i
		}
	}
	return n
}

// postSend posts the next message on QP i.
func (r *peer) postSend(i int) error {
	wr := &goroce.SendWR{WRID: sendWRID, Opcode: goroce.WRSend, Flags: goroce.Signaled, SGL: []goroce.SGE{r.send}}
	if r.ud {
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = r.ah, r.peerQPN, UDQKey
	}
	return r.qps[i].PostSend(wr)
}

// connect brings each QP to RTS toward its peer in rem, as pp_connect_ctx, and posts the receives of
// a run without an SRQ. rem holds the QPs the peer announced: one per local QP.
func (r *peer) connect(rem []Dest, tcpPeer netip.Addr, o Options) error {
	switch {
	case len(rem) == 0:
		// What a goroce server answers when the numbers differ (ExchangeSRQServer).
		return fmt.Errorf("%w: the peer announced no QPs (it refused this side's %d)", ErrQPCount, len(r.qps))
	case len(rem) != len(r.qps):
		return fmt.Errorf("%w: the peer announced %d QPs, this side runs %d (-q)", ErrQPCount, len(rem), len(r.qps))
	}
	// The tools' attributes: rnr_retry 7 (forever), max_rd_atomic 1, qp_access_flags 0 (SENDs only).
	opts := goroce.DefaultConnectOptions()
	opts.MTU, opts.RdAtomic, opts.QKey, opts.RNRRetry, opts.Access = o.MTU, 1, UDQKey, 7, 0
	for i, qp := range r.qps {
		peer := rem[i].Endpoint()
		if rem[i].GID == (goroce.GID{}) {
			// The peer ran without -g, so it sent no GID; RoCE needs one: take the TCP peer's address.
			peer.GID = goroce.GIDFromAddr(tcpPeer)
		}
		if err := qp.Connect(peer, &opts); err != nil {
			if len(r.qps) > 1 {
				return fmt.Errorf("failed to modify QP[%d] to RTS: %w", i, err)
			}
			return fmt.Errorf("failed to modify QP to RTS: %w", err)
		}
		if r.ud {
			r.ah, r.peerQPN = goroce.AH(peer.GID.Addr()), rem[i].QPN
		}
	}
	if r.srq == nil {
		if n := r.postRecv(o.RxDepth); n < o.RxDepth {
			return fmt.Errorf("couldn't post receive (%d)", n)
		}
	}
	return nil
}

// run runs the exchange on conn and then the traffic. Without a device yet, it opens one on the TCP
// connection's local address.
//
// The traffic is rc_pingpong's algorithm, per QP in an SRQ run as srq_pingpong's: RxDepth receives
// are kept posted (reposted once no more than one per QP is left); the client sends first on each QP;
// each QP sends its next message once its previous send and a receive on it have completed, until
// Iters sends have completed; the run ends when Iters sends and Iters receives have completed.
func (s *session) run(ctx context.Context, conn net.Conn) (Result, error) {
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	o, client, w := s.o, s.client, s.w
	tcpPeer := addrOf(conn.RemoteAddr())
	if s.r == nil {
		local := addrOf(conn.LocalAddr())
		if !local.IsValid() {
			return Result{}, fmt.Errorf("no IP address to open the device on: the connection is from %v", conn.LocalAddr())
		}
		if err := s.open(local); err != nil {
			return Result{}, err
		}
	}
	r := s.r
	res := Result{LocalQPs: r.locals(), Iters: o.Iters, Bytes: int64(o.Size) * int64(o.Iters) * 2}
	res.Local = res.LocalQPs[0]
	connect := func(rem []Dest) error { return r.connect(rem, tcpPeer, o) }
	msgs := 1
	if o.SRQ {
		msgs = MaxQP
	}
	var err error
	if client {
		res.RemoteQPs, err = exchangeClient(conn, res.LocalQPs, msgs, connect)
	} else {
		res.RemoteQPs, err = exchangeServer(conn, res.LocalQPs, msgs, connect)
	}
	if len(res.RemoteQPs) > 0 {
		res.Remote = res.RemoteQPs[0]
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return res, err
	}
	conn.Close()
	for _, d := range res.RemoteQPs {
		fmt.Fprintln(w, d.line("remote address:"))
	}

	n := len(r.qps)
	pending := make([]int, n)
	for i := range pending {
		pending[i] = recvWRID
		if client {
			if err := r.postSend(i); err != nil {
				return res, fmt.Errorf("couldn't post send: %w", err)
			}
			pending[i] |= sendWRID
		}
	}
	start := time.Now()
	routs := o.RxDepth
	rcnt, scnt := 0, 0
	wc := make([]goroce.Completion, 2) // rc_pingpong polls two at a time
	if o.SRQ {
		wc = make([]goroce.Completion, o.RxDepth+n) // srq_pingpong: as many as may be queued
	}
	for rcnt < o.Iters || scnt < o.Iters {
		// The tools poll unless -e makes them sleep on the CQ; goroce always sleeps (CQ.Wait): the
		// waiter receives its QPs' packets itself, while a goroutine that spins on CQ.Poll keeps the
		// Go scheduler from polling the network (it then does so every 10 ms from sysmon), which made
		// a 1-byte pingpong between two goroce processes take 9.4 ms an iteration instead of 42 us.
		k, err := r.cq.Wait(ctx, wc)
		if err != nil {
			return res, fmt.Errorf("poll CQ failed: %w (%d sends, %d receives completed)", err, scnt, rcnt)
		}
		for _, e := range wc[:k] {
			if e.Status != goroce.StatusSuccess {
				return res, &CompletionError{Completion: e}
			}
			i, ok := r.qpn[e.QPN]
			if !ok {
				return res, fmt.Errorf("couldn't find QPN %06x", uint32(e.QPN))
			}
			switch e.WRID {
			case sendWRID:
				scnt++
			case recvWRID:
				if o.Check && !r.ud && int(e.ByteLen) != o.Size {
					return res, fmt.Errorf("%w: a receive of %d bytes on QPN %06x, want %d", ErrBadData, e.ByteLen, uint32(e.QPN), o.Size)
				}
				if routs--; routs <= n {
					routs += r.postRecv(o.RxDepth - routs)
					if routs < o.RxDepth {
						return res, fmt.Errorf("couldn't post receive (%d)", routs)
					}
				}
				rcnt++
			default:
				return res, fmt.Errorf("completion for unknown wr_id %d", e.WRID)
			}
			pending[i] &^= int(e.WRID)
			if scnt < o.Iters && pending[i] == 0 {
				if err := r.postSend(i); err != nil {
					return res, fmt.Errorf("couldn't post send: %w", err)
				}
				pending[i] = recvWRID | sendWRID
			}
		}
	}
	res.Elapsed = time.Since(start)
	usec := res.usec()
	fmt.Fprintf(w, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", res.Bytes, usec/1e6, res.MbitPerSec())
	fmt.Fprintf(w, "%d iters in %.2f seconds = %.2f usec/iter\n", res.Iters, usec/1e6, res.UsecPerIter())
	if o.Type == goroce.RC {
		t := time.NewTimer(linger)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	// The run is over: close the device, which ends every write into the buffer (an SRQ peer's
	// extra messages may still be arriving), and check what the buffer holds. Closing deregisters
	// the region, which then shows no bytes: keep them.
	buf := r.mr.Bytes()
	r.dev.Close()
	if o.Check && !r.ud {
		return res, check(w, buf, o)
	}
	return res, nil
}

// check verifies buf, the region's bytes, after a run. In rc_pingpong's run both sides send from and receive into
// one buffer, so after the run each holds the client's pattern: the fill byte everywhere but a 0 at the
// start of each page. In an SRQ run the receive half must hold srq_pingpong's zeros. The tools check the
// first byte of each page on the server; goroce checks every byte, on both sides, and prints their line
// for each bad page.
func check(w io.Writer, buf []byte, o Options) error {
	pageSize := os.Getpagesize()
	var bad error
	if o.SRQ {
		buf = buf[o.Size:]
	}
	for p := 0; p < len(buf); p += pageSize {
		for i := p; i < min(p+pageSize, len(buf)); i++ {
			want := byte(fill)
			if i == p || o.SRQ {
				want = 0
			}
			if buf[i] != want {
				fmt.Fprintf(w, "invalid data in page %d\n", p/pageSize)
				bad = ErrBadData
				break
			}
		}
	}
	return bad
}

// fillBytes sets every byte of b to c.
func fillBytes(b []byte, c byte) {
	for i := range b {
		b[i] = c
	}
}

// addrOf returns the IP address of a TCP address, or the zero Addr for any other.
func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
