package datapath

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// receive handles the n messages the driver just read: each datagram (each segment of a GRO run) is
// validated once (wire.Parse, then the ICRC), matched to its QP and run through the QP's engine; then
// the QPs it touched send what they answer, port by port.
func (s *shard) receive(n int, now time.Time) {
	d := s.d
	r := &s.rx
	var packets, bytes, runs uint64 // counted once a batch: each count is an atomic add
	for i := 0; i < n; i++ {
		m := &r.msgs[i]
		if m.Truncated {
			packets++
			d.stats.dropTruncated.Add(1)
			if t := d.cfg.Tracer; t != nil {
				r.trace = TraceRecord{At: now, From: m.Addr, To: netip.AddrPortFrom(m.Local, d.local.Port()), TOS: m.TOS,
					Bytes: m.Buf[:m.N], Drop: DropTruncated}
				t.TracePacket(&r.trace)
			}
			continue
		}
		to := m.Local
		if !to.IsValid() {
			to = d.local.Addr()
		}
		if m.SegSize > 0 {
			runs++
		}
		var seg uint16
		m.Segments(func(b []byte) {
			s.receivePacket(b, m.Addr, to, m.TOS, seg, now)
			seg++
		})
		packets += uint64(seg)
		bytes += uint64(m.N)
	}
	d.stats.rxPackets.Add(packets)
	d.stats.rxBytes.Add(bytes)
	if runs > 0 {
		d.stats.rxGRO.Add(runs)
	}
	s.pumpAll(r.touched, now)
	clear(r.touched)
	r.touched = r.touched[:0]
	for i := 0; i < n; i++ {
		r.msgs[i] = conn.Message{Buf: r.bufs[i]}
	}
}

// receivePacket handles one datagram. idGuess is its index in a GRO run: the IPv4 identification a
// goroce sender sealed it with.
//
// What only a dropped or traced packet needs is out of line (drop, trace): a packet's way through
// here then spans a few cache lines of code, which a round trip reads again after every system call.
func (s *shard) receivePacket(b []byte, from netip.AddrPort, to netip.Addr, tos uint8, idGuess uint16, now time.Time) {
	d := s.d
	r := &s.rx
	pkt, err := wire.Parse(b)
	if errors.Is(err, wire.ErrBadOpcode) {
		pkt, err = wire.ParseReserved(b) // an RC request the responder NAKs
	}
	if err != nil {
		s.drop(&d.stats.dropMalformed, DropMalformed, rxMeta{b, from, to, tos, idGuess, now}, wire.Packet{})
		return
	}
	local := netip.AddrPortFrom(to, d.local.Port())
	id, ok := r.v.verify(d.cfg.ICRC, from, local, pkt, idGuess)
	if !ok {
		s.drop(&d.stats.dropICRC, DropICRC, rxMeta{b, from, to, tos, idGuess, now}, pkt)
		return
	}
	if d.cfg.GSI != nil && pkt.BTH().DestQP() == wire.QPNGSI {
		s.receiveGSI(pkt, b, from, local, tos, id, now)
		return
	}
	q := s.lookup(pkt.BTH().DestQP())
	if q == nil {
		s.drop(&d.stats.dropUnknownQPN, DropUnknownQPN, rxMeta{b, from, to, tos, id, now}, pkt)
		return
	}
	// RC and UC QPs take packets only from their peer, as rxe does. IBTA Annex A17.4.5.
	if q.typ != qp.UD {
		p := q.peer.Load()
		if p == nil {
			s.drop(&d.stats.dropNotReady, DropNotReady, rxMeta{b, from, to, tos, id, now}, pkt)
			return
		}
		if p.Addr().WithZone("") != from.Addr().Unmap().WithZone("") {
			s.drop(&d.stats.dropWrongPeer, DropWrongPeer, rxMeta{b, from, to, tos, id, now}, pkt)
			return
		}
	}
	if q.shard != s {
		d.stats.rxOffShard.Add(1)
	}
	if d.cfg.Tracer != nil {
		s.trace(rxMeta{b, from, to, tos, id, now}, pkt, "")
	}
	q.deliver(pkt, from, to, tos, &r.info, now)
	if k := len(r.touched); k == 0 || r.touched[k-1] != q {
		for _, t := range r.touched {
			if t == q {
				return
			}
		}
		r.touched = append(r.touched, q)
	}
}

// rxMeta is what the datapath knows of a received datagram besides its bytes parsed: for drop and
// trace.
type rxMeta struct {
	b    []byte
	from netip.AddrPort
	to   netip.Addr
	tos  uint8
	id   uint16
	now  time.Time
}

// drop counts a received packet the datapath drops, in c, and traces it.
//
//go:noinline
func (s *shard) drop(c *atomic.Uint64, why Drop, m rxMeta, pkt wire.Packet) {
	c.Add(1)
	s.trace(m, pkt, why)
}

// trace hands a received packet to the Tracer, if there is one: taken, or dropped for why.
//
//go:noinline
func (s *shard) trace(m rxMeta, pkt wire.Packet, why Drop) {
	t := s.d.cfg.Tracer
	if t == nil {
		return
	}
	s.rx.trace = TraceRecord{At: m.now, From: m.from, To: netip.AddrPortFrom(m.to, s.d.local.Port()), TOS: m.tos,
		IPID: m.id, Bytes: m.b, Packet: pkt, Drop: why}
	t.TracePacket(&s.rx.trace)
}

// lookup returns the QP numbered n, or nil. The QP the shard last found is checked first: a shard's
// packets mostly go to one QP at a time.
func (s *shard) lookup(n wire.QPN) *QP {
	if q := s.rx.last; q != nil && q.qpn == n && !q.gone.Load() {
		return q
	}
	q := s.d.lookup(n)
	if q != nil {
		s.rx.last = q
	}
	return q
}

func (d *Datapath) lookup(n wire.QPN) *QP {
	v, ok := d.qps.Load(n)
	if !ok {
		return nil
	}
	return v.(*QP)
}

// deliver runs a received packet through q's engine. The DCQCN notification point runs here too: a
// CE-marked packet may send a CNP back to its sender at once.
func (q *QP) deliver(pkt wire.Packet, from netip.AddrPort, to netip.Addr, tos uint8, info *qp.RxInfo, now time.Time) {
	d := q.d
	info.CE = tos&ecnMask == ecnCE
	if info.CE {
		d.stats.ceRcvd.Add(1)
		if q.np != nil && pkt.Opcode() != wire.CNP && q.np.OnCE(now) {
			q.sendCNP(pkt, from, now)
		}
	}
	if q.typ == qp.UD {
		fillGRH(&info.GRH, from.Addr(), to, tos, pkt.Len())
	}
	if f := q.notify.Load(); f != nil && q.notify.CompareAndSwap(f, nil) {
		(*f)()
	}
	q.mu.Lock()
	if !q.closed {
		q.eng.HandlePacket(now, pkt, info)
	}
	q.mu.Unlock()
}

// sendCNP sends a congestion notification packet to the QP that sent pkt: BTH opcode 0x81 with BECN,
// the sender's QPN, PSN 0 and 16 reserved bytes. IBTA Annex A17.9.3. For a request the sender is the
// QP's peer; for a response (an ACK or READ response marked on its way back) it is the same peer QP,
// whose requester is the one to slow down. CNPs go out with DSCP 48 and not ECN-capable, so that they
// are never marked themselves.
func (q *QP) sendCNP(pkt wire.Packet, from netip.AddrPort, now time.Time) {
	d := q.d
	var dest wire.QPN
	if deth := pkt.DETH(); deth != nil {
		dest = deth.SrcQP()
	} else {
		q.mu.Lock()
		dest = q.eng.Query().DestQPN
		q.mu.Unlock()
	}
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.CNP, PKey: wire.DefaultPKey, BECN: true, DestQP: dest}}
	// RoCEv2 packets go to the peer device's port (4791), whatever their source port: an RC or UC
	// QP's peer, a UD sender at this device's own.
	to := netip.AddrPortFrom(from.Addr(), d.local.Port())
	if p := q.peer.Load(); p != nil && q.typ != qp.UD {
		to = *p
	}
	p := q.port
	tb := getTxBatch()
	p.mu.Lock()
	out, err := wire.Append(tb.arena[:0], &f, nil)
	if err == nil {
		tb.arena = out
		src := netip.AddrPortFrom(d.local.Addr(), p.num)
		seal(out, src, to, 0)
		tb.msgs = append(tb.msgs, conn.Message{Buf: out, Addr: to, TOS: cnpTOS, SegSize: len(out)})
		d.stats.cnpSent.Add(1)
		if t := d.cfg.Tracer; t != nil {
			if pp, err := wire.Parse(out); err == nil {
				t.TracePacket(&TraceRecord{Sent: true, At: now, From: src, To: to, TOS: cnpTOS, Bytes: out, Packet: pp})
			}
		}
		p.flush(tb)
	}
	p.mu.Unlock()
	putTxBatch(tb)
}

// The ECN field of the IP TOS / traffic class byte. RFC 3168.
const (
	ecnMask = 0x03
	ecnECT0 = 0x02
	ecnCE   = 0x03
)

// cnpTOS is the TOS byte of CNPs: DSCP 48, as NVIDIA NICs send them, Not-ECT.
const cnpTOS = 48 << 2

// fillGRH builds the 40 bytes a UD receive buffer starts with: the IPv6 header, or 20 zero bytes and
// the IPv4 header. IBTA Annex A17.4.5.2.
func fillGRH(g *[40]byte, from, to netip.Addr, tos uint8, n int) {
	src, dst := from.Unmap(), to.Unmap()
	if src.Is4() && dst.Is4() {
		*g = [40]byte{}
		var h [20]byte
		ipv4Header(&h, src, dst, n, 0)
		h[1] = tos
		copy(g[20:], h[:])
		return
	}
	var h [40]byte
	ipv6Header(&h, from, to, n)
	copy(g[:], h[:])
}
