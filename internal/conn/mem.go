package conn

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMemQueueLen is the receive queue of an in-memory endpoint, in datagrams.
const DefaultMemQueueLen = 4096

// firstMemPort is where port 0 allocation starts, the IANA dynamic range.
const firstMemPort = 49152

// Verdict is a Filter's decision on one datagram. The zero Verdict delivers it once, now.
type Verdict struct {
	// Drop discards the datagram (counted in DropFiltered).
	Drop bool
	// Duplicates is the number of extra copies delivered after the original.
	Duplicates int
	// Delay holds the datagram (and its copies) back this long, on a timer; later datagrams
	// overtake it. Test plumbing only: engines never see the wall clock through it.
	Delay time.Duration
}

// Filter inspects a datagram in flight on a MemNetwork. m is the network's own copy: the filter
// may change m.Buf's bytes (corruption), shorten m.Buf, and change m.TOS (ECN marking); m.Addr
// is the destination and from the source. Filters run one at a time, in write order, so a seeded
// filter replays exactly when writes are issued from one goroutine.
type Filter func(m *Message, from netip.AddrPort) Verdict

// RandomLoss returns a Filter dropping percent% of datagrams, chosen by a PCG generator seeded
// with seed.
func RandomLoss(percent float64, seed uint64) Filter {
	rng := rand.New(rand.NewPCG(seed, seed^pcgStream))
	return func(*Message, netip.AddrPort) Verdict {
		return Verdict{Drop: rng.Float64()*100 < percent}
	}
}

// pcgStream is the second PCG seed word derived from the caller's seed; any constant will do.
const pcgStream = 0x9e3779b97f4a7c15

// MemNetwork is an in-memory datagram network for tests: endpoints bound to any address,
// datagrams copied on write into the destination's bounded queue, never blocking the writer. It
// behaves like Linux on loopback where the device runtime can tell: a GSO write arrives whole
// at an endpoint with GRO (as one run) and in datagrams elsewhere or through a filter, and a group
// from ListenShards steers each datagram by its destination QPN.
//
// Locks: mu guards the endpoint table and settings; filterMu serializes filter calls and guards
// scratch; each endpoint's mu guards its queue. Order: filterMu, then mu, then an endpoint's mu.
type MemNetwork struct {
	mu       sync.RWMutex
	conns    map[netip.AddrPort][]*memConn // one Conn, or a ListenShards group in index order
	nextPort uint16
	queueLen int
	batch    int
	filter   Filter

	filterMu sync.Mutex
	scratch  []byte

	stats  counters // network-level drops: unknown destination, filtered
	timers sync.WaitGroup
}

// NewMemNetwork returns an empty network with DefaultMemQueueLen queues and DefaultBatchSize.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{
		conns:    make(map[netip.AddrPort][]*memConn),
		nextPort: firstMemPort,
		queueLen: DefaultMemQueueLen,
		batch:    DefaultBatchSize,
	}
}

// SetQueueLen sets the receive queue length, in datagrams, of endpoints bound afterwards.
func (n *MemNetwork) SetQueueLen(datagrams int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queueLen = max(datagrams, 1)
}

// SetBatchSize sets the BatchSize of endpoints bound afterwards.
func (n *MemNetwork) SetBatchSize(size int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.batch = Options{BatchSize: size}.batchSize()
}

// SetFilter installs f (nil removes it) for datagrams written from now on.
func (n *MemNetwork) SetFilter(f Filter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.filter = f
}

// Stats returns the network-level counters: DropUnknownDest and DropFiltered, plus the sum of
// DropOverflow over the endpoints still bound.
func (n *MemNetwork) Stats() Stats {
	s := n.stats.snapshot()
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, g := range n.conns {
		for _, c := range g {
			s.DropOverflow += c.stats.dropOverflow.Load()
		}
	}
	return s
}

// Wait waits for datagrams delayed by a filter to be delivered or dropped.
func (n *MemNetwork) Wait() { n.timers.Wait() }

// Listen binds an endpoint at addr; port 0 picks a free port. No sockets are involved, so any
// address works; an unspecified address receives datagrams for its port not bound more exactly.
// Of opts, BatchSize (0: the network's), GSO and GRO count.
func (n *MemNetwork) Listen(addr netip.AddrPort, opts Options) (Conn, error) {
	g, err := n.listen(addr, 1, opts)
	if err != nil {
		return nil, err
	}
	return g[0], nil
}

// ListenShards binds a group of k endpoints at addr (port 0 picks a free port), each datagram going
// to the endpoint at index ShardOf(datagram, k).
func (n *MemNetwork) ListenShards(addr netip.AddrPort, k int, opts Options) ([]Conn, error) {
	if k < 1 {
		return nil, fmt.Errorf("conn: mem listen %v: %d shards", addr, k)
	}
	return n.listen(addr, k, opts)
}

func (n *MemNetwork) listen(addr netip.AddrPort, k int, opts Options) ([]Conn, error) {
	if !addr.Addr().IsValid() {
		return nil, fmt.Errorf("conn: mem listen: invalid address %v", addr)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if addr.Port() == 0 {
		for i := 0; ; i++ {
			if i == 1<<16-firstMemPort {
				return nil, fmt.Errorf("conn: mem listen %v: no free port", addr.Addr())
			}
			p := n.nextPort
			n.nextPort++
			if n.nextPort == 0 {
				n.nextPort = firstMemPort
			}
			if _, used := n.conns[netip.AddrPortFrom(addr.Addr(), p)]; !used {
				addr = netip.AddrPortFrom(addr.Addr(), p)
				break
			}
		}
	}
	if _, used := n.conns[addr]; used {
		return nil, fmt.Errorf("conn: mem listen %v: address in use", addr)
	}
	batch := n.batch
	if opts.BatchSize != 0 {
		batch = opts.batchSize()
	}
	g := make([]*memConn, k)
	out := make([]Conn, k)
	for i := range g {
		c := &memConn{net: n, local: addr, batch: batch, q: make([]memDatagram, n.queueLen), gro: opts.GRO}
		c.gso.Store(opts.GSO)
		c.cond.L = &c.mu
		g[i], out[i] = c, c
	}
	n.conns[addr] = g
	return out, nil
}

// lookup finds the endpoint for a datagram to dst. Caller holds n.mu (read).
func (n *MemNetwork) lookup(dst netip.AddrPort, payload []byte) *memConn {
	g := n.conns[dst]
	if g == nil {
		a := dst.Addr().Unmap()
		unspec := netip.IPv4Unspecified()
		if a.Is6() {
			unspec = netip.IPv6Unspecified()
		}
		g = n.conns[netip.AddrPortFrom(unspec, dst.Port())]
	}
	if len(g) == 0 {
		return nil
	}
	return g[ShardOf(payload, len(g))]
}

// send carries a message from src: a datagram, or a GSO run, which travels as one run to an
// endpoint with GRO when no filter is set and as separate datagrams otherwise. It never blocks on
// the receiver.
func (n *MemNetwork) send(m *Message, src netip.AddrPort) {
	n.mu.RLock()
	f := n.filter
	dst := n.lookup(m.Addr, m.Buf)
	n.mu.RUnlock()
	if segments(len(m.Buf), m.SegSize) > 1 && (f != nil || dst == nil || !dst.gro) {
		for b := m.Buf; len(b) > 0; {
			k := min(m.SegSize, len(b))
			seg := Message{Buf: b[:k], Addr: m.Addr, TOS: m.TOS}
			n.send(&seg, src)
			b = b[k:]
		}
		return
	}
	if dst == nil {
		n.stats.dropUnknownDest.Add(uint64(segments(len(m.Buf), m.SegSize)))
		return
	}
	if f == nil {
		dst.deliver(m.Buf, m.SegSize, src, m.Addr.Addr(), m.TOS)
		return
	}
	n.filterMu.Lock()
	defer n.filterMu.Unlock()
	n.scratch = append(n.scratch[:0], m.Buf...)
	fm := Message{Buf: n.scratch, Addr: m.Addr, TOS: m.TOS}
	v := f(&fm, src)
	if v.Drop {
		n.stats.dropFiltered.Add(1)
		return
	}
	buf := fm.Buf
	if v.Delay > 0 {
		buf = append([]byte(nil), buf...)
		to, tos := fm.Addr, fm.TOS
		n.timers.Add(1)
		time.AfterFunc(v.Delay, func() {
			defer n.timers.Done()
			n.mu.RLock()
			dst := n.lookup(to, buf)
			n.mu.RUnlock()
			if dst == nil {
				n.stats.dropUnknownDest.Add(1)
				return
			}
			for range 1 + v.Duplicates {
				dst.deliver(buf, 0, src, to.Addr(), tos)
			}
		})
		return
	}
	for range 1 + v.Duplicates {
		dst.deliver(buf, 0, src, fm.Addr.Addr(), fm.TOS)
	}
}

// memDatagram is one queued datagram or GRO run; its buf is reused by later ones in the same slot.
type memDatagram struct {
	buf     []byte
	segSize int
	from    netip.AddrPort
	to      netip.Addr
	tos     uint8
}

// memConn is an endpoint of a MemNetwork. mu guards the queue (a ring of len(q) slots, n of
// them full from head), closed and the read deadline; cond, on mu, wakes a blocked ReadBatch.
type memConn struct {
	net   *MemNetwork
	local netip.AddrPort
	batch int
	gro   bool
	gso   atomic.Bool
	stats counters

	wmu   sync.Mutex // serializes WriteBatch's use of whole
	whole Message    // a message in Pieces, made whole

	mu       sync.Mutex
	cond     sync.Cond
	q        []memDatagram
	head     int
	n        int
	closed   bool
	deadline time.Time
	timer    *time.Timer // broadcasts cond when deadline passes
}

func (c *memConn) deliver(b []byte, segSize int, from netip.AddrPort, to netip.Addr, tos uint8) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		c.net.stats.dropUnknownDest.Add(1)
		return
	}
	if c.n == len(c.q) {
		c.stats.dropOverflow.Add(1)
		return
	}
	d := &c.q[(c.head+c.n)%len(c.q)]
	d.buf = append(d.buf[:0], b...)
	d.segSize, d.from, d.to, d.tos = segSize, from, to, tos
	c.n++
	c.cond.Signal()
}

// ReadBatch blocks until a datagram is queued, the read deadline passes or the endpoint is closed.
func (c *memConn) ReadBatch(msgs []Message) (int, error) { return c.readBatch(msgs, true) }

// PollBatch is ReadBatch without the wait; see Poller.
func (c *memConn) PollBatch(msgs []Message) (int, error) { return c.readBatch(msgs, false) }

func (c *memConn) readBatch(msgs []Message, block bool) (int, error) {
	c.mu.Lock()
	if !block && c.n == 0 && !c.closed {
		c.mu.Unlock()
		return 0, nil
	}
	for c.n == 0 && !c.closed {
		if !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
			c.mu.Unlock()
			return 0, ErrDeadline
		}
		c.cond.Wait()
	}
	if c.closed {
		c.mu.Unlock()
		return 0, ErrClosed
	}
	k := min(len(msgs), c.n, c.batch)
	var bytes, trunc, dgrams uint64
	for i := range k {
		d := &c.q[c.head]
		m := &msgs[i]
		m.N = copy(m.Buf[:cap(m.Buf)], d.buf)
		m.Truncated = m.N < len(d.buf)
		if m.Truncated {
			trunc++
		}
		m.Addr, m.Local, m.TOS, m.SegSize = d.from, d.to, d.tos, d.segSize
		bytes += uint64(m.N)
		dgrams += uint64(segments(m.N, m.SegSize))
		c.head = (c.head + 1) % len(c.q)
		c.n--
	}
	c.mu.Unlock()
	if k > 0 {
		c.stats.readBatches.Add(1)
		c.stats.datagramsIn.Add(dgrams)
		c.stats.bytesIn.Add(bytes)
		c.stats.dropTruncated.Add(trunc)
	}
	return k, nil
}

// WriteBatch copies each datagram to its destination's queue. Datagrams to unbound addresses,
// filtered out or overflowing the receiver's queue are dropped and counted. A GSO message on an
// endpoint without GSO ends the call with ErrGSO.
func (c *memConn) WriteBatch(msgs []Message) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var bytes, dgrams uint64
	sent := 0
	var err error
	for i := range msgs {
		m := &msgs[i]
		if m.Pieces != nil {
			c.whole = Message{Buf: m.Flatten(c.whole.Buf[:0]), Addr: m.Addr, TOS: m.TOS, SegSize: m.SegSize}
			m = &c.whole
		}
		n := segments(len(m.Buf), m.SegSize)
		if n > 1 && (!c.gso.Load() || n > MaxSegments || len(m.Buf) > MaxGSOSize) {
			err = fmt.Errorf("%w: %d segments of %d bytes on an endpoint with GSO %v", ErrGSO, n, m.SegSize, c.gso.Load())
			c.gso.Store(false)
			c.stats.gsoRefused.Add(1)
			break
		}
		c.net.send(m, c.local)
		bytes += uint64(len(m.Buf))
		dgrams += uint64(n)
		sent++
	}
	c.stats.writeBatches.Add(1)
	c.stats.datagramsOut.Add(dgrams)
	c.stats.bytesOut.Add(bytes)
	return sent, err
}

// SetReadDeadline sets the deadline of ReadBatch; see Conn.
func (c *memConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if !t.IsZero() {
		if d := time.Until(t); d > 0 {
			c.timer = time.AfterFunc(d, func() {
				c.mu.Lock()
				c.cond.Broadcast()
				c.mu.Unlock()
			})
		}
	}
	c.cond.Broadcast()
	return nil
}

// Offload reports GSO and GRO as asked for at Listen (GSO until a write refused it), and Gather.
func (c *memConn) Offload() Offload {
	o := Offload{GRO: c.gro, Gather: true}
	if c.gso.Load() {
		o.GSO = MaxSegments
	}
	return o
}

func (c *memConn) LocalAddr() netip.AddrPort { return c.local }
func (c *memConn) BatchSize() int            { return c.batch }

// Stats returns the endpoint's counters; DropOverflow counts datagrams lost at its queue.
func (c *memConn) Stats() Stats { return c.stats.snapshot() }

// Close unbinds the endpoint and wakes its reader. Closing twice returns nil.
func (c *memConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.timer != nil {
		c.timer.Stop()
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	// The group keeps its other members' indices: datagrams steered to a closed member are lost,
	// as with a socket that left a reuseport group. The address is free once all have closed.
	c.net.mu.Lock()
	if g := c.net.conns[c.local]; g != nil {
		open := false
		for _, m := range g {
			if m != c && !m.isClosed() {
				open = true
			}
		}
		if !open {
			delete(c.net.conns, c.local)
		}
	}
	c.net.mu.Unlock()
	return nil
}

func (c *memConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
