// Package rping is a goroce peer for rdma-core's rping (librdmacm/examples/rping.c): the connection
// set up through the RDMA CM (goroce's Dial and Listen), the same buffer advertisements, RDMA READs
// and RDMA WRITEs, and the same output, so that either side of a run may be goroce or the C tool.
//
// Each iteration ("ping") of rping goes:
//
//	client: SEND its source buffer's address, rkey and length (16 bytes, big-endian)
//	server: RDMA READ the source buffer; SEND a "go ahead"
//	client: SEND its sink buffer's address, rkey and length
//	server: RDMA WRITE what it read into the sink; SEND a "go ahead"
//	client: with -V, compare the sink with the source
//
// The client fills its source with rping's text ("rdma-ping-N: " then letters that rotate from one
// ping to the next, NUL-terminated), runs Count pings (0: until stopped) and disconnects; the server
// serves until the client disconnects. A program runs either side on a goroce device:
//
//	srv, err := rping.Listen(dev, rping.DefaultPort, rping.DefaultOptions())
//	res, err := srv.Serve(ctx, os.Stdout, os.Stderr)
//
//	res, err := rping.Connect(ctx, dev, "10.0.0.2:7174", rping.DefaultOptions(), os.Stdout, os.Stderr)
//
// The device must receive on goroce.DefaultPort to meet rping on rxe or a RoCE NIC.
package rping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"time"

	"github.com/goroce/goroce"
)

// DefaultPort is the rdma_cm port rping listens on and connects to unless -p says otherwise.
const DefaultPort = 7174

// Sizes rping takes for -S: room for its longest "rdma-ping-N: " text (sizeof "2147483647" plus
// sizeof "rdma-ping-%d: ", as rping.c's RPING_MIN_BUFSIZE) up to one less than its 64 KiB buffer.
const (
	MinSize = len("2147483647") + 1 + len("rdma-ping-%d: ") + 1
	MaxSize = 64*1024 - 1
)

// DefaultSize is rping's ping data size without -S.
const DefaultSize = 64

// infoLen is the size of rping's buffer advertisement (struct rping_rdma_info): address (8 bytes),
// rkey (4) and length (4), big-endian.
const infoLen = 16

// Queue sizes of rping.c: RPING_SQ_DEPTH sends, two receives, a CQ twice the send queue.
const (
	sqDepth = 16
	rqDepth = 2
	cqDepth = 2 * sqDepth
)

// The first and last letters of rping's rotating fill ('A' and 'z').
const (
	fillFirst = 65
	fillLast  = 122
)

// Work request IDs: the one receive, the advertisement and go-ahead SENDs, the READ and the WRITE.
const (
	recvWRID = iota + 1
	sendWRID
	rdmaWRID
)

// Errors of a run. They match with errors.Is.
var (
	// ErrBadOptions: Options.Validate refused the options.
	ErrBadOptions = errors.New("rping: invalid options")
	// ErrBadData: the sink did not hold the source after a ping (rping -V's "data mismatch!"), or, on
	// a goroce server with Check, what it read was not rping's text for that ping.
	ErrBadData = errors.New("data mismatch")
	// ErrProtocol: the peer did not follow rping's protocol: a message of the wrong size (rping's
	// "Received bogus data"), or a buffer too large for this side's.
	ErrProtocol = errors.New("rping: protocol error")
)

// CompletionError is a work request of the run that failed, as rping reports "cq completion failed
// status N". It unwraps to Completion.Err, so errors.Is(err, goroce.ErrRetryExceeded) and friends match.
type CompletionError struct {
	Completion goroce.Completion
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("cq completion failed status %d (%v)", int(e.Completion.Status), e.Completion.Status)
}

// Unwrap returns the completion's *goroce.WCError.
func (e *CompletionError) Unwrap() error { return e.Completion.Err() }

// Options are a run's parameters, rping's flags. Start from DefaultOptions.
type Options struct {
	// Size is the ping data size in bytes (-S): 64, MinSize to MaxSize.
	Size int
	// Count is the number of pings the client runs (-C); 0 runs until ctx ends. The server, as rping's,
	// serves until the client disconnects.
	Count int
	// Verbose prints each ping's data (-v): "ping data: ..." on the client, "server ping data: ..." on
	// the server.
	Verbose bool
	// Check makes the client compare the sink with the source after each ping (-V, "validate ping
	// data"). goroce's server also checks that each READ brought rping's text for that ping, which
	// rping's does not.
	Check bool
	// Debug prints rping's debug lines (-d), among them "rdma_listen" once a server listens.
	Debug bool
	// Persistent makes a server take any number of connections, each served on its own (-P).
	Persistent bool
}

// DefaultOptions returns rping's defaults: 64-byte pings, forever, quiet.
func DefaultOptions() Options { return Options{Size: DefaultSize} }

// Validate reports options rping refuses, as an error matching ErrBadOptions.
func (o *Options) Validate() error {
	switch {
	case o.Size < MinSize || o.Size > MaxSize:
		return fmt.Errorf("%w: invalid size %d (valid range is %d to %d)", ErrBadOptions, o.Size, MinSize, MaxSize)
	case o.Count < 0:
		return fmt.Errorf("%w: invalid count %d", ErrBadOptions, o.Count)
	}
	return nil
}

// Result is what a run did.
type Result struct {
	// Pings is the number of pings completed: both advertisements answered (the client), or both the
	// READ and the WRITE done (the server, summed over its connections).
	Pings int
	// Conns is the number of connections a server served.
	Conns int
}

// Fill writes rping's text for ping number ping into buf, as rping's client does before advertising
// it: "rdma-ping-N: ", then letters from 'A'+ping%58 on, each one more than the last and back to 'A'
// after 'z', and a NUL in the last byte.
func Fill(buf []byte, ping int) {
	if len(buf) == 0 {
		return
	}
	text := "rdma-ping-" + strconv.Itoa(ping) + ": "
	n := copy(buf[:len(buf)-1], text)
	c := byte(fillFirst + ping%(fillLast-fillFirst+1))
	for i := n; i < len(buf); i++ {
		buf[i] = c
		if c++; c > fillLast {
			c = fillFirst
		}
	}
	buf[len(buf)-1] = 0
}

// cString returns b up to its first NUL, as printf's %s reads a C string; all of b if there is none.
func cString(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// info is rping's buffer advertisement.
type info struct {
	addr uint64
	rkey goroce.RKey
	size uint32
}

func (in info) marshal() []byte {
	b := make([]byte, infoLen)
	binary.BigEndian.PutUint64(b, in.addr)
	binary.BigEndian.PutUint32(b[8:], uint32(in.rkey))
	binary.BigEndian.PutUint32(b[12:], in.size)
	return b
}

func parseInfo(b []byte) info {
	return info{addr: binary.BigEndian.Uint64(b), rkey: goroce.RKey(binary.BigEndian.Uint32(b[8:])),
		size: binary.BigEndian.Uint32(b[12:])}
}

// peer is one side of a connection: its QP and CQ, the receive buffer and rping's RDMA buffers.
type peer struct {
	opts    *Options
	stdout  io.Writer
	pd      *goroce.PD
	cq      *goroce.CQ
	qp      *goroce.QP
	recv    *goroce.MR // the advertisement received
	rdma    *goroce.MR // the sink (client) or the READ's destination and the WRITE's source (server)
	start   *goroce.MR // the client's source
	conn    *goroce.Conn
	pending []goroce.Completion
	wc      [cqDepth]goroce.Completion
}

// newPeer makes a QP in INIT with its buffers and posts its receive, before the CM connects it, as
// rping posts its receive before rdma_accept and rdma_connect.
func newPeer(dev *goroce.Device, o *Options, client bool, stdout io.Writer) (*peer, error) {
	p := &peer{opts: o, stdout: stdout}
	var err error
	if p.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if p.cq, err = dev.CreateCQ(cqDepth); err != nil {
		p.close()
		return nil, err
	}
	p.qp, err = p.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: p.cq, RecvCQ: p.cq, MaxSendWR: sqDepth,
		MaxRecvWR: rqDepth, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err == nil {
		err = p.qp.Init()
	}
	if err == nil {
		p.recv, err = p.pd.AllocMR(infoLen, goroce.LocalWrite)
	}
	remote := goroce.LocalWrite | goroce.RemoteRead | goroce.RemoteWrite
	if err == nil {
		p.rdma, err = p.pd.AllocMR(o.Size, remote)
	}
	if err == nil && client {
		p.start, err = p.pd.AllocMR(o.Size, remote)
	}
	if err == nil {
		err = p.postRecv()
	}
	if err != nil {
		p.close()
		return nil, err
	}
	p.debugf("created qp %d\n", p.qp.QPN())
	return p, nil
}

// options are the connection's attributes, rping_init_conn_param's: one READ in flight each way,
// retry counts of 7 (RNR retries forever), and the QP made here.
func (p *peer) options() *goroce.CMOptions {
	o := goroce.DefaultCMOptions()
	o.QP = p.qp
	o.ResponderResources, o.InitiatorDepth = 1, 1
	o.RetryCount, o.RNRRetryCount = 7, 7
	return &o
}

func (p *peer) close() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	if p.qp != nil {
		_ = p.qp.Close()
	}
	for _, m := range []*goroce.MR{p.recv, p.rdma, p.start} {
		if m != nil {
			_ = m.Close()
		}
	}
	if p.cq != nil {
		_ = p.cq.Close()
	}
	if p.pd != nil {
		_ = p.pd.Close()
	}
}

func (p *peer) debugf(format string, a ...any) {
	if p.opts.Debug && p.stdout != nil {
		fmt.Fprintf(p.stdout, format, a...)
	}
}

func (p *peer) printf(format string, a ...any) {
	if p.stdout != nil {
		fmt.Fprintf(p.stdout, format, a...)
	}
}

func (p *peer) postRecv() error {
	return p.qp.PostRecv(&goroce.RecvWR{WRID: recvWRID, SGL: []goroce.SGE{p.recv.SGE(0, infoLen)}})
}

// send posts a signaled SEND of msg (an advertisement, or the server's go-ahead).
func (p *peer) send(msg []byte) error {
	return p.qp.PostSend(&goroce.SendWR{WRID: sendWRID, Opcode: goroce.WRSend, Flags: goroce.Signaled | goroce.Inline,
		InlineData: msg})
}

// errDisconnected ends a wait when the QP's work is flushed: the connection ended.
var errDisconnected = errors.New("rping: disconnected")

// next waits for the next completion of opcode want, skipping SEND completions (rping only logs
// them). A failed completion is a *CompletionError, but a flushed one means the connection ended
// (errDisconnected), as rping ignores flushes.
func (p *peer) next(ctx context.Context, want goroce.CompletionOpcode) (goroce.Completion, error) {
	for {
		for len(p.pending) > 0 {
			wc := p.pending[0]
			p.pending = p.pending[1:]
			switch {
			case errors.Is(wc.Err(), goroce.ErrFlushed):
				return wc, errDisconnected
			case wc.Status != goroce.StatusSuccess:
				return wc, &CompletionError{Completion: wc}
			case wc.Opcode == want:
				return wc, nil
			case wc.Opcode == goroce.CompSend:
				p.debugf("send completion\n")
			default:
				return wc, fmt.Errorf("%w: unexpected %v completion while waiting for %v", ErrProtocol, wc.Opcode, want)
			}
		}
		n, err := p.cq.Wait(ctx, p.wc[:])
		if err != nil {
			return goroce.Completion{}, err
		}
		p.pending = append(p.pending[:0], p.wc[:n]...)
	}
}

// recvInfo waits for the peer's next message, checks its size and posts the receive again.
func (p *peer) recvInfo(ctx context.Context) (info, error) {
	wc, err := p.next(ctx, goroce.CompRecv)
	if err != nil {
		return info{}, err
	}
	if wc.ByteLen != infoLen {
		return info{}, fmt.Errorf("%w: received bogus data, size %d", ErrProtocol, wc.ByteLen)
	}
	in := parseInfo(p.recv.Bytes())
	if err := p.postRecv(); err != nil {
		return info{}, err
	}
	return in, nil
}

// stopGrace is how long a server whose context has ended still waits for a ping under way to finish
// and for the client's next advertisement, at which it stops.
const stopGrace = 5 * time.Second

// Server takes rping clients on one rdma_cm port.
type Server struct {
	dev  *goroce.Device
	ln   *goroce.Listener
	opts Options
}

// Listen starts an rping server on dev's rdma_cm port (0 picks one; Addr says which).
func Listen(dev *goroce.Device, port uint16, opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	ln, err := dev.Listen(port, nil)
	if err != nil {
		return nil, err
	}
	return &Server{dev: dev, ln: ln, opts: opts}, nil
}

// Addr returns the address and rdma_cm port the server listens on.
func (s *Server) Addr() netip.AddrPort { return s.ln.Addr() }

// Close stops listening.
func (s *Server) Close() error { return s.ln.Close() }

// Serve serves one client until it disconnects, as rping -s does, or, with Options.Persistent, any
// number of clients at once until ctx ends, each failure reported on stderr as rping -P's threads do
// it. The lines rping prints go to stdout (ping data with Verbose, debug lines with Debug) and stderr
// (the disconnection).
func (s *Server) Serve(ctx context.Context, stdout, stderr io.Writer) (Result, error) {
	p := &peer{opts: &s.opts, stdout: stdout}
	p.debugf("rdma_listen\n")
	if !s.opts.Persistent {
		r, err := s.ln.Request(ctx)
		if err != nil {
			return Result{}, err
		}
		n, err := s.serveConn(ctx, r, stdout, stderr)
		return Result{Pings: n, Conns: 1}, err
	}
	type done struct {
		n   int
		err error
	}
	results := make(chan done)
	var res Result
	running := 0
	for {
		r, err := s.ln.Request(ctx)
		if err != nil {
			for ; running > 0; running-- {
				d := <-results
				res.Pings += d.n
			}
			return res, err
		}
		running++
		res.Conns++
		go func() {
			n, err := s.serveConn(ctx, r, stdout, stderr)
			if err != nil && stderr != nil {
				fmt.Fprintf(stderr, "rping server failed: %v\n", err)
			}
			results <- done{n, err}
		}()
		// Collect the connections that ended meanwhile, without waiting.
		for collecting := true; collecting && running > 0; {
			select {
			case d := <-results:
				running--
				res.Pings += d.n
			default:
				collecting = false
			}
		}
	}
}

// serveConn accepts r and runs rping's server loop (rping_test_server) until the client disconnects.
func (s *Server) serveConn(ctx context.Context, r *goroce.ConnRequest, stdout, stderr io.Writer) (int, error) {
	p, err := newPeer(s.dev, &s.opts, false, stdout)
	if err != nil {
		_ = r.Reject(nil)
		return 0, err
	}
	defer p.close()
	o := p.options()
	// rdma_accept without parameters answers with what the REQ offers: as many READs in flight as
	// the client issues, and the client's responder resources as this side's initiator depth.
	o.ResponderResources, o.InitiatorDepth = r.InitiatorDepth(), r.ResponderResources()
	p.debugf("accepting client connection request\n")
	if p.conn, err = r.Accept(ctx, o); err != nil {
		return 0, fmt.Errorf("connect error: %w", err)
	}
	// When ctx ends, the server stops at a ping's boundary: a ping under way finishes (within
	// stopGrace), and the client's next advertisement is taken and left unanswered before the
	// connection closes. The client then waits for nothing but the disconnection, and rping's client
	// ends with status 0 on it; a DREQ that overtook a go-ahead its CQ thread had not yet taken would
	// make it fail ("wait for RDMA_WRITE_ADV state 9").
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(stopGrace, cancel) })
	defer stop()
	pings := 0
	for {
		// The client's source: READ it.
		src, err := p.recvInfo(wctx)
		if errors.Is(err, errDisconnected) {
			break
		}
		if err == nil && ctx.Err() != nil {
			err = ctx.Err()
		}
		if err != nil {
			return pings, err
		}
		p.debugf("Received rkey %x addr %x len %d from peer\n", uint32(src.rkey), src.addr, src.size)
		if int64(src.size) > int64(s.opts.Size) {
			return pings, fmt.Errorf("%w: the client's %d-byte buffer is larger than this side's %d (-S)", ErrProtocol, src.size, s.opts.Size)
		}
		data := p.rdma.Bytes()[:src.size]
		if err := p.qp.PostSend(&goroce.SendWR{WRID: rdmaWRID, Opcode: goroce.WRRDMARead, Flags: goroce.Signaled,
			SGL: []goroce.SGE{p.rdma.SGE(0, int(src.size))}, RemoteAddr: src.addr, RKey: src.rkey}); err != nil {
			return pings, fmt.Errorf("post send error: %w", err)
		}
		p.debugf("server posted rdma read req \n")
		if _, err := p.next(wctx, goroce.CompRDMARead); err != nil {
			return pings, waitError(err, "RDMA_READ_COMPLETE")
		}
		p.debugf("server received read complete\n")
		if s.opts.Verbose {
			p.printf("server ping data: %s\n", cString(data))
		}
		if s.opts.Check {
			want := make([]byte, len(data))
			Fill(want, pings)
			if !bytes.Equal(data, want) {
				return pings, fmt.Errorf("%w: ping %d read %q, want %q", ErrBadData, pings, cString(data), cString(want))
			}
		}
		if err := p.send(make([]byte, infoLen)); err != nil {
			return pings, fmt.Errorf("post send error: %w", err)
		}
		p.debugf("server posted go ahead\n")

		// The client's sink: WRITE what was read, up to and with its NUL.
		sink, err := p.recvInfo(wctx)
		if err != nil {
			return pings, waitError(err, "RDMA_WRITE_ADV")
		}
		p.debugf("Received rkey %x addr %x len %d from peer\n", uint32(sink.rkey), sink.addr, sink.size)
		n := min(len(cString(data))+1, len(data))
		if n > int(sink.size) {
			return pings, fmt.Errorf("%w: %d bytes to write to the client's %d-byte sink", ErrProtocol, n, sink.size)
		}
		p.debugf("rdma write from lkey %x laddr %x len %d\n", uint32(p.rdma.LKey()), p.rdma.Addr(), n)
		if err := p.qp.PostSend(&goroce.SendWR{WRID: rdmaWRID, Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
			SGL: []goroce.SGE{p.rdma.SGE(0, n)}, RemoteAddr: sink.addr, RKey: sink.rkey}); err != nil {
			return pings, fmt.Errorf("post send error: %w", err)
		}
		if _, err := p.next(wctx, goroce.CompRDMAWrite); err != nil {
			return pings, waitError(err, "RDMA_WRITE_COMPLETE")
		}
		p.debugf("server rdma write complete \n")
		pings++
		if err := p.send(make([]byte, infoLen)); err != nil {
			return pings, fmt.Errorf("post send error: %w", err)
		}
		p.debugf("server posted go ahead\n")
	}
	// The receive was flushed or failed: the client disconnected, as rping expects at the end.
	if err := p.disconnected(ctx, "server", stderr); err != nil {
		return pings, err
	}
	return pings, nil
}

// disconnected checks that a flushed receive means the peer's DREQ and prints rping's notice.
func (p *peer) disconnected(ctx context.Context, who string, stderr io.Writer) error {
	select {
	case <-p.conn.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	if !errors.Is(p.conn.Err(), goroce.ErrDisconnected) {
		return p.conn.Err()
	}
	if stderr != nil {
		fmt.Fprintf(stderr, "%s DISCONNECT EVENT...\n", who)
	}
	return nil
}

// Connect runs rping's client against the server at address ("host:port", the rdma_cm port): Count
// pings (0: until ctx ends, which then ends the run without error), then it disconnects. With
// Check, a ping whose sink differs from its source ends the run with ErrBadData.
func Connect(ctx context.Context, dev *goroce.Device, address string, opts Options, stdout, stderr io.Writer) (Result, error) {
	var res Result
	if err := opts.Validate(); err != nil {
		return res, err
	}
	p, err := newPeer(dev, &opts, true, stdout)
	if err != nil {
		return res, err
	}
	defer p.close()
	if p.conn, err = dev.Dial(ctx, address, p.options()); err != nil {
		return res, fmt.Errorf("connect error: %w", err)
	}
	p.debugf("rdma_connect successful\n")
	for ping := 0; opts.Count == 0 || ping < opts.Count; ping++ {
		err := p.ping(ctx, ping)
		switch {
		case err != nil && opts.Count == 0 && ctx.Err() != nil:
			return res, nil // stopped, as rping is with ^C
		case errors.Is(err, errDisconnected):
			if derr := p.disconnected(ctx, "client", stderr); derr != nil {
				return res, derr
			}
			return res, nil // rping's client ends without error when the server disconnects
		case err != nil:
			return res, err
		}
		res.Pings++
	}
	return res, nil
}

// ping runs one ping of rping_test_client.
func (p *peer) ping(ctx context.Context, ping int) error {
	src, sink := p.start.Bytes(), p.rdma.Bytes()
	Fill(src, ping)
	// The sink is cleared so that -V sees this ping's WRITE, not the last one's.
	clear(sink)
	adv := info{addr: p.start.Addr(), rkey: p.start.RKey(), size: uint32(len(src))}
	p.debugf("RDMA addr %x rkey %x len %d\n", adv.addr, uint32(adv.rkey), adv.size)
	if err := p.send(adv.marshal()); err != nil {
		return fmt.Errorf("post send error: %w", err)
	}
	if _, err := p.recvInfo(ctx); err != nil {
		return waitError(err, "RDMA_WRITE_ADV")
	}
	adv = info{addr: p.rdma.Addr(), rkey: p.rdma.RKey(), size: uint32(len(sink))}
	p.debugf("RDMA addr %x rkey %x len %d\n", adv.addr, uint32(adv.rkey), adv.size)
	if err := p.send(adv.marshal()); err != nil {
		return fmt.Errorf("post send error: %w", err)
	}
	if _, err := p.recvInfo(ctx); err != nil {
		return waitError(err, "RDMA_WRITE_COMPLETE")
	}
	if p.opts.Check && !bytes.Equal(src, sink) {
		return fmt.Errorf("%w (ping %d: %s)", ErrBadData, ping, describeMismatch(src, sink))
	}
	if p.opts.Verbose {
		p.printf("ping data: %s\n", cString(sink))
	}
	return nil
}

// describeMismatch says where sink first differs from src and shows both there, 32 bytes from a little
// before that offset, and what the sink holds overall: a whole buffer quoted would hide the difference.
func describeMismatch(src, sink []byte) string {
	i := 0
	for i < len(src) && i < len(sink) && src[i] == sink[i] {
		i++
	}
	from := max(i-8, 0)
	window := func(b []byte) []byte { return b[min(from, len(b)):min(from+32, len(b))] }
	rest := sink[i:]
	zeros := len(rest) - len(bytes.TrimLeft(rest, "\x00"))
	return fmt.Sprintf("sink differs from source at byte %d of %d (%d zero bytes from there): sent %q, got back %q at byte %d; sink starts %q",
		i, len(src), zeros, window(src), window(sink), from, sink[:min(24, len(sink))])
}

// waitError names the state rping waited for when err ended the wait, keeping err matchable
// (errDisconnected: the peer disconnected in the middle of a ping); a context's error stays as it is.
func waitError(err error, state string) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("wait for %s state: %w", state, err)
}
