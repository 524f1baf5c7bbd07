package datapath

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/internal/netdev"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// The send path. A QP's packets are built by its engine straight into a batch's arena, sealed there
// and sent from the QP's port:
//
//	arena: | FIRST 4128 | MID 4112 | MID 4112 | ... | LAST 4112 | ACK 20 |
//	msgs:  [ plain     ][ GSO: SegSize 4112, 15 segments    ][ plain ]
//
// Consecutive packets to the same destination with the same TOS and size join one GSO message, and
// one shorter packet may end it (every segment but the last must be exactly SegSize). A packet that
// cannot join starts a new message where it lies, so nothing is copied. Segment i of a GSO message is
// sealed with IPv4 identification i, which the kernel gives it when it segments in software (see
// conn.Listen); a plain datagram carries 0.
//
// Where the socket gathers (conn.Offload.Gather) and no Tracer wants each packet whole, a payload
// read from registered memory stays there (qp.AppendPacketRefs): the arena gets the headers and the
// trailers, and each message is a list of pieces, the arena's runs between the payloads' pieces:
//
//	arena:  | FIRST hdr | trl MID hdr | trl MID hdr | ... | trl ACK 20 |
//	pieces: [ arena ][ MR 4096 ][ arena ][ MR 4096 ][ arena ] ...
//
// so that the kernel's copy is the only one the payload takes on the way out.

// txArena bounds a batch's bytes: four full GSO messages.
const txArena = 4 * conn.MaxGSOSize

// maxPacket is the most bytes one packet can take: headers, a 4096-byte payload, pad and ICRC.
const maxPacket = 4096 + 256

// txMsgs bounds a batch's messages.
const txMsgs = 64

// txPieces bounds a batch's pieces (conn.MaxPieces for one write), and maxPacketPieces is the most
// one packet adds: its headers, its payload's pieces and its trailer.
const (
	txPieces        = conn.MaxPieces
	maxPacketPieces = 2 + qp.RefMaxPieces
)

// port is a send socket: the UDP source port of the QPs that hash to it. mu is held from building a
// QP's packets to sending them, so that packets leave in the order their engine built them.
type port struct {
	d     *Datapath
	conn  conn.Conn
	num   uint16
	mu    sync.Mutex
	seeds icrcSeeds // of the packets pump sealed; guarded by mu
}

func (p *port) close() { _ = p.conn.Close() }

// txBatch collects packets for one port's WriteBatch. A goroutine borrows one for a pump and its
// flush; the port's lock is held meanwhile.
type txBatch struct {
	arena []byte
	msgs  []conn.Message
	// open reports that the last message may take another segment.
	open bool
	// size is the bytes of the last message.
	size int
	// pieces holds the pieces of every message of a gathering batch, each message's a run of it
	// from first; refs the payload pieces of the packet being built; arenaEnd the arena offset
	// where the last piece ends if it is the arena's, else -1.
	pieces   [][]byte
	first    int
	refs     [][]byte
	arenaEnd int
	// flat holds a message in pieces made whole, to be sent again as single datagrams.
	flat []byte
	// split holds the single datagrams of a GSO message being resent without GSO.
	split []conn.Message
	// trace is the record handed to the Tracer for each packet pumped, reused so that tracing does
	// not allocate (the Tracer must not keep it).
	trace TraceRecord
}

var txPool = sync.Pool{New: func() any {
	return &txBatch{arena: make([]byte, 0, txArena), msgs: make([]conn.Message, 0, txMsgs),
		pieces: make([][]byte, 0, txPieces), refs: make([][]byte, 0, qp.RefMaxPieces)}
}}

func getTxBatch() *txBatch  { return txPool.Get().(*txBatch) }
func putTxBatch(b *txBatch) { txPool.Put(b) }

// pump moves q's packets into tb, flushing tb through p whenever it fills, until the engine has
// nothing more to send now. It returns q's next deadline if it must be filed with its shard (it is
// earlier than the one filed), else none (a zero time). The caller holds p.mu (q's port) and not q.mu.
func (p *port) pump(q *QP, tb *txBatch, now time.Time) (file deadline) {
	d := p.d
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return deadline{}
	}
	off := p.conn.Offload()
	maxSegs := off.GSO
	gather := off.Gather && d.cfg.Tracer == nil
	src := netip.AddrPortFrom(d.local.Addr(), p.num)
	for {
		if len(tb.msgs) == cap(tb.msgs) || cap(tb.arena)-len(tb.arena) < maxPacket || len(tb.pieces)+maxPacketPieces > cap(tb.pieces) {
			p.flush(tb)
			maxSegs = p.conn.Offload().GSO
		}
		start := len(tb.arena)
		var out []byte
		var tx qp.Tx
		var ok bool
		if gather {
			out, tb.refs, tx, ok = q.eng.AppendPacketRefs(now, tb.arena[start:start], tb.refs[:0])
		} else {
			out, tx, ok = q.eng.AppendPacket(now, tb.arena[start:start])
		}
		if !ok {
			break
		}
		dst, ok := q.destination(tx)
		if !ok {
			d.stats.dropNoRoute.Add(1)
			continue
		}
		tb.arena = tb.arena[:start+len(out)]
		pkt := tb.arena[start:]
		id := tb.place(pkt, tx.PacketLen, dst, q.trafficClass(tx), maxSegs, q.gsoTo(dst), gather)
		if len(tb.refs) == 0 {
			if gather {
				tb.addArena(start, len(tb.arena))
			}
			p.seeds.seal(pkt, src, dst, id)
		} else {
			at := start + tx.PayloadAt
			tb.addArena(start, at)
			tb.pieces = append(tb.pieces, tb.refs...)
			tb.arenaEnd = -1
			tb.addArena(at, len(tb.arena))
			sealPieces(pkt[:tx.PayloadAt], tb.refs, pkt[tx.PayloadAt:], src, dst, id)
		}
		if gather {
			tb.msgs[len(tb.msgs)-1].Pieces = tb.pieces[tb.first:]
		}
		if d.cfg.Tracer != nil {
			tb.tracePacket(d.cfg.Tracer, pkt, src, dst, q.trafficClass(tx), id, tx.Resend, now)
		}
	}
	if next := q.deadline(); next.before(q.scheduled) {
		file = next
	}
	q.mu.Unlock()
	return file
}

// tracePacket hands a packet just built, whole (a traced batch does not gather), to t. It is out of
// line, as pump's other cold paths are, so that an untraced packet's way through pump stays short.
//
//go:noinline
func (tb *txBatch) tracePacket(t Tracer, pkt []byte, src, dst netip.AddrPort, tos uint8, id uint16, resend qp.Resend, now time.Time) {
	if pp, err := wire.Parse(pkt); err == nil {
		tb.trace = TraceRecord{Sent: true, At: now, From: src, To: dst, TOS: tos, IPID: id, Bytes: pkt, Packet: pp, Resend: resend}
		t.TracePacket(&tb.trace)
	}
}

// place decides which message a packet of n bytes, just appended to the arena at pkt (its headers
// and trailer only, if it has payload pieces), belongs to, and returns its segment index there: the
// identification its ICRC is sealed with. A gathering batch's caller then adds the packet's pieces.
func (tb *txBatch) place(pkt []byte, n int, dst netip.AddrPort, tos uint8, maxSegs int, gsoOK, gather bool) uint16 {
	if k := len(tb.msgs); k > 0 && tb.open && gsoOK && maxSegs > 1 {
		m := &tb.msgs[k-1]
		segs := (tb.size + m.SegSize - 1) / m.SegSize
		if m.Addr == dst && m.TOS == tos && n <= m.SegSize && segs < maxSegs && tb.size+n <= conn.MaxGSOSize {
			tb.size += n
			if !gather {
				m.Buf = m.Buf[:tb.size]
			}
			tb.open = n == m.SegSize
			return uint16(segs)
		}
	}
	m := conn.Message{Addr: dst, TOS: tos, SegSize: n}
	if !gather {
		m.Buf = pkt
	}
	tb.msgs = append(tb.msgs, m)
	tb.size, tb.first, tb.arenaEnd = n, len(tb.pieces), -1
	tb.open = true
	return 0
}

// addArena adds the arena's bytes [a, b) to the last message's pieces, as an extension of its last
// piece where that ends at a.
func (tb *txBatch) addArena(a, b int) {
	if a == b {
		return
	}
	if k := len(tb.pieces); k > tb.first && tb.arenaEnd == a {
		last := tb.pieces[k-1]
		tb.pieces[k-1] = last[:len(last)+b-a]
	} else {
		tb.pieces = append(tb.pieces, tb.arena[a:b])
	}
	tb.arenaEnd = b
}

// flush sends tb's messages through p and empties tb. A GSO message the socket refuses is sent again
// as single datagrams, each sealed again with identification 0, so nothing is lost; the socket has
// turned GSO off by then, so later pumps build plain datagrams. The caller holds p.mu.
func (p *port) flush(tb *txBatch) {
	d := p.d
	msgs := tb.msgs
	for i := range msgs {
		size := msgs[i].Len()
		d.stats.txBytes.Add(uint64(size))
		segs := (size + msgs[i].SegSize - 1) / msgs[i].SegSize
		d.stats.txPackets.Add(uint64(segs))
		if segs > 1 {
			d.stats.txGSO.Add(1)
		}
	}
	for sent := 0; sent < len(msgs); {
		n, err := p.conn.WriteBatch(msgs[sent:])
		sent += n
		if errors.Is(err, conn.ErrGSO) && sent < len(msgs) {
			p.resendSplit(tb, &msgs[sent])
			sent++
			continue
		}
		if err != nil || n == 0 {
			break // the socket is closing; what is not sent is lost like any packet
		}
	}
	tb.reset()
}

// resendSplit sends m, a GSO message the socket refused, again as single datagrams, each sealed
// again with identification 0, and notes that GSO fell back. The caller holds p.mu.
//
//go:noinline
func (p *port) resendSplit(tb *txBatch, m *conn.Message) {
	d := p.d
	d.stats.gsoFallback.Add(1)
	d.gso.fellBack.Store(true)
	src := netip.AddrPortFrom(d.local.Addr(), p.num)
	tb.split = tb.split[:0]
	if m.Pieces != nil {
		tb.flat = m.Flatten(tb.flat[:0])
		m.Buf, m.Pieces = tb.flat, nil
	}
	m.N = len(m.Buf)
	m.Segments(func(seg []byte) {
		seal(seg, src, m.Addr, 0)
		tb.split = append(tb.split, conn.Message{Buf: seg, Addr: m.Addr, TOS: m.TOS})
	})
	for k := 0; k < len(tb.split); {
		w, err := p.conn.WriteBatch(tb.split[k:])
		if err != nil || w == 0 {
			break // the socket is closing
		}
		k += w
	}
	clear(tb.split)
}

// reset empties tb for reuse.
func (tb *txBatch) reset() {
	clear(tb.msgs) // do not keep the arena reachable through stale messages
	tb.msgs = tb.msgs[:0]
	tb.arena = tb.arena[:0]
	clear(tb.pieces) // nor the regions' memory through stale pieces
	clear(tb.refs[:cap(tb.refs)])
	tb.pieces, tb.first, tb.arenaEnd = tb.pieces[:0], 0, -1
	tb.open, tb.size = false, 0
	tb.trace = TraceRecord{}
}

// send pumps q and sends what it produced, from the calling goroutine: a PostSend rings the
// doorbell this way. It files q's deadline with its shard if that moved earlier.
func (q *QP) send(now time.Time) {
	p := q.port
	tb := getTxBatch()
	p.mu.Lock()
	next := p.pump(q, tb, now)
	p.flush(tb)
	p.mu.Unlock()
	putTxBatch(tb)
	if !next.at.IsZero() {
		q.shard.fileDeadline(q, next)
	}
}

// pumpAll pumps qs, which a driver collected, one port at a time (each port's QPs in one batch), and
// files the deadlines that moved. A QP whose engine has nothing to send (qp.QP.MaySend), as after a
// request whose ACK waits for the reply's company, only has its deadline filed: its port is neither
// locked nor written to. It uses up qs: every entry is nil when it returns.
func (s *shard) pumpAll(qs []*QP, now time.Time) {
	for i := range qs {
		if qs[i] == nil {
			continue
		}
		p := qs[i].port
		locked := false
		for k := i; k < len(qs); k++ {
			q := qs[k]
			if q == nil || q.port != p {
				continue
			}
			qs[k] = nil
			if q.quiet(now) {
				s.file(q)
				continue
			}
			if !locked {
				p.mu.Lock()
				locked = true
			}
			if !p.pump(q, s.tx, now).at.IsZero() {
				s.file(q)
			}
		}
		if locked {
			if len(s.tx.msgs) > 0 {
				p.flush(s.tx)
			}
			p.mu.Unlock()
		}
	}
}

// quiet reports whether q's engine has nothing to send at now, or q is closed.
func (q *QP) quiet(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed || !q.eng.MaySend(now)
}

// destination returns where a packet the engine produced goes: the QP's peer, or for UD the address
// handle's GID and port (the RoCEv2 port unless set).
func (q *QP) destination(tx qp.Tx) (netip.AddrPort, bool) {
	if q.typ == qp.UD {
		a := q.d.scoped(netip.AddrFrom16(tx.AH.DGID).Unmap())
		port := tx.AH.Port
		if port == 0 {
			port = wire.UDPPort
		}
		return netip.AddrPortFrom(a, port), a.IsValid() && !a.IsUnspecified()
	}
	p := q.peer.Load()
	if p == nil {
		return netip.AddrPort{}, false
	}
	return *p, true
}

// trafficClass returns the TOS byte of a packet: the address handle's traffic class, or the QP's.
func (q *QP) trafficClass(tx qp.Tx) uint8 {
	if tx.AH.TrafficClass != 0 {
		return tx.AH.TrafficClass
	}
	return q.srcTC
}

// gsoPolicy decides, per destination, whether runs to it may leave in GSO writes.
type gsoPolicy struct {
	mode     GSOMode
	host     bool        // the network is the host's: ask netdev about egress devices
	fellBack atomic.Bool // a socket refused GSO at least once
	mu       sync.Mutex
	cache    map[netip.Addr]bool
}

// gsoCacheSize bounds the destinations remembered; past it the cache starts over.
const gsoCacheSize = 4096

func (g *gsoPolicy) init(mode GSOMode, n conn.Network) {
	g.mode = mode
	g.host = n == conn.UDP
	g.cache = make(map[netip.Addr]bool)
}

// allowed reports whether packets to dst may share GSO writes: never with GSOOff, always with GSOOn,
// and with GSOAuto when the device toward dst segments in software, so that segment i is known to
// carry identification i (see netdev). IPv6 has no identification: any device will do.
func (g *gsoPolicy) allowed(dst netip.Addr) bool {
	switch {
	case g.mode == GSOOff:
		return false
	case g.mode == GSOOn || !g.host || (dst.Is6() && !dst.Is4In6()):
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	ok, known := g.cache[dst]
	if !known {
		dev, err := netdev.Egress(dst)
		ok = err == nil && dev.SegmentsInSoftware()
		if len(g.cache) >= gsoCacheSize {
			clear(g.cache)
		}
		g.cache[dst] = ok
	}
	return ok
}

// headerRoom is what rxe keeps free of a link MTU for a packet's headers (RXE_MAX_HDR_LENGTH: IPv6,
// UDP, BTH, the largest extended header and the ICRC) before it picks the IB MTU of its port.
const headerRoom = 80

// MaxMTU returns the largest path MTU toward dst that the link allows, as rxe derives its port's
// active MTU: the egress device's link MTU less 80 bytes of headers, rounded down to an IB MTU (1500
// gives 1024; 9000 and loopback give 4096). An invalid dst asks about the device the datapath is
// bound to, for what it advertises before it knows its peer. Off the host's network, and when the
// bound device is not known (a wildcard address), the answer is 4096; when the route to dst is not
// known, 1024, the MTU rxe uses on standard Ethernet.
func (d *Datapath) MaxMTU(dst netip.Addr) wire.MTU {
	if !d.gso.host {
		return wire.MTU4096
	}
	var mtu int
	if dst.IsValid() {
		dev, err := netdev.Egress(dst)
		if err != nil || dev.MTU == 0 {
			return wire.MTU1024
		}
		mtu = dev.MTU
	} else {
		m, err := netdev.LocalMTU(d.local.Addr())
		if err != nil {
			return wire.MTU4096
		}
		mtu = m
	}
	for _, m := range []wire.MTU{wire.MTU4096, wire.MTU2048, wire.MTU1024, wire.MTU512} {
		if m.Bytes()+headerRoom <= mtu {
			return m
		}
	}
	return wire.MTU256
}

// scoped gives a link-local IPv6 destination the zone of the datapath's own address: a GID carries no
// zone, and a link-local address means nothing without the link. Other addresses pass unchanged.
func (d *Datapath) scoped(a netip.Addr) netip.Addr {
	if a.Zone() == "" && a.IsLinkLocalUnicast() && a.Is6() {
		if z := d.local.Addr().Zone(); z != "" {
			return a.WithZone(z)
		}
	}
	return a
}
