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

func init() {
	register(command{"pingpong", "a peer for ibv_rc_pingpong, ibv_uc_pingpong and ibv_ud_pingpong: same flags, TCP exchange and output", runPingpong})
}

// The work request IDs of rc_pingpong: a receive and a send. The pending mask is made of them.
const (
	pingpongRecvWRID = 1
	pingpongSendWRID = 2
)

// pingpongMsgLen is the size of rc_pingpong's out-of-band message: "%04x:%06x:%06x:%s" with a 32-digit
// GID, plus its NUL.
const pingpongMsgLen = len("0000:000000:000000:00000000000000000000000000000000") + 1

// pingpongDone is what the client sends after reading the server's message, NUL included.
const pingpongDone = "done\x00"

// pingpongFill is the byte rc_pingpong fills its buffer with.
const pingpongFill = 0x7b

// pingpongLinger is how long an RC run keeps its QP after its last completion. The peer's last SEND
// may come again: goroce's ACK to it can be lost, and the peer, whose run is not over until that SEND
// completes, retransmits it after its timeout (rc_pingpong sets timeout 14: 4.096 µs·2^14 = 67 ms).
// rc_pingpong destroys its QP at once, so a peer may then retry into nothing; goroce stays long enough
// for four such timeouts and re-ACKs the duplicate (IBTA 9.9.1.1).
const pingpongLinger = 300 * time.Millisecond

// ud_pingpong's constants: every datagram's Q_Key, and the room at the start of each receive buffer for
// the GRH (IBTA Annex A17.4.5.2), which sends skip too.
const (
	pingpongUDQKey = 0x11111111
	pingpongGRH    = 40
)

type pingpongOptions struct {
	host    string // server to connect to; empty: be the server
	port    int
	size    int
	mtu     int
	rxDepth int
	iters   int
	events  bool
	gidx    int
	chk     bool
	addr    string // local IP address the device binds to; empty: the TCP connection's local address
	qpType  goroce.QPType
	timeout time.Duration
}

func runPingpong(args []string) error {
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	o := pingpongOptions{}
	both := func(p *int, short, long string, def int, help string) {
		fs.IntVar(p, short, def, help)
		fs.IntVar(p, long, def, help)
	}
	var dev, qpType string
	var ibPort, sl int
	var odp, ts bool
	both(&o.port, "p", "port", 18515, "listen on/connect to TCP port")
	fs.StringVar(&dev, "d", "", "IB device (ignored: goroce is the device)")
	fs.StringVar(&dev, "ib-dev", "", "IB device (ignored)")
	both(&ibPort, "i", "ib-port", 1, "port of the IB device (ignored)")
	both(&o.size, "s", "size", 4096, "size of message to exchange")
	both(&o.mtu, "m", "mtu", 1024, "path MTU")
	both(&o.rxDepth, "r", "rx-depth", 500, "number of receives to post at a time")
	both(&o.iters, "n", "iters", 1000, "number of exchanges")
	both(&sl, "l", "sl", 0, "service level (ignored)")
	fs.BoolVar(&o.events, "e", false, "sleep on CQ events (goroce always does)")
	fs.BoolVar(&o.events, "events", false, "sleep on CQ events (goroce always does)")
	both(&o.gidx, "g", "gid-idx", -1, "local port GID index (goroce has one GID, the IPv4-mapped address)")
	fs.BoolVar(&odp, "o", false, "use on-demand paging (not supported)")
	fs.BoolVar(&odp, "odp", false, "use on-demand paging (not supported)")
	fs.BoolVar(&ts, "t", false, "get CQE with timestamp (not supported)")
	fs.BoolVar(&ts, "ts", false, "get CQE with timestamp (not supported)")
	fs.BoolVar(&o.chk, "c", false, "validate received buffer")
	fs.BoolVar(&o.chk, "chk", false, "validate received buffer")
	fs.StringVar(&o.addr, "a", "", "local IP address of the goroce device (default: the address the TCP exchange uses)")
	fs.StringVar(&o.addr, "addr", "", "local IP address of the goroce device")
	fs.StringVar(&qpType, "qp-type", "rc", "rc (ibv_rc_pingpong), uc (ibv_uc_pingpong) or ud (ibv_ud_pingpong)")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long (0: never, like rc_pingpong)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage:")
		fmt.Fprintln(w, "  goroce pingpong [flags]          start a server and wait for connection")
		fmt.Fprintln(w, "  goroce pingpong [flags] <host>   connect to server at <host>")
		fs.PrintDefaults()
	}
	var err error
	if o.host, err = parseWithHost(fs, args); err != nil {
		return err
	}
	switch {
	case odp:
		return errors.New("on-demand paging is not supported by goroce")
	case ts:
		return errors.New("completion timestamps are not supported by goroce")
	case o.port <= 0 || o.port > 65535, o.size <= 0, o.rxDepth <= 1, o.iters <= 0:
		fs.Usage()
		return errUsage
	}
	if _, ok := wire.MTUFromBytes(o.mtu); !ok {
		fs.Usage()
		return errUsage
	}
	sizeSet := false
	fs.Visit(func(f *flag.Flag) { sizeSet = sizeSet || f.Name == "s" || f.Name == "size" })
	switch strings.ToLower(qpType) {
	case "rc":
		o.qpType = goroce.RC
	case "uc":
		o.qpType = goroce.UC
	case "ud":
		o.qpType = goroce.UD
		if !sizeSet {
			o.size = 2048 // ud_pingpong's default: one datagram, no larger than the MTU
		}
		if o.size > o.mtu {
			return fmt.Errorf("-s %d: a UD datagram must fit the %d-byte path MTU", o.size, o.mtu)
		}
	default:
		return fmt.Errorf("-qp-type %q: rc, uc or ud", qpType)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	if err := pingpong(ctx, os.Stdout, os.Stderr, o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitError(1)
	}
	return nil
}

// pingpongDest is one side's out-of-band message.
type pingpongDest struct {
	lid uint16
	qpn wire.QPN
	psn wire.PSN
	gid goroce.GID
}

func (d pingpongDest) encode() []byte {
	b := make([]byte, pingpongMsgLen)
	copy(b, fmt.Sprintf("%04x:%06x:%06x:%s", d.lid, uint32(d.qpn), uint32(d.psn), d.gid.Hex()))
	return b
}

func parsePingpongDest(b []byte) (pingpongDest, error) {
	var d pingpongDest
	s := strings.TrimRight(string(b), "\x00")
	f := strings.Split(s, ":")
	if len(f) != 4 {
		return d, fmt.Errorf("bad remote address %q", s)
	}
	lid, err1 := strconv.ParseUint(f[0], 16, 16)
	qpn, err2 := strconv.ParseUint(f[1], 16, 24)
	psn, err3 := strconv.ParseUint(f[2], 16, 24)
	gid, ok := goroce.ParseGIDHex(f[3])
	if err := errors.Join(err1, err2, err3); err != nil || !ok {
		return d, fmt.Errorf("bad remote address %q", s)
	}
	return pingpongDest{lid: uint16(lid), qpn: wire.QPN(qpn), psn: wire.PSN(psn), gid: gid}, nil
}

// gidText prints a GID as rc_pingpong does, with inet_ntop(AF_INET6).
func gidText(g goroce.GID) string { return netip.AddrFrom16(g).String() }

func (d pingpongDest) line(which string) string {
	return fmt.Sprintf("  %s LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s", which, d.lid, uint32(d.qpn), uint32(d.psn), gidText(d.gid))
}

// udLocalLine is ud_pingpong's local address line, which has a colon where the others have a comma.
func (d pingpongDest) udLocalLine() string {
	return fmt.Sprintf("  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x: GID %s", d.lid, uint32(d.qpn), uint32(d.psn), gidText(d.gid))
}

// pingpongCtx is the verbs objects of one run, as rc_pingpong's struct pingpong_context.
type pingpongCtx struct {
	dev  *goroce.Device
	pd   *goroce.PD
	mr   *goroce.MR
	cq   *goroce.CQ
	qp   *goroce.QP
	size int
	ud   bool
	ah   *goroce.AddressHandle // UD: the peer
	peer wire.QPN              // UD: the peer's QPN
}

func newPingpongCtx(addr netip.Addr, o pingpongOptions) (*pingpongCtx, error) {
	c := &pingpongCtx{size: o.size, ud: o.qpType == goroce.UD}
	var err error
	if c.dev, err = goroce.Open(goroce.Config{Addr: addr, Port: goroce.DefaultPort}); err != nil {
		return nil, err
	}
	fail := func(err error) (*pingpongCtx, error) {
		c.dev.Close()
		return nil, err
	}
	if c.pd, err = c.dev.AllocPD(); err != nil {
		return fail(err)
	}
	bufLen := o.size
	if c.ud {
		bufLen += pingpongGRH
	}
	if c.mr, err = c.pd.AllocMR(bufLen, goroce.LocalWrite); err != nil {
		return fail(err)
	}
	buf := c.mr.Bytes()
	for i := range buf {
		buf[i] = pingpongFill
	}
	if c.cq, err = c.dev.CreateCQ(o.rxDepth + 1); err != nil {
		return fail(err)
	}
	c.qp, err = c.pd.CreateQP(goroce.QPInit{Type: o.qpType, SendCQ: c.cq, RecvCQ: c.cq,
		MaxSendWR: 1, MaxRecvWR: o.rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return fail(err)
	}
	return c, nil
}

func (c *pingpongCtx) postRecv(n int) int {
	sge := c.mr.SGE(0, c.size)
	if c.ud {
		sge = c.mr.SGE(0, c.size+pingpongGRH)
	}
	for i := 0; i < n; i++ {
		if c.qp.PostRecv(&goroce.RecvWR{WRID: pingpongRecvWRID, SGL: []goroce.SGE{sge}}) != nil {
			return i
		}
	}
	return n
}

func (c *pingpongCtx) postSend() error {
	if c.ud {
		return c.qp.PostSend(&goroce.SendWR{WRID: pingpongSendWRID, Opcode: goroce.WRSend, Flags: goroce.Signaled,
			SGL: []goroce.SGE{c.mr.SGE(pingpongGRH, c.size)}, AH: c.ah, RemoteQPN: c.peer, RemoteQKey: pingpongUDQKey})
	}
	return c.qp.PostSend(&goroce.SendWR{WRID: pingpongSendWRID, Opcode: goroce.WRSend, Flags: goroce.Signaled,
		SGL: []goroce.SGE{c.mr.SGE(0, c.size)}})
}

func (c *pingpongCtx) local() pingpongDest {
	i := c.qp.Info()
	return pingpongDest{qpn: i.QPN, psn: i.PSN, gid: i.GID}
}

// pingpong runs rc_pingpong's algorithm: both sides keep rx_depth receives posted; the client sends
// first; each side sends its next message once its previous send and a receive have completed; an
// iteration is one completed receive and one completed send.
func pingpong(ctx context.Context, w, ew io.Writer, o pingpongOptions) error {
	var local netip.Addr
	if o.addr != "" {
		a, err := netip.ParseAddr(o.addr)
		if err != nil {
			return fmt.Errorf("-a: %v", err)
		}
		local = a.Unmap()
	}
	pageSize := os.Getpagesize()
	var c *pingpongCtx
	defer func() {
		if c != nil {
			c.dev.Close()
		}
	}()
	setup := func(addr netip.Addr) error {
		var err error
		if c, err = newPingpongCtx(addr, o); err != nil {
			return err
		}
		if o.host != "" && o.chk && !c.ud {
			buf := c.mr.Bytes()
			for i := 0; i < len(buf); i += pageSize {
				buf[i] = 0 // rc_pingpong writes i / page_size % sizeof(char): always 0
			}
		}
		if c.ud {
			fmt.Fprintln(w, c.local().udLocalLine())
		} else {
			fmt.Fprintln(w, c.local().line("local address: "))
		}
		return nil
	}
	// The server listens before it prints its address, so that a client started after that line
	// connects.
	var ln net.Listener
	if o.host == "" {
		var lc net.ListenConfig
		var err error
		if ln, err = lc.Listen(ctx, "tcp", ":"+strconv.Itoa(o.port)); err != nil {
			return fmt.Errorf("couldn't listen to port %d: %v", o.port, err)
		}
		defer ln.Close()
	}
	if local.IsValid() {
		if err := setup(local); err != nil {
			return err
		}
	}

	var conn net.Conn
	if o.host != "" {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
		if err != nil {
			return fmt.Errorf("couldn't connect to %s:%d: %v", o.host, o.port, err)
		}
	} else {
		var err error
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
	tcpLocal := conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	tcpPeer := conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	if c == nil {
		if err := setup(tcpLocal); err != nil {
			return err
		}
	}
	msg := make([]byte, pingpongMsgLen)
	var rem pingpongDest
	connect := func() error {
		var err error
		if rem, err = parsePingpongDest(msg); err != nil {
			return err
		}
		peer := goroce.RemoteInfo{QPN: rem.qpn, PSN: rem.psn, GID: rem.gid}
		if rem.gid == (goroce.GID{}) {
			// The peer ran without -g, so it sent no GID; RoCE needs one: take the TCP peer's address.
			peer.GID = goroce.GIDFromAddr(tcpPeer)
		}
		mtu, _ := wire.MTUFromBytes(o.mtu)
		opts := goroce.DefaultConnectOptions()
		// ibv_rc_pingpong's attributes: rnr_retry 7 (forever), max_rd_atomic 1.
		opts.MTU, opts.RdAtomic, opts.QKey, opts.RNRRetry = mtu, 1, pingpongUDQKey, 7
		if err := c.qp.Connect(peer, &opts); err != nil {
			return fmt.Errorf("failed to modify QP to RTS: %v", err)
		}
		if c.ud {
			c.ah, c.peer = goroce.AH(peer.GID.Addr()), rem.qpn
		}
		if n := c.postRecv(o.rxDepth); n < o.rxDepth {
			return fmt.Errorf("couldn't post receive (%d)", n)
		}
		return nil
	}
	if o.host != "" {
		if _, err := conn.Write(c.local().encode()); err != nil {
			return fmt.Errorf("couldn't send local address: %v", err)
		}
		if _, err := io.ReadFull(conn, msg); err != nil {
			return fmt.Errorf("couldn't read remote address: %v", err)
		}
		if err := connect(); err != nil {
			return err
		}
		if _, err := conn.Write([]byte(pingpongDone)); err != nil {
			return fmt.Errorf("couldn't write done: %v", err)
		}
	} else {
		if _, err := io.ReadFull(conn, msg); err != nil {
			return fmt.Errorf("couldn't read remote address: %v", err)
		}
		if err := connect(); err != nil {
			return fmt.Errorf("couldn't connect to remote QP: %v", err)
		}
		if _, err := conn.Write(c.local().encode()); err != nil {
			return fmt.Errorf("couldn't send local address: %v", err)
		}
		done := make([]byte, len(pingpongDone))
		if _, err := io.ReadFull(conn, done); err != nil {
			return fmt.Errorf("couldn't read done: %v", err)
		}
	}
	conn.Close()
	fmt.Fprintln(w, rem.line("remote address:"))

	pending := pingpongRecvWRID
	if o.host != "" {
		if err := c.postSend(); err != nil {
			return fmt.Errorf("couldn't post send: %v", err)
		}
		pending |= pingpongSendWRID
	}
	start := time.Now()
	routs := o.rxDepth
	rcnt, scnt := 0, 0
	wc := make([]goroce.Completion, 2)
	for rcnt < o.iters || scnt < o.iters {
		n, err := c.cq.Wait(ctx, wc)
		if err != nil {
			return fmt.Errorf("poll CQ failed: %v (%d sends, %d receives completed)", err, scnt, rcnt)
		}
		for _, e := range wc[:n] {
			if e.Status != goroce.StatusSuccess {
				return fmt.Errorf("failed status %v (%d) for wr_id %d", e.Status, int(e.Status), e.WRID)
			}
			switch e.WRID {
			case pingpongSendWRID:
				scnt++
			case pingpongRecvWRID:
				if routs--; routs <= 1 {
					routs += c.postRecv(o.rxDepth - routs)
					if routs < o.rxDepth {
						return fmt.Errorf("couldn't post receive (%d)", routs)
					}
				}
				rcnt++
			default:
				return fmt.Errorf("completion for unknown wr_id %d", e.WRID)
			}
			pending &^= int(e.WRID)
			if scnt < o.iters && pending == 0 {
				if err := c.postSend(); err != nil {
					return fmt.Errorf("couldn't post send: %v", err)
				}
				pending = pingpongRecvWRID | pingpongSendWRID
			}
		}
	}
	elapsed := time.Since(start)
	usec := float64(elapsed.Nanoseconds()) / 1e3
	bytes := int64(o.size) * int64(o.iters) * 2
	fmt.Fprintf(w, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, usec/1e6, float64(bytes)*8/usec)
	fmt.Fprintf(w, "%d iters in %.2f seconds = %.2f usec/iter\n", o.iters, usec/1e6, usec/float64(o.iters))
	var bad error
	if o.chk && !c.ud {
		// Both sides send from and receive into one buffer, so after the run each holds the client's
		// pattern: the fill byte everywhere but a 0 at the start of each page. rc_pingpong checks the
		// first byte of each page on the server; goroce checks every byte, on both sides.
		buf := c.mr.Bytes()
		for p := 0; p < len(buf); p += pageSize {
			for i := p; i < min(p+pageSize, len(buf)); i++ {
				want := byte(pingpongFill)
				if i == p {
					want = 0
				}
				if buf[i] != want {
					fmt.Fprintf(w, "invalid data in page %d\n", p/pageSize)
					bad = errors.New("received data differs from the sent pattern")
					break
				}
			}
		}
	}
	if o.qpType == goroce.RC {
		time.Sleep(pingpongLinger)
	}
	// Closing the device (deferred above) first sends the ACK of the peer's last message, which the
	// device may still be holding back for company (Config.AckDelay).
	return bad
}
