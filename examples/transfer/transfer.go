package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/goroce/goroce"
)

// The out-of-band exchange, over the TCP connection, big-endian:
//
//	client → server  hello: magic "GRTX" (4), client Endpoint (goroce.EndpointLen), size (8)
//	server → client  ready: server Endpoint (goroce.EndpointLen), region address (8), rkey (4)
//	server → client  done:  status (1: 0 ok, 1 checksum mismatch), the server's CRC-32C (4)
//
// The server connects its QP before it sends ready, and the client connects on receiving it, so that no
// packet reaches a QP that is not yet connected (goroce drops those, and the sender waits an ACK
// timeout to recover).
const (
	magic    = "GRTX"
	helloLen = len(magic) + goroce.EndpointLen + 8
	readyLen = goroce.EndpointLen + 8 + 4
	doneLen  = 1 + 4
)

// Done statuses.
const (
	statusOK       = 0
	statusMismatch = 1
)

// MaxSize bounds the transfers a server accepts: it allocates the whole region at once.
const MaxSize = 16 << 30

// Defaults of Options.
const (
	DefaultChunk = 1 << 20
	DefaultDepth = 16
)

// ErrChecksum is the error of a transfer whose data arrived with another CRC-32C than it left with.
var ErrChecksum = errors.New("transfer: checksum mismatch")

// ErrClientGone is the error of a server whose client closed the connection before its data arrived.
var ErrClientGone = errors.New("transfer: client gone")

// castagnoli is the CRC-32C table: the checksum, carried in the immediate of the last WRITE.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Options shape a transfer. Zero fields take the defaults.
type Options struct {
	// Size is how many bytes the client sends, if Data is nil.
	Size int
	// Data is what the client sends; nil sends Size pseudo-random bytes.
	Data []byte
	// Chunk is the length of each RDMA WRITE: DefaultChunk unless set.
	Chunk int
	// Depth is how many WRITEs the client keeps in flight: DefaultDepth unless set.
	Depth int
	// Network is where the devices' packets travel: the host's UDP sockets unless set.
	Network goroce.Network
	// Connect is the QP options: goroce.DefaultConnectOptions unless set.
	Connect *goroce.ConnectOptions
}

func (o *Options) defaults() {
	if o.Chunk <= 0 {
		o.Chunk = DefaultChunk
	}
	if o.Depth <= 0 {
		o.Depth = DefaultDepth
	}
}

// Result is what one side of a transfer saw.
type Result struct {
	Bytes    int           // bytes moved
	Elapsed  time.Duration // client: first WRITE posted to last acknowledged; server: ready sent to data in
	Checksum uint32        // CRC-32C of the data
	Data     []byte        // the data sent or received
}

// Gbps returns the throughput in gigabits per second.
func (r Result) Gbps() float64 { return float64(r.Bytes) * 8 / r.Elapsed.Seconds() / 1e9 }

func (r Result) String() string {
	return fmt.Sprintf("%d bytes in %v: %.2f Gbit/s, %.0f MiB/s, CRC-32C %08x",
		r.Bytes, r.Elapsed.Round(time.Microsecond), r.Gbps(), float64(r.Bytes)/r.Elapsed.Seconds()/(1<<20), r.Checksum)
}

// rdma is one side's goroce objects, closed newest first.
type rdma struct {
	dev    *goroce.Device
	pd     *goroce.PD
	cq     *goroce.CQ
	qp     *goroce.QP
	opened []io.Closer
}

// open opens a device on addr with an ephemeral UDP port (the peer learns it from the Endpoint), and
// a protection domain, a CQ of n entries and an RC QP of n send work requests.
func open(addr netip.Addr, n int, network goroce.Network) (*rdma, error) {
	r := &rdma{}
	var err error
	if r.dev, err = goroce.Open(goroce.Config{Addr: addr, Network: network}); err != nil {
		return nil, err
	}
	r.opened = append(r.opened, r.dev)
	if r.pd, err = r.dev.AllocPD(); err != nil {
		return nil, r.fail(err)
	}
	r.opened = append(r.opened, r.pd)
	if r.cq, err = r.dev.CreateCQ(n); err != nil {
		return nil, r.fail(err)
	}
	r.opened = append(r.opened, r.cq)
	if r.qp, err = r.pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: r.cq, RecvCQ: r.cq, MaxSendWR: n}); err != nil {
		return nil, r.fail(err)
	}
	r.opened = append(r.opened, r.qp)
	return r, nil
}

// region allocates and registers n bytes.
func (r *rdma) region(n int, access goroce.Access) (*goroce.MR, error) {
	m, err := r.pd.AllocMR(n, access)
	if err != nil {
		return nil, err
	}
	r.opened = append(r.opened, m)
	return m, nil
}

// close closes everything, newest first, and returns the first error.
func (r *rdma) close() error {
	var first error
	for i := len(r.opened) - 1; i >= 0; i-- {
		if err := r.opened[i].Close(); err != nil && first == nil {
			first = err
		}
	}
	r.opened = nil
	return first
}

// fail closes what was opened and returns err.
func (r *rdma) fail(err error) error {
	_ = r.close()
	return err
}

// localIP is the address a TCP connection's local end has: the device opens there, so its packets take
// the same route as the connection.
func localIP(conn net.Conn) (netip.Addr, error) {
	a, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return netip.Addr{}, err
	}
	return a.Addr().Unmap(), nil
}

// watch makes conn's reads and writes fail once ctx ends; the returned function stops that.
func watch(ctx context.Context, conn net.Conn) func() bool {
	return context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
}

// Receive runs the server side of one transfer on an accepted connection: it registers a region for
// the client's data, connects, waits for the WRITE with immediate that ends the transfer, and checks
// the CRC-32C it carries. It returns ErrChecksum (and the Result) if the data does not match.
func Receive(ctx context.Context, conn net.Conn, opts Options) (Result, error) {
	defer watch(ctx, conn)()
	var hello [helloLen]byte
	if _, err := io.ReadFull(conn, hello[:]); err != nil {
		return Result{}, fmt.Errorf("reading hello: %w", err)
	}
	if string(hello[:len(magic)]) != magic {
		return Result{}, errors.New("not a transfer client")
	}
	var peer goroce.Endpoint
	if err := peer.UnmarshalBinary(hello[len(magic) : len(magic)+goroce.EndpointLen]); err != nil {
		return Result{}, err
	}
	size := binary.BigEndian.Uint64(hello[len(magic)+goroce.EndpointLen:])
	if size == 0 || size > MaxSize {
		return Result{}, fmt.Errorf("size %d out of range (1..%d)", size, MaxSize)
	}
	addr, err := localIP(conn)
	if err != nil {
		return Result{}, err
	}
	r, err := open(addr, 4, opts.Network)
	if err != nil {
		return Result{}, err
	}
	defer r.close()
	dst, err := r.region(int(size), goroce.LocalWrite|goroce.RemoteWrite)
	if err != nil {
		return Result{}, err
	}
	if err := r.qp.Connect(peer, opts.Connect); err != nil {
		return Result{}, err
	}
	// The WRITE with immediate consumes a receive; its data goes where the WRITE says, so the receive
	// needs no buffer. A QP takes receives once connected (not in RESET), and the client sends nothing
	// before it has read ready.
	if err := r.qp.PostRecv(&goroce.RecvWR{WRID: 1}); err != nil {
		return Result{}, err
	}
	ready, _ := r.qp.Endpoint().AppendBinary(make([]byte, 0, readyLen))
	ready = binary.BigEndian.AppendUint64(ready, dst.Addr())
	ready = binary.BigEndian.AppendUint32(ready, uint32(dst.RKey()))
	if _, err := conn.Write(ready); err != nil {
		return Result{}, fmt.Errorf("sending ready: %w", err)
	}
	start := time.Now()

	// The client says nothing more until it has read done: a read that ends is a client gone, and
	// the wait for its data ends with it.
	ctx, cancel := context.WithCancelCause(ctx)
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		var b [1]byte
		_, err := conn.Read(b[:])
		cancel(fmt.Errorf("%w: %v", ErrClientGone, err))
	}()
	defer func() {
		_ = conn.SetReadDeadline(time.Unix(1, 0))
		<-gone
	}()
	wc := make([]goroce.Completion, 1)
	if _, err := r.cq.Wait(ctx, wc); err != nil {
		if cause := context.Cause(ctx); cause != nil {
			err = cause
		}
		return Result{}, err
	}
	if err := wc[0].Err(); err != nil {
		return Result{}, err
	}
	if wc[0].Opcode != goroce.CompRecvRDMAWithImm {
		return Result{}, fmt.Errorf("completion %v, want %v", wc[0].Opcode, goroce.CompRecvRDMAWithImm)
	}
	res := Result{Bytes: int(size), Elapsed: time.Since(start), Data: dst.Bytes()}
	res.Checksum = crc32.Checksum(dst.Bytes(), castagnoli)
	done := [doneLen]byte{statusOK}
	if res.Checksum != wc[0].Imm {
		done[0] = statusMismatch
		err = fmt.Errorf("%w: received %08x, sent %08x", ErrChecksum, res.Checksum, wc[0].Imm)
	}
	binary.BigEndian.PutUint32(done[1:], res.Checksum)
	if _, werr := conn.Write(done[:]); werr != nil && err == nil {
		err = fmt.Errorf("sending done: %w", werr)
	}
	return res, err
}

// Send runs the client side of one transfer on a connection to a server: it RDMA WRITEs the data into
// the server's region in chunks, opts.Depth at a time, the last one a WRITE with immediate that
// carries the data's CRC-32C, and returns once the server has checked it.
func Send(ctx context.Context, conn net.Conn, opts Options) (Result, error) {
	defer watch(ctx, conn)()
	opts.defaults()
	size := len(opts.Data)
	if opts.Data == nil {
		size = opts.Size
	}
	if size <= 0 || size > MaxSize {
		return Result{}, fmt.Errorf("size %d out of range (1..%d)", size, MaxSize)
	}
	addr, err := localIP(conn)
	if err != nil {
		return Result{}, err
	}
	r, err := open(addr, opts.Depth, opts.Network)
	if err != nil {
		return Result{}, err
	}
	defer r.close()
	src, err := r.region(size, goroce.LocalWrite)
	if err != nil {
		return Result{}, err
	}
	if opts.Data != nil {
		copy(src.Bytes(), opts.Data)
	} else {
		fill(src.Bytes())
	}
	sum := crc32.Checksum(src.Bytes(), castagnoli)

	hello, _ := r.qp.Endpoint().AppendBinary([]byte(magic))
	hello = binary.BigEndian.AppendUint64(hello, uint64(size))
	if _, err := conn.Write(hello); err != nil {
		return Result{}, fmt.Errorf("sending hello: %w", err)
	}
	var ready [readyLen]byte
	if _, err := io.ReadFull(conn, ready[:]); err != nil {
		return Result{}, fmt.Errorf("reading ready: %w", err)
	}
	var peer goroce.Endpoint
	if err := peer.UnmarshalBinary(ready[:goroce.EndpointLen]); err != nil {
		return Result{}, err
	}
	remote := binary.BigEndian.Uint64(ready[goroce.EndpointLen:])
	rkey := goroce.RKey(binary.BigEndian.Uint32(ready[goroce.EndpointLen+8:]))
	if err := r.qp.Connect(peer, opts.Connect); err != nil {
		return Result{}, err
	}

	start := time.Now()
	if err := pipeline(ctx, r, src, remote, rkey, opts, sum); err != nil {
		return Result{}, err
	}
	res := Result{Bytes: size, Elapsed: time.Since(start), Checksum: sum, Data: src.Bytes()}
	var done [doneLen]byte
	if _, err := io.ReadFull(conn, done[:]); err != nil {
		return res, fmt.Errorf("reading done: %w", err)
	}
	if done[0] != statusOK {
		return res, fmt.Errorf("%w: server has %08x, sent %08x", ErrChecksum, binary.BigEndian.Uint32(done[1:]), sum)
	}
	return res, nil
}

// pipeline WRITEs src to remote in chunks, keeping up to opts.Depth in flight: whenever completions
// free room, the next chunks go in one PostSend. The last chunk is a WRITE with immediate carrying
// sum; RC executes a QP's requests in order, so when the server's receive completes, every earlier
// WRITE has landed.
func pipeline(ctx context.Context, r *rdma, src *goroce.MR, remote uint64, rkey goroce.RKey, opts Options, sum uint32) error {
	size := len(src.Bytes())
	chunks := (size + opts.Chunk - 1) / opts.Chunk
	wrs := make([]goroce.SendWR, opts.Depth)
	ptrs := make([]*goroce.SendWR, opts.Depth)
	wc := make([]goroce.Completion, opts.Depth)
	posted, completed := 0, 0
	for completed < chunks {
		n := 0
		for posted+n < chunks && posted+n-completed < opts.Depth {
			i := posted + n
			off := i * opts.Chunk
			length := min(opts.Chunk, size-off)
			wrs[n] = goroce.SendWR{WRID: uint64(i), Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
				SGL: []goroce.SGE{src.SGE(off, length)}, RemoteAddr: remote + uint64(off), RKey: rkey}
			if i == chunks-1 {
				wrs[n].Opcode, wrs[n].Imm = goroce.WRRDMAWriteImm, sum
			}
			ptrs[n] = &wrs[n]
			n++
		}
		if n > 0 {
			if err := r.qp.PostSend(ptrs[:n]...); err != nil {
				return err
			}
			posted += n
		}
		k, err := r.cq.Wait(ctx, wc)
		if err != nil {
			return err
		}
		for _, c := range wc[:k] {
			if err := c.Err(); err != nil {
				return err
			}
		}
		completed += k
	}
	return nil
}

// fill fills b with pseudo-random bytes.
func fill(b []byte) {
	rng := rand.NewChaCha8([32]byte{'g', 'o', 'r', 'o', 'c', 'e'})
	_, _ = rng.Read(b)
}
