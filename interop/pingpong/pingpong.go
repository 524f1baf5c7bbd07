// Package pingpong is a goroce peer for rdma-core's ibv_rc_pingpong, ibv_uc_pingpong and
// ibv_ud_pingpong (libibverbs/examples/rc_pingpong.c, uc_pingpong.c, ud_pingpong.c): the same TCP
// exchange of QP addresses, the same traffic and the same output, so that either side of a run may be
// goroce or the C tool.
//
// A server listens, a client connects, and both print what the C tools print:
//
//	srv, err := pingpong.Listen(ctx, ":18515", pingpong.DefaultOptions(goroce.RC))
//	res, err := srv.Serve(ctx, os.Stdout)
//
//	res, err := pingpong.Connect(ctx, "10.0.0.2:18515", pingpong.DefaultOptions(goroce.RC), os.Stdout)
//
// Listen accepts port 0 (an ephemeral port; Server.Addr says which), so tests need no fixed port.
// Dest, ExchangeClient and ExchangeServer are the exchange itself, for a test that brings its own
// queue pair to a C tool.
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
	// (rc_pingpong -c's "invalid data in page").
	ErrBadData = errors.New("received data differs from the sent pattern")
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
	// Size is the size of a message in bytes (-s): 4096, or 2048 for UD, where a message is one
	// datagram and must fit the MTU.
	Size int
	// MTU is the path MTU (-m): 1024, or 2048 for UD. ud_pingpong has no -m; its datagrams are bounded
	// by the port's MTU, which goroce takes from MTU, so that its default 2048-byte message fits.
	MTU goroce.MTU
	// RxDepth is the number of receives kept posted (-r): 500; at least 2.
	RxDepth int
	// Iters is the number of exchanges (-n): 1000.
	Iters int
	// Check validates the received buffer (-c). rc_pingpong's client puts a 0 at the start of each
	// page of its buffer and the server checks those bytes; goroce checks every byte, on both sides
	// (not for UD, like ud_pingpong, which has no -c).
	Check bool
	// Addr is the local IP address of the goroce device (goroce's -a). The zero Addr takes the local
	// address of the TCP connection, as rc_pingpong's device is the one the route points to.
	Addr netip.Addr
	// Network is where the device's packets travel (goroce.Config.Network): the host's UDP sockets
	// when nil, or a *goroce.MemNetwork for a test whose two sides both run goroce.
	Network goroce.Network
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
	}
	return nil
}

// Result is what a run measured, the figures of rc_pingpong's last two lines.
type Result struct {
	Local, Remote Dest
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

// peer is the verbs objects of one side, as rc_pingpong's struct pingpong_context.
type peer struct {
	dev     *goroce.Device
	pd      *goroce.PD
	mr      *goroce.MR
	cq      *goroce.CQ
	qp      *goroce.QP
	size    int
	ud      bool
	ah      *goroce.AddressHandle // UD: the peer
	peerQPN goroce.QPN            // UD: the peer's QPN
}

// newPeer opens the device at addr, creates the run's objects as pp_init_ctx does and prints the local
// address line.
func newPeer(addr netip.Addr, o Options, client bool, w io.Writer) (*peer, error) {
	r := &peer{size: o.Size, ud: o.Type == goroce.UD}
	var err error
	if r.dev, err = goroce.Open(goroce.Config{Addr: addr, Port: goroce.DefaultPort, Network: o.Network}); err != nil {
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
	if r.ud {
		bufLen += grhLen
	}
	if r.mr, err = r.pd.AllocMR(bufLen, goroce.LocalWrite); err != nil {
		return fail(err)
	}
	buf := r.mr.Bytes()
	for i := range buf {
		buf[i] = fill
	}
	if client && o.Check && !r.ud {
		for i := 0; i < len(buf); i += os.Getpagesize() {
			buf[i] = 0 // rc_pingpong writes i / page_size % sizeof(char): always 0
		}
	}
	if r.cq, err = r.dev.CreateCQ(o.RxDepth + 1); err != nil {
		return fail(err)
	}
	r.qp, err = r.pd.CreateQP(goroce.QPInit{Type: o.Type, SendCQ: r.cq, RecvCQ: r.cq,
		MaxSendWR: 1, MaxRecvWR: o.RxDepth, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return fail(err)
	}
	if r.ud {
		fmt.Fprintln(w, r.local().udLocalLine())
	} else {
		fmt.Fprintln(w, r.local().line("local address: "))
	}
	return r, nil
}

func (r *peer) local() Dest { return DestFromEndpoint(r.qp.Endpoint()) }

func (r *peer) postRecv(n int) int {
	sge := r.mr.SGE(0, r.size)
	if r.ud {
		sge = r.mr.SGE(0, r.size+grhLen)
	}
	for i := 0; i < n; i++ {
		if r.qp.PostRecv(&goroce.RecvWR{WRID: recvWRID, SGL: []goroce.SGE{sge}}) != nil {
			return i
		}
	}
	return n
}

func (r *peer) postSend() error {
	if r.ud {
		return r.qp.PostSend(&goroce.SendWR{WRID: sendWRID, Opcode: goroce.WRSend, Flags: goroce.Signaled,
			SGL: []goroce.SGE{r.mr.SGE(grhLen, r.size)}, AH: r.ah, RemoteQPN: r.peerQPN, RemoteQKey: UDQKey})
	}
	return r.qp.PostSend(&goroce.SendWR{WRID: sendWRID, Opcode: goroce.WRSend, Flags: goroce.Signaled,
		SGL: []goroce.SGE{r.mr.SGE(0, r.size)}})
}

// connect brings the QP to RTS toward the peer, as pp_connect_ctx, and posts the receives.
func (r *peer) connect(rem Dest, tcpPeer netip.Addr, o Options) error {
	peer := rem.Endpoint()
	if rem.GID == (goroce.GID{}) {
		// The peer ran without -g, so it sent no GID; RoCE needs one: take the TCP peer's address.
		peer.GID = goroce.GIDFromAddr(tcpPeer)
	}
	opts := goroce.DefaultConnectOptions()
	// ibv_rc_pingpong's attributes: rnr_retry 7 (forever), max_rd_atomic 1.
	opts.MTU, opts.RdAtomic, opts.QKey, opts.RNRRetry = o.MTU, 1, UDQKey, 7
	if err := r.qp.Connect(peer, &opts); err != nil {
		return fmt.Errorf("failed to modify QP to RTS: %w", err)
	}
	if r.ud {
		r.ah, r.peerQPN = goroce.AH(peer.GID.Addr()), rem.QPN
	}
	if n := r.postRecv(o.RxDepth); n < o.RxDepth {
		return fmt.Errorf("couldn't post receive (%d)", n)
	}
	return nil
}

// run runs the exchange on conn and then the traffic. Without a device yet, it opens one on the TCP
// connection's local address.
//
// The traffic is rc_pingpong's algorithm: both sides keep RxDepth receives posted; the client sends
// first; each side sends its next message once its previous send and a receive have completed; an
// iteration is one completed receive and one completed send.
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
	res := Result{Local: r.local(), Iters: o.Iters, Bytes: int64(o.Size) * int64(o.Iters) * 2}
	connect := func(rem Dest) error { return r.connect(rem, tcpPeer, o) }
	var err error
	if client {
		res.Remote, err = ExchangeClient(conn, res.Local, connect)
	} else {
		res.Remote, err = ExchangeServer(conn, res.Local, connect)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return res, err
	}
	conn.Close()
	fmt.Fprintln(w, res.Remote.line("remote address:"))

	pending := recvWRID
	if client {
		if err := r.postSend(); err != nil {
			return res, fmt.Errorf("couldn't post send: %w", err)
		}
		pending |= sendWRID
	}
	start := time.Now()
	routs := o.RxDepth
	rcnt, scnt := 0, 0
	wc := make([]goroce.Completion, 2)
	for rcnt < o.Iters || scnt < o.Iters {
		n, err := r.cq.Wait(ctx, wc)
		if err != nil {
			return res, fmt.Errorf("poll CQ failed: %w (%d sends, %d receives completed)", err, scnt, rcnt)
		}
		for _, e := range wc[:n] {
			if e.Status != goroce.StatusSuccess {
				return res, &CompletionError{Completion: e}
			}
			switch e.WRID {
			case sendWRID:
				scnt++
			case recvWRID:
				if routs--; routs <= 1 {
					routs += r.postRecv(o.RxDepth - routs)
					if routs < o.RxDepth {
						return res, fmt.Errorf("couldn't post receive (%d)", routs)
					}
				}
				rcnt++
			default:
				return res, fmt.Errorf("completion for unknown wr_id %d", e.WRID)
			}
			pending &^= int(e.WRID)
			if scnt < o.Iters && pending == 0 {
				if err := r.postSend(); err != nil {
					return res, fmt.Errorf("couldn't post send: %w", err)
				}
				pending = recvWRID | sendWRID
			}
		}
	}
	res.Elapsed = time.Since(start)
	usec := res.usec()
	fmt.Fprintf(w, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", res.Bytes, usec/1e6, res.MbitPerSec())
	fmt.Fprintf(w, "%d iters in %.2f seconds = %.2f usec/iter\n", res.Iters, usec/1e6, res.UsecPerIter())
	var bad error
	if o.Check && !r.ud {
		bad = r.check(w)
	}
	if o.Type == goroce.RC {
		t := time.NewTimer(linger)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return res, bad
}

// check verifies the buffer after a run. Both sides send from and receive into one buffer, so after
// the run each holds the client's pattern: the fill byte everywhere but a 0 at the start of each page.
// rc_pingpong checks the first byte of each page on the server; goroce checks every byte, on both
// sides, and prints rc_pingpong's line for each bad page.
func (r *peer) check(w io.Writer) error {
	pageSize := os.Getpagesize()
	var bad error
	buf := r.mr.Bytes()
	for p := 0; p < len(buf); p += pageSize {
		for i := p; i < min(p+pageSize, len(buf)); i++ {
			want := byte(fill)
			if i == p {
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

// addrOf returns the IP address of a TCP address, or the zero Addr for any other.
func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
