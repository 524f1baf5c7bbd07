package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/goroce/goroce"
)

// perftest's rdma_cm mode (-R, which implies -z), as perftest 6.06 runs it (perftest_communication.c):
//
//   - The exchange runs over a QP of its own that rdma_cm connects on the test's port (an RDMA_PS_TCP
//     service): rdma_server_connect and rdma_client_connect, no private data, one receive of
//     sizeof(struct pingpong_dest) posted before the connection. Every ctx_xchg_data is one SEND of
//     exactly the step's bytes (the same versions, system data, MTU and reports as over TCP); the
//     receiver copies the step's size out of its buffer and posts the receive again.
//   - Key messages are struct pingpong_dest itself, its fields big-endian (rdma_write_keys), not the
//     text of the TCP exchange: DestBinaryLen bytes.
//   - create_rdma_cm_connection: a barrier (a key message of zeros), then one rdma_cm connection per
//     test QP on the same port (the client retries while the server is not listening yet: 10 times,
//     100 ms apart), then a barrier again. The QPs' keys follow as over TCP; the CM connected them,
//     so nothing else moves them to RTS.
//   - ctx_close_connection is its barrier only (no "done"); then the server disconnects every test
//     connection (rdma_cm_disconnect_nodes) and the client waits for those DREQs.

// DestBinaryLen is the size of a key message in rdma_cm mode: struct pingpong_dest (lid, out_reads,
// qpn, psn, rkey as 32-bit integers, 4 bytes of padding, the 64-bit vaddr, the GID, srqn and
// gid_index).
const DestBinaryLen = 56

// destBinaryMin is the least of a peer's key message that carries every field goroce reads.
const destBinaryMin = 48

// AppendBinary appends d's rdma_cm key message, DestBinaryLen bytes, to b.
func (d Dest) AppendBinary(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(d.LID))
	b = binary.BigEndian.AppendUint32(b, uint32(d.OutReads))
	b = binary.BigEndian.AppendUint32(b, uint32(d.QPN))
	b = binary.BigEndian.AppendUint32(b, uint32(d.PSN))
	b = binary.BigEndian.AppendUint32(b, uint32(d.RKey))
	b = append(b, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint64(b, d.VAddr)
	b = append(b, d.GID[:]...)
	b = binary.BigEndian.AppendUint32(b, d.SRQN)
	return append(b, 0, 0, 0, 0)
}

// ParseDestBinary reads an rdma_cm key message (rdma_read_keys); one shorter than its fields up to
// the GID is an error that matches ErrBadKey.
func ParseDestBinary(b []byte) (Dest, error) {
	var d Dest
	if len(b) < destBinaryMin {
		return d, fmt.Errorf("%w: %d bytes, where struct pingpong_dest takes %d", ErrBadKey, len(b), DestBinaryLen)
	}
	u := func(off int) uint32 { return binary.BigEndian.Uint32(b[off:]) }
	d.LID = uint16(u(0))
	d.OutReads = int(int32(u(4)))
	d.QPN = goroce.QPN(u(8) & 0xffffff)
	d.PSN = goroce.PSN(u(12) & 0xffffff)
	d.RKey = goroce.RKey(u(16))
	d.VAddr = binary.BigEndian.Uint64(b[24:])
	copy(d.GID[:], b[32:48])
	if len(b) >= 52 {
		d.SRQN = u(48)
	}
	return d, nil
}

// Channel sizes: perftest posts one receive at a time and sends one message at a time; goroce keeps
// a few receives posted so that a step's message never waits for one.
const (
	chanRecvs  = 4
	chanBufLen = 4096
	// chanRetries and chanRetryWait are perftest's for a connection the server refuses while it is
	// not listening yet (rdma_cm_client_connection).
	chanRetries   = 10
	chanRetryWait = 100 * time.Millisecond
	// disconnectWait bounds a client's wait for the server's DREQs at the end.
	disconnectWait = 5 * time.Second
)

// cmChannel is perftest's exchange over an rdma_cm connection: a net.Conn whose every Write is one
// SEND and every Read one received message (what does not fit in the Read is dropped, as perftest
// copies the step's size out of its buffer). Its addresses are the rdma_cm ones, as *net.TCPAddr
// (RDMA_PS_TCP ports). It owns the device; the run's QPs use it too.
type cmChannel struct {
	dev    *goroce.Device
	conn   *goroce.Conn
	ln     *goroce.Listener // the server's, kept for the test QPs' connections
	qp     *goroce.QP
	sendCQ *goroce.CQ
	recvCQ *goroce.CQ
	sbuf   *goroce.MR
	rbuf   *goroce.MR

	mu       sync.Mutex
	deadline time.Time
	closed   bool
	eof      bool
}

// newChannel makes the exchange's QP in INIT with its receives posted, before the CM connects it.
func newChannel(dev *goroce.Device) (*cmChannel, error) {
	ch := &cmChannel{dev: dev}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	if ch.sendCQ, err = dev.CreateCQ(4); err != nil {
		return nil, err
	}
	if ch.recvCQ, err = dev.CreateCQ(chanRecvs + 4); err != nil {
		return nil, err
	}
	if ch.qp, err = pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: ch.sendCQ, RecvCQ: ch.recvCQ, MaxSendWR: 4,
		MaxRecvWR: chanRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}); err != nil {
		return nil, err
	}
	if err := ch.qp.Init(); err != nil {
		return nil, err
	}
	if ch.sbuf, err = pd.AllocMR(chanBufLen, goroce.LocalWrite); err != nil {
		return nil, err
	}
	if ch.rbuf, err = pd.AllocMR(chanRecvs*chanBufLen, goroce.LocalWrite); err != nil {
		return nil, err
	}
	for i := range chanRecvs {
		if err := ch.post(i); err != nil {
			return nil, err
		}
	}
	return ch, nil
}

// post posts receive i of the channel's buffer.
func (ch *cmChannel) post(i int) error {
	return ch.qp.PostRecv(&goroce.RecvWR{WRID: uint64(i), SGL: []goroce.SGE{ch.rbuf.SGE(i*chanBufLen, chanBufLen)}})
}

// options are the channel's connection's: rdma_conn_param with no READs either way, 7 retries, RNR
// retries forever.
func (ch *cmChannel) options() *goroce.CMOptions {
	o := goroce.DefaultCMOptions()
	o.QP = ch.qp
	o.ResponderResources, o.InitiatorDepth = 0, 0
	return &o
}

// dialCM dials address with opts, retrying as perftest does while the server refuses.
func dialCM(ctx context.Context, dev *goroce.Device, address string, opts *goroce.CMOptions) (*goroce.Conn, error) {
	var err error
	for range chanRetries {
		var c *goroce.Conn
		if c, err = dev.Dial(ctx, address, opts); err == nil {
			return c, nil
		}
		if !errors.Is(err, goroce.ErrConnRefused) {
			return nil, err
		}
		if opts.QP != nil {
			// A refused attempt leaves the QP in ERR; the next one needs it in RESET.
			if e := opts.QP.Modify(&goroce.Attr{State: goroce.StateReset}, goroce.AttrState); e != nil {
				return nil, e
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(chanRetryWait):
		}
	}
	return nil, fmt.Errorf("failed to connect RDMA CM client, tried %d times: %w", chanRetries, err)
}

// listenCM opens a device on addr and listens on port, for a server in rdma_cm mode.
func listenCM(addr netip.AddrPort, o Options) (*goroce.Device, *goroce.Listener, error) {
	if !addr.Addr().IsValid() || addr.Addr().IsUnspecified() {
		if !o.Addr.IsValid() {
			return nil, nil, fmt.Errorf("%w: rdma_cm needs the device's address (-addr, or the host of the address to listen on)", ErrBadOptions)
		}
		addr = netip.AddrPortFrom(o.Addr, addr.Port())
	}
	dev, err := goroce.Open(goroce.Config{Addr: addr.Addr().Unmap(), Port: goroce.DefaultPort, Network: o.Network, Tracer: o.Tracer})
	if err != nil {
		return nil, nil, err
	}
	ln, err := dev.Listen(addr.Port(), nil)
	if err != nil {
		dev.Close()
		return nil, nil, fmt.Errorf("rdma_listen failed: %w", err)
	}
	return dev, ln, nil
}

// acceptChannel takes the first connection request on ln: the exchange's.
func acceptChannel(ctx context.Context, dev *goroce.Device, ln *goroce.Listener) (*cmChannel, error) {
	req, err := ln.Request(ctx)
	if err != nil {
		return nil, fmt.Errorf("bad event waiting for connect request: %w", err)
	}
	ch, err := newChannel(dev)
	if err != nil {
		_ = req.Reject(nil)
		return nil, err
	}
	if ch.conn, err = req.Accept(ctx, ch.options()); err != nil {
		return nil, fmt.Errorf("rdma_accept failed: %w", err)
	}
	ch.ln = ln
	return ch, nil
}

// dialChannel opens a device and connects the exchange's QP to the server at address (host:port).
func dialChannel(ctx context.Context, address string, o Options) (*cmChannel, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadOptions, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil, fmt.Errorf("%w: port %q", ErrBadOptions, port)
	}
	local := o.Addr
	if !local.IsValid() {
		local = o.SourceIP
	}
	if !local.IsValid() {
		// The address the routing table would send from; a UDP "connection" sends nothing.
		u, err := net.Dial("udp4", net.JoinHostPort(host, port))
		if err != nil {
			return nil, fmt.Errorf("no local address towards %s: %w", host, err)
		}
		local = addrOfUDP(u.LocalAddr())
		u.Close()
	}
	dev, err := goroce.Open(goroce.Config{Addr: local.Unmap(), Port: goroce.DefaultPort, Network: o.Network, Tracer: o.Tracer})
	if err != nil {
		return nil, err
	}
	ch, err := newChannel(dev)
	if err == nil {
		ch.conn, err = dialCM(ctx, dev, address, ch.options())
	}
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("unable to perform rdma_client function: %w", err)
	}
	return ch, nil
}

func addrOfUDP(a net.Addr) netip.Addr {
	if u, ok := a.(*net.UDPAddr); ok {
		return u.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// Write sends b as one SEND and waits for its completion.
func (ch *cmChannel) Write(b []byte) (int, error) {
	if len(b) > chanBufLen {
		return 0, fmt.Errorf("a message of %d bytes: the channel takes %d", len(b), chanBufLen)
	}
	copy(ch.sbuf.Bytes(), b)
	if err := ch.qp.PostSend(&goroce.SendWR{WRID: 1, Opcode: goroce.WRSend, Flags: goroce.Signaled,
		SGL: []goroce.SGE{ch.sbuf.SGE(0, len(b))}}); err != nil {
		return 0, fmt.Errorf("ibv_post_send failed: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), promptLimit)
	defer cancel()
	var wc [1]goroce.Completion
	if _, err := ch.sendCQ.Wait(ctx, wc[:]); err != nil {
		return 0, fmt.Errorf("waiting for the SEND's completion: %w", err)
	}
	if err := wc[0].Err(); err != nil {
		select {
		case <-ch.conn.Done():
			// The peer took the message and disconnected before its ACK came: perftest's last
			// barrier, after which the peer is free to exit.
			if errors.Is(err, goroce.ErrFlushed) && errors.Is(ch.conn.Err(), goroce.ErrDisconnected) {
				return len(b), nil
			}
		default:
		}
		return 0, fmt.Errorf("bad wc status: %w", err)
	}
	return len(b), nil
}

// Read returns the next message the peer sent, as much of it as b takes; it fails with
// os.ErrDeadlineExceeded at the read deadline, and with io.EOF once the connection has ended.
func (ch *cmChannel) Read(b []byte) (int, error) {
	ch.mu.Lock()
	dl, eof := ch.deadline, ch.eof
	ch.mu.Unlock()
	if eof {
		return 0, io.EOF
	}
	ctx, cancel := context.WithCancel(context.Background())
	if !dl.IsZero() {
		ctx, cancel = context.WithDeadline(context.Background(), dl)
	}
	defer cancel()
	go func() {
		select {
		case <-ch.conn.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	var wc [1]goroce.Completion
	if _, err := ch.recvCQ.Wait(ctx, wc[:]); err != nil {
		select {
		case <-ch.conn.Done():
			ch.mu.Lock()
			ch.eof = true
			ch.mu.Unlock()
			return 0, io.EOF
		default:
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, os.ErrDeadlineExceeded
		}
		return 0, err
	}
	if err := wc[0].Err(); err != nil {
		ch.mu.Lock()
		ch.eof = true
		ch.mu.Unlock()
		return 0, io.EOF
	}
	i := int(wc[0].WRID)
	if i < 0 || i >= chanRecvs {
		return 0, fmt.Errorf("a receive completion of an unknown work request %d", wc[0].WRID)
	}
	n := copy(b, ch.rbuf.Bytes()[i*chanBufLen:i*chanBufLen+min(int(wc[0].ByteLen), chanBufLen)])
	if err := ch.post(i); err != nil {
		return n, err
	}
	return n, nil
}

// Close disconnects the exchange's connection; the device stays the run's.
func (ch *cmChannel) Close() error {
	ch.mu.Lock()
	closed := ch.closed
	ch.closed = true
	ch.mu.Unlock()
	if !closed && ch.conn != nil {
		ch.conn.Close()
	}
	return nil
}

func tcpAddr(a netip.AddrPort) net.Addr { return net.TCPAddrFromAddrPort(a) }

// LocalAddr returns this side's address and rdma_cm port.
func (ch *cmChannel) LocalAddr() net.Addr { return tcpAddr(ch.conn.LocalAddr()) }

// RemoteAddr returns the peer's address and rdma_cm port.
func (ch *cmChannel) RemoteAddr() net.Addr { return tcpAddr(ch.conn.RemoteAddr()) }

// SetDeadline sets the read deadline; writes wait for their completion only.
func (ch *cmChannel) SetDeadline(t time.Time) error { return ch.SetReadDeadline(t) }

// SetReadDeadline sets the time a Read waiting for a message gives up.
func (ch *cmChannel) SetReadDeadline(t time.Time) error {
	ch.mu.Lock()
	ch.deadline = t
	ch.mu.Unlock()
	return nil
}

// SetWriteDeadline is accepted and unused.
func (ch *cmChannel) SetWriteDeadline(time.Time) error { return nil }

// cmConnect is create_rdma_cm_connection: a barrier, one rdma_cm connection per QP, a barrier.
func (e *exchange) cmConnect(ch *cmChannel) error {
	var zero Dest
	if _, err := e.handshake(zero, "synchronizing before the rdma_cm connections", true); err != nil {
		return err
	}
	p := e.p
	_, qpAccess := access(p.sh.verb)
	for i, q := range p.qps {
		o := goroce.DefaultCMOptions()
		o.QP, o.Access, o.MTU, o.Timeout = q, qpAccess, e.hello.MTU, p.o.Timeout
		o.ResponderResources, o.InitiatorDepth = 0, 0
		if p.sh.verb == Read || p.sh.verb == Atomic {
			o.ResponderResources, o.InitiatorDepth = uint8(p.local[i].OutReads), uint8(p.local[i].OutReads)
		}
		var c *goroce.Conn
		var err error
		if e.client {
			c, err = dialCM(e.ctx, p.dev, ch.RemoteAddr().String(), &o)
		} else {
			var req *goroce.ConnRequest
			if req, err = ch.ln.Request(e.ctx); err == nil {
				o.ResponderResources = min(o.ResponderResources, req.InitiatorDepth())
				o.InitiatorDepth = min(o.InitiatorDepth, req.ResponderResources())
				c, err = req.Accept(e.ctx, &o)
			}
		}
		if err != nil {
			return fmt.Errorf("failed to create RDMA CM connection of QP %d: %w", i, err)
		}
		p.cmConns = append(p.cmConns, c)
	}
	if !e.client {
		ch.ln.Close()
	}
	_, err := e.handshake(zero, "synchronizing after the rdma_cm connections", true)
	return err
}

// cmDisconnect is rdma_cm_disconnect_nodes: the server disconnects every test connection, the client
// waits for the server's DREQs (a while), then closes its side.
func (p *peer) cmDisconnect() {
	if !p.client {
		for _, c := range p.cmConns {
			c.Close()
		}
		return
	}
	t := time.NewTimer(disconnectWait)
	defer t.Stop()
	for _, c := range p.cmConns {
		select {
		case <-c.Done():
		case <-t.C:
		}
		c.Close()
	}
}
