package goroce

import (
	"net/netip"
	"sync"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// inboxCap bounds the packets waiting for a shard; past it the receive loop drops and counts.
const inboxCap = 8192

// shard is a goroutine that owns queue pairs: it runs their engines on received packets, on timers
// and on posted work, and sends what they produce in batches.
//
// mu guards inbox, ready and queued flags; everything else belongs to the shard goroutine. Lock
// order: shard.mu, then never a QP's lock (a QP's lock may be held while taking shard.mu).
type shard struct {
	id   int
	dev  *Device
	wake chan struct{}

	mu    sync.Mutex
	inbox []rxItem
	ready []*QP

	// owned by the shard goroutine
	spare   []rxItem
	work    []*QP
	timers  timerHeap
	tx      []conn.Message
	txBufs  [][]byte
	txN     int
	rxInfo  qp.RxInfo
	pending []*QP // QPs that still had packets when the batch filled
}

func newShard(d *Device) *shard {
	b := d.conn.BatchSize()
	s := &shard{id: len(d.shards), dev: d, wake: make(chan struct{}, 1), tx: make([]conn.Message, b), txBufs: make([][]byte, b)}
	for i := range s.txBufs {
		s.txBufs[i] = make([]byte, 0, rxBufSize)
	}
	return s
}

// kick wakes the shard goroutine.
func (s *shard) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// enqueue hands a received packet to the shard; false means the inbox is full.
func (s *shard) enqueue(it rxItem) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.inbox) >= inboxCap {
		return false
	}
	s.inbox = append(s.inbox, it)
	return true
}

// markReady schedules q for the shard's next transmit round and wakes the shard.
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
		items := s.inbox
		s.inbox = s.spare[:0]
		s.work = append(s.work[:0], s.ready...)
		for _, q := range s.ready {
			q.queued = false
		}
		s.ready = s.ready[:0]
		s.mu.Unlock()

		now := d.clock.Now()
		for i := range items {
			s.deliver(now, &items[i])
			items[i] = rxItem{}
		}
		s.spare = items[:0]

		for s.timers.Len() > 0 && !s.timers[0].at.After(now) {
			e := s.timers.pop()
			q := e.qp
			if q.deadline != e.at {
				continue // rescheduled or cancelled since
			}
			q.deadline = time.Time{}
			q.mu.Lock()
			if !q.closed {
				q.eng.Advance(now)
			}
			q.mu.Unlock()
			s.addWork(q)
		}
		s.transmit(now)

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

func (s *shard) addWork(q *QP) {
	if !q.inWork {
		q.inWork = true
		s.work = append(s.work, q)
	}
}

// deliver runs a received packet through its QP's engine.
func (s *shard) deliver(now time.Time, it *rxItem) {
	q := it.qp
	info := &s.rxInfo
	info.CE = it.tos&3 == 3
	if q.typ == UD {
		s.fillGRH(it)
	}
	if t := s.dev.cfg.Tracer; t != nil {
		t.Packet(TraceEvent{Dir: Received, At: now, From: it.from, To: netip.AddrPortFrom(it.to, s.dev.local.Port()), Packet: it.pkt})
	}
	q.mu.Lock()
	if !q.closed {
		q.eng.HandlePacket(now, it.pkt, info)
	}
	q.mu.Unlock()
	s.dev.pool.put(it.buf)
	s.addWork(q)
}

// fillGRH builds the 40 bytes a UD receive buffer starts with: the IPv6 header, or 20 zero bytes and
// the IPv4 header. IBTA Annex A17.4.5.2.
func (s *shard) fillGRH(it *rxItem) {
	g := &s.rxInfo.GRH
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

// transmit pulls packets from every QP with work until none has any, sending them in batches.
func (s *shard) transmit(now time.Time) {
	for len(s.work) > 0 {
		work := s.work
		s.work = s.pending[:0]
		s.pending = work
		for _, q := range work {
			q.inWork = false
			more := s.drain(now, q)
			if more {
				s.addWork(q)
			} else {
				s.schedule(q)
			}
		}
		s.flush()
	}
}

// drain moves q's packets into the transmit batch; it reports true if q still has packets when the
// batch fills.
func (s *shard) drain(now time.Time, q *QP) bool {
	d := s.dev
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	for {
		if s.txN == len(s.tx) {
			s.flush()
		}
		buf := s.txBufs[s.txN][:0]
		out, tx, ok := q.eng.AppendPacket(now, buf)
		if !ok {
			return false
		}
		dst, ok := q.destination(tx)
		if !ok {
			d.stats.dropNoRoute.Add(1)
			continue
		}
		s.seal(out, dst)
		s.txBufs[s.txN] = out[:0]
		s.tx[s.txN] = conn.Message{Buf: out, Addr: dst, TOS: q.trafficClass(tx)}
		s.txN++
		if t := d.cfg.Tracer; t != nil {
			if p, err := wire.Parse(out); err == nil {
				t.Packet(TraceEvent{Dir: Sent, At: now, From: d.local, To: dst, Packet: p})
			}
		}
	}
}

// seal fills in the ICRC for the IP and UDP headers the kernel will put in front of the packet: the
// device's address and port, identification 0 with DF (IP_PMTUDISC_DO), and the peer's address.
func (s *shard) seal(pkt []byte, dst netip.AddrPort) {
	d := s.dev
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

// flush sends the transmit batch.
func (s *shard) flush() {
	if s.txN == 0 {
		return
	}
	d := s.dev
	for i := 0; i < s.txN; i++ {
		d.stats.txPackets.Add(1)
		d.stats.txBytes.Add(uint64(len(s.tx[i].Buf)))
	}
	sent := 0
	for sent < s.txN {
		n, err := d.conn.WriteBatch(s.tx[sent:s.txN])
		if err != nil || n == 0 {
			break // the socket is closing; what is not sent is lost like any packet
		}
		sent += n
	}
	s.txN = 0
}

// schedule files q's next deadline in the timer heap.
func (s *shard) schedule(q *QP) {
	q.mu.Lock()
	at := time.Time{}
	if !q.closed {
		at = q.eng.NextDeadline()
	}
	q.mu.Unlock()
	if at.Equal(q.deadline) {
		return
	}
	q.deadline = at
	if !at.IsZero() {
		s.timers.push(timerEntry{at: at, qp: q})
	}
}

// timerEntry is a QP's deadline in the heap. Entries are not removed when a deadline changes: a popped
// entry that no longer matches its QP's deadline is skipped.
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
