package goroce

import (
	"net/netip"
	"sync"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// The datapath runs a QP's engine where the work arrives, under the QP's lock, and sends what the
// engine produces right there, in a batch:
//
//   - the receive loop handles each packet and then pumps the QPs it touched, so an ACK, a READ
//     response or the next window of a WRITE leaves without a goroutine hand-off;
//   - PostSend pumps the QP from the caller's goroutine, like ringing a NIC's doorbell;
//   - a shard goroutine owns the QPs' timers (retransmission, RNR waits, pacing) and runs the engines
//     when one comes due.
//
// Like a hardware NIC, then, the engine of a QP is never run by two goroutines at once (its lock
// serializes them), and nothing waits for a goroutine to wake up on the latency path.
//
// Packets must leave in the order their engine built them: a QP's packets built by two goroutines and
// sent by each in its own batch could overtake one another on the wire, and every overtaken PSN costs
// a NAK and a go-back-N retransmission. So building and sending happen under the device's txMu, from
// the first pump to the flush: the socket serializes sends anyway.

// txBatch collects packets for one WriteBatch. Each goroutine that sends has its own.
type txBatch struct {
	msgs []conn.Message
	bufs [][]byte
	n    int
}

func newTxBatch(size int) *txBatch {
	b := &txBatch{msgs: make([]conn.Message, size), bufs: make([][]byte, size)}
	for i := range b.bufs {
		b.bufs[i] = make([]byte, 0, rxBufSize)
	}
	return b
}

// pump moves q's packets into tb, flushing tb whenever it fills, until the engine has nothing more to
// send now; then it makes sure q's next deadline is in its shard's timer heap. The caller holds
// d.txMu, from before its first pump to after its flush, and not q's lock.
func (d *Device) pump(q *QP, tb *txBatch) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	now := d.clock.Now()
	for {
		if tb.n == len(tb.msgs) {
			d.flush(tb)
		}
		out, tx, ok := q.eng.AppendPacket(now, tb.bufs[tb.n][:0])
		if !ok {
			break
		}
		dst, ok := q.destination(tx)
		if !ok {
			d.stats.dropNoRoute.Add(1)
			continue
		}
		d.seal(out, dst)
		tb.bufs[tb.n] = out[:0]
		tb.msgs[tb.n] = conn.Message{Buf: out, Addr: dst, TOS: q.trafficClass(tx)}
		tb.n++
		if t := d.cfg.Tracer; t != nil {
			if p, err := wire.Parse(out); err == nil {
				t.Packet(TraceEvent{Dir: Sent, At: now, From: d.local, To: dst, Packet: p})
			}
		}
	}
	// The shard's heap holds at most one live deadline per QP, q.scheduled. A later deadline than
	// the scheduled one needs nothing: when the scheduled one fires, the shard finds nothing due and
	// files the new one. An earlier one, or one where none is scheduled, needs the shard.
	next := q.eng.NextDeadline()
	wake := !next.IsZero() && (q.scheduled.IsZero() || next.Before(q.scheduled))
	q.mu.Unlock()
	if wake {
		q.shard.markReady(q)
	}
}

// seal fills in the ICRC for the IP and UDP headers the kernel will put in front of the packet: the
// device's address and port, identification 0 with DF (IP_PMTUDISC_DO), and the peer's address.
func (d *Device) seal(pkt []byte, dst netip.AddrPort) {
	var udp [8]byte
	udpTemplate(&udp, d.local.Port(), dst.Port(), len(pkt))
	src, to := d.local.Addr(), dst.Addr()
	if src.Is4() {
		var ip [20]byte
		ipv4Template(&ip, src, to.Unmap(), len(pkt))
		_ = wire.SetICRC(ip[:], udp[:], pkt)
		return
	}
	var ip [40]byte
	ipv6Template(&ip, src, to, len(pkt))
	_ = wire.SetICRC(ip[:], udp[:], pkt)
}

// flush sends tb's packets. The caller holds d.txMu.
func (d *Device) flush(tb *txBatch) {
	if tb.n == 0 {
		return
	}
	for i := 0; i < tb.n; i++ {
		d.stats.txPackets.Add(1)
		d.stats.txBytes.Add(uint64(len(tb.msgs[i].Buf)))
	}
	for sent := 0; sent < tb.n; {
		n, err := d.conn.WriteBatch(tb.msgs[sent:tb.n])
		if err != nil || n == 0 {
			break // the socket is closing; what is not sent is lost like any packet
		}
		sent += n
	}
	tb.n = 0
}

// txPool lends batches to goroutines that send from PostSend.
var txPool sync.Pool

func (d *Device) getTxBatch() *txBatch {
	if tb, ok := txPool.Get().(*txBatch); ok && len(tb.msgs) == d.conn.BatchSize() {
		return tb
	}
	return newTxBatch(d.conn.BatchSize())
}

func (d *Device) putTxBatch(tb *txBatch) { txPool.Put(tb) }

// send pumps q and sends what it produced, from the calling goroutine, in order with everything
// else the device sends.
func (d *Device) send(q *QP) {
	tb := d.getTxBatch()
	d.txMu.Lock()
	d.pump(q, tb)
	d.flush(tb)
	d.txMu.Unlock()
	d.putTxBatch(tb)
}

// shard is a goroutine that keeps its QPs' timers: it runs an engine when its deadline comes, and
// files the deadlines the datapath reports.
//
// mu guards ready and each QP's queued flag; timers belong to the shard goroutine. Lock order: a QP's
// lock before shard.mu.
type shard struct {
	id   int
	dev  *Device
	wake chan struct{}
	tx   *txBatch

	mu    sync.Mutex
	ready []*QP

	work   []*QP
	timers timerHeap
}

func newShard(d *Device) *shard {
	return &shard{id: len(d.shards), dev: d, wake: make(chan struct{}, 1), tx: newTxBatch(d.conn.BatchSize())}
}

// kick wakes the shard goroutine.
func (s *shard) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// markReady asks the shard to run q's engine and file its deadline.
func (s *shard) markReady(q *QP) {
	s.mu.Lock()
	if !q.queued {
		q.queued = true
		s.ready = append(s.ready, q)
	}
	s.mu.Unlock()
	s.kick()
}

func (s *shard) run() {
	d := s.dev
	defer d.wg.Done()
	timer := d.clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		s.work = append(s.work[:0], s.ready...)
		for _, q := range s.ready {
			q.queued = false
		}
		clear(s.ready)
		s.ready = s.ready[:0]
		s.mu.Unlock()

		now := d.clock.Now()
		for s.timers.Len() > 0 && !s.timers[0].at.After(now) {
			e := s.timers.pop()
			q := e.qp
			q.mu.Lock()
			live := q.scheduled.Equal(e.at)
			if live {
				q.scheduled = time.Time{}
				if !q.closed {
					q.eng.Advance(now)
				}
			}
			q.mu.Unlock()
			if live {
				s.work = append(s.work, q)
			}
		}
		d.txMu.Lock()
		for _, q := range s.work {
			d.pump(q, s.tx)
		}
		d.flush(s.tx)
		d.txMu.Unlock()
		for _, q := range s.work {
			s.schedule(q)
		}
		clear(s.work)

		if s.timers.Len() > 0 {
			timer.Reset(max(s.timers[0].at.Sub(d.clock.Now()), 0))
		} else {
			timer.Stop()
		}
		select {
		case <-s.wake:
		case <-timer.C():
		case <-d.done:
			return
		}
	}
}

// schedule files q's next deadline in the heap unless an earlier or equal one is filed already.
func (s *shard) schedule(q *QP) {
	q.mu.Lock()
	at := time.Time{}
	if !q.closed {
		at = q.eng.NextDeadline()
	}
	file := !at.IsZero() && (q.scheduled.IsZero() || at.Before(q.scheduled))
	if file {
		q.scheduled = at
	}
	q.mu.Unlock()
	if file {
		s.timers.push(timerEntry{at: at, qp: q})
	}
}

// deliver runs a received packet through its QP's engine. It runs on the receive loop, and so does the
// DCQCN notification point: a CE-marked packet may send a CNP back to its sender right away, in tx.
func (d *Device) deliver(it *rxItem, info *qp.RxInfo, tx *txBatch) {
	q := it.qp
	info.CE = it.tos&3 == ecnCE
	if info.CE {
		d.stats.ceRcvd.Add(1)
		if q.np != nil && it.pkt.Opcode() != wire.CNP && q.np.OnCE(d.clock.Now()) {
			d.sendCNP(it, tx)
		}
	}
	if q.typ == UD {
		fillGRH(&info.GRH, it)
	}
	now := d.clock.Now()
	if t := d.cfg.Tracer; t != nil {
		t.Packet(TraceEvent{Dir: Received, At: now, From: it.from, To: netip.AddrPortFrom(it.to, d.local.Port()), Packet: it.pkt})
	}
	q.mu.Lock()
	if !q.closed {
		q.eng.HandlePacket(now, it.pkt, info)
	}
	q.mu.Unlock()
}

// sendCNP sends a congestion notification packet to the QP that sent it: BTH opcode 0x81 with BECN,
// the sender's QPN, PSN 0 and 16 reserved bytes. IBTA Annex A17.9.3. For a request the sender is the
// QP's peer; for a response (an ACK or READ response marked on its way back) it is the same peer QP,
// whose responder paced nothing but whose requester is the one to slow down. CNPs go out with DSCP 48
// and not ECN-capable, so that they are never marked themselves.
func (d *Device) sendCNP(it *rxItem, tx *txBatch) {
	q := it.qp
	var dest wire.QPN
	if deth := it.pkt.DETH(); deth != nil {
		dest = deth.SrcQP()
	} else {
		q.mu.Lock()
		dest = q.eng.Query().DestQPN
		q.mu.Unlock()
	}
	if tx.n == len(tx.msgs) {
		d.txMu.Lock()
		d.flush(tx)
		d.txMu.Unlock()
	}
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.CNP, PKey: wire.DefaultPKey, BECN: true, DestQP: dest}}
	out, err := wire.Append(tx.bufs[tx.n][:0], &f, nil)
	if err != nil {
		return
	}
	dst := it.from
	d.seal(out, dst)
	tx.bufs[tx.n] = out[:0]
	tx.msgs[tx.n] = conn.Message{Buf: out, Addr: dst, TOS: cnpTOS}
	tx.n++
	d.stats.cnpSent.Add(1)
	if t := d.cfg.Tracer; t != nil {
		if p, err := wire.Parse(out); err == nil {
			t.Packet(TraceEvent{Dir: Sent, At: d.clock.Now(), From: d.local, To: dst, Packet: p})
		}
	}
}

// cnpTOS is the TOS byte of CNPs: DSCP 48, as NVIDIA NICs send them, Not-ECT.
const cnpTOS = 48 << 2

// fillGRH builds the 40 bytes a UD receive buffer starts with: the IPv6 header, or 20 zero bytes and
// the IPv4 header. IBTA Annex A17.4.5.2.
func fillGRH(g *[40]byte, it *rxItem) {
	src, dst := it.from.Addr().Unmap(), it.to.Unmap()
	if src.Is4() && dst.Is4() {
		*g = [40]byte{}
		var h [20]byte
		ipv4Template(&h, src, dst, it.pkt.Len())
		h[1] = it.tos
		copy(g[20:], h[:])
		return
	}
	var h [40]byte
	ipv6Template(&h, src, dst, it.pkt.Len())
	copy(g[:], h[:])
}

// timerEntry is a QP's deadline in the heap. Entries are not removed when a deadline changes: a popped
// entry that no longer matches its QP's scheduled deadline is skipped.
type timerEntry struct {
	at time.Time
	qp *QP
}

// timerHeap is a binary min-heap of deadlines, written out rather than through container/heap so that
// scheduling a timer does not allocate.
type timerHeap []timerEntry

func (h timerHeap) Len() int { return len(h) }

func (h *timerHeap) push(e timerEntry) {
	*h = append(*h, e)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if !a[i].at.Before(a[p].at) {
			break
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func (h *timerHeap) pop() timerEntry {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a[last] = timerEntry{}
	a = a[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a[l].at.Before(a[m].at) {
			m = l
		}
		if r < len(a) && a[r].at.Before(a[m].at) {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}
