package datapath

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// QP is the datapath's side of a queue pair: its engine, the lock that guards it, where it lives (a
// shard for its timers and its received packets, a port for what it sends) and where its packets go.
//
// mu guards the engine and the fields below it; queued is guarded by the shard's mu.
type QP struct {
	d     *Datapath
	shard *shard
	port  *port
	typ   qp.Type
	qpn   wire.QPN
	srcTC uint8
	cc    congestion.Controller // the reaction point, if DCQCN is on; guarded by mu
	np    *congestion.NP        // the notification point, if DCQCN is on; used by one driver at a time
	peer  atomic.Pointer[netip.AddrPort]
	// peerGSO caches gsoPolicy.allowed for the peer: 0 unknown, 1 no, 2 yes.
	peerGSO atomic.Int32
	notify  atomic.Pointer[func()] // NotifyReceive's f, called by the next packet's handler
	gone    atomic.Bool            // Close has removed the QP from the datapath's table
	sendCQ  *CQ
	recvCQ  *CQ
	once    sync.Once

	mu        sync.Mutex
	eng       *qp.QP
	closed    bool
	scheduled time.Time // the deadline filed in the shard's heap, if any

	queued bool

	// Owner is QPConfig.Owner.
	Owner any
}

// QPConfig is what NewQP needs beyond the engine's configuration.
type QPConfig struct {
	// Engine configures the engine; NewQP fills in its QPN and its CQs, which come from SendCQ and
	// RecvCQ.
	Engine         qp.Config
	SendCQ, RecvCQ *CQ
	// TrafficClass is the TOS byte of the QP's packets.
	TrafficClass uint8
	// Congestion, if set, paces the requester (it is also Engine.Pacer) and is reported by Rate.
	Congestion congestion.Controller
	// NotificationPoint turns on the DCQCN notification point: CNPs for CE-marked packets.
	NotificationPoint bool
	// Owner is the API's object for the QP, for the events it reports.
	Owner any
}

// NewQP creates a QP in RESET on a shard chosen round robin, with a QPN that steers to it.
func (d *Datapath) NewQP(c QPConfig) (*QP, error) {
	if d.closing.Load() {
		return nil, ErrClosed
	}
	s, qpn, err := d.placeQP()
	if err != nil {
		return nil, err
	}
	p, err := d.portFor(qpn)
	if err != nil {
		return nil, err
	}
	q := &QP{d: d, shard: s, port: p, typ: c.Engine.Type, qpn: qpn, srcTC: c.TrafficClass, cc: c.Congestion,
		sendCQ: c.SendCQ, recvCQ: c.RecvCQ, Owner: c.Owner}
	c.Engine.QPN = qpn
	c.Engine.SendCQ, c.Engine.RecvCQ = c.SendCQ.cq, c.RecvCQ.cq
	if d.cfg.OnEvent != nil {
		c.Engine.OnEvent = q.event
	}
	eng, err := qp.New(c.Engine)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	q.eng = eng
	if c.NotificationPoint {
		q.np = congestion.NewNP(d.cfg.CNPInterval)
	}
	c.SendCQ.attach(s)
	c.RecvCQ.attach(s)
	d.nqps.Add(1)
	d.qps.Store(qpn, q)
	return q, nil
}

// event passes an engine's event on, with the datapath's CQ.
func (q *QP) event(e qp.Event, cq *qp.CQ) {
	ev := Event{Kind: e, QP: q}
	switch cq {
	case nil:
	case q.sendCQ.cq:
		ev.CQ = q.sendCQ
	case q.recvCQ.cq:
		ev.CQ = q.recvCQ
	}
	q.d.cfg.OnEvent(ev)
}

// QPN returns the queue pair number.
func (q *QP) QPN() wire.QPN { return q.qpn }

// Type returns the QP type.
func (q *QP) Type() qp.Type { return q.typ }

// PostSend hands wr to the engine and sends what it can send now from the calling goroutine.
func (q *QP) PostSend(wr *qp.SendWR) error {
	now := q.d.clock.Now()
	if err := q.Enqueue(now, wr); err != nil {
		return err
	}
	q.Flush(now)
	return nil
}

// Enqueue hands wr to the engine at now (Datapath.Now) without sending anything: Flush does, once for
// several. A post reads the clock once for all its work requests and its Flush: each reading costs
// about 65 ns on a virtual machine's vDSO, a good part of a small SEND's path.
func (q *QP) Enqueue(now time.Time, wr *qp.SendWR) error {
	if q.d.closing.Load() {
		return ErrClosed
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrClosed
	}
	return q.eng.PostSend(now, wr)
}

// Flush sends what the engine can send at now, from the calling goroutine: a NIC's doorbell.
func (q *QP) Flush(now time.Time) { q.send(now) }

// PostRecv hands wr to the engine.
func (q *QP) PostRecv(wr *qp.RecvWR) error {
	if q.d.closing.Load() {
		return ErrClosed
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrClosed
	}
	return q.eng.PostRecv(wr)
}

// Modify changes the engine's attributes and state (ibv_modify_qp); peer, when valid, becomes the
// address an RC or UC QP's packets go to and the only one it takes packets from.
func (q *QP) Modify(a *qp.Attr, mask qp.AttrMask, peer netip.AddrPort) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if mask&qp.AttrState != 0 && (a.State == qp.StateErr || a.State == qp.StateReset) && q.eng.State() != a.State {
		// ACKs waiting for company (the engine's AckDelay) answer requests whose completions the
		// program may already hold: they leave before the QP stops, as Close lets them, or the peer
		// resends into a QP that drops everything and ends with its retries exhausted. rxe, which
		// acknowledges at once, never holds one back.
		q.eng.ReleaseAcks()
		q.mu.Unlock()
		q.send(q.d.clock.Now())
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return ErrClosed
		}
	}
	err := q.eng.Modify(q.d.clock.Now(), a, mask)
	if err == nil && peer.IsValid() {
		q.setPeer(peer)
	}
	q.mu.Unlock()
	if err == nil {
		q.shard.markReady(q)
	}
	return err
}

// Connect moves the QP from RESET to RTS with p (see qp.QP.Connect); peer as for Modify.
func (q *QP) Connect(p *qp.ConnectParams, peer netip.AddrPort) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	err := q.eng.Connect(q.d.clock.Now(), p)
	if err == nil && q.typ != qp.UD && peer.IsValid() {
		q.setPeer(peer)
	}
	q.mu.Unlock()
	if err == nil {
		q.shard.markReady(q)
	}
	return err
}

func (q *QP) setPeer(a netip.AddrPort) {
	p := netip.AddrPortFrom(q.d.scoped(a.Addr().Unmap()), a.Port())
	if p.Port() == 0 {
		p = netip.AddrPortFrom(p.Addr(), wire.UDPPort)
	}
	q.peer.Store(&p)
	q.peerGSO.Store(0)
}

// gsoTo reports whether packets to dst may share GSO writes, remembering the answer for the peer.
func (q *QP) gsoTo(dst netip.AddrPort) bool {
	if q.typ == qp.UD {
		return q.d.gso.allowed(dst.Addr())
	}
	switch q.peerGSO.Load() {
	case 1:
		return false
	case 2:
		return true
	}
	ok := q.d.gso.allowed(dst.Addr())
	v := int32(1)
	if ok {
		v = 2
	}
	q.peerGSO.Store(v)
	return ok
}

// Query returns the engine's attributes.
func (q *QP) Query() qp.Attr {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.eng.Query()
}

// State returns the engine's state.
func (q *QP) State() qp.State {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.eng.State()
}

// Counters returns the engine's counters.
func (q *QP) Counters() qp.Counters {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.eng.Counters()
}

// Rate returns the rate the QP's congestion controller allows, in bits per second, and false if it has
// none.
func (q *QP) Rate() (float64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cc == nil {
		return 0, false
	}
	return q.cc.Rate(), true
}

// Close destroys the QP: ACKs still waiting for company leave first, then outstanding work requests
// complete with WR_FLUSH_ERR and packets for its QPN are dropped from then on. It is idempotent.
func (q *QP) Close() {
	q.once.Do(func() {
		d := q.d
		q.mu.Lock()
		q.eng.ReleaseAcks()
		q.mu.Unlock()
		q.send(d.clock.Now()) // the socket is still open, also when the whole datapath is closing
		q.gone.Store(true)
		d.qps.Delete(q.qpn)
		d.nqps.Add(-1)
		q.mu.Lock()
		_ = q.eng.Modify(d.clock.Now(), &qp.Attr{State: qp.StateErr}, qp.AttrState)
		q.closed = true
		q.mu.Unlock()
	})
}
