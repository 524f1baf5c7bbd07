package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// HostConfig configures a host. The two hooks are where congestion control plugs in.
type HostConfig struct {
	Name string

	// Pacer, if set, gives each queue pair created on the host its rate controller (qp.Config.Pacer):
	// a DCQCN reaction point, say. A Pacer that also implements qp.CNPReceiver sees the CNPs that
	// arrive for its queue pair.
	Pacer func(ep *Endpoint) qp.Pacer

	// CNP, if set, is asked for each CE-marked packet a queue pair of this host receives whether to send
	// a congestion notification packet to the queue pair that sent it: the notification point, with
	// whatever rate limit it keeps. CNPs jump the host's transmit queue.
	CNP func(now time.Time, ep *Endpoint, p wire.Packet) bool
}

// HostStats counts a host's receive-side drops and its CNPs.
type HostStats struct {
	RxPackets uint64
	Drops     [numDropReasons]uint64
	CNPsSent  uint64
}

// Host is a simulated machine with one NIC port. It runs real qp engines the way goroce's device does:
// received packets go through wire.ParseIP (lengths, opcode, ICRC) and are demultiplexed by destination
// QPN to HandlePacket; engine deadlines run Advance; whenever the wire is free the NIC pulls the next
// packet from its queue pairs with AppendPacket, round robin, and seals its ICRC.
type Host struct {
	s    *Sim
	idx  int
	cfg  HostConfig
	addr uint32

	Name  string
	Port  *Port
	Mem   *mr.Table
	PD    *mr.PD
	Stats HostStats

	qpnBase  wire.QPN
	eps      []*Endpoint // by QPN - qpnBase
	active   []*Endpoint // queue pairs that may have a packet to send
	ctrl     []*packet   // CNPs waiting for the wire
	nextIOVA uint64
	rx       qp.RxInfo
}

// firstQPN is the lowest QPN a host hands out (QPN 0 and 1 are the special QPs). Each host starts at a
// random QPN above it, as devices do, which gives ECMP's hash of the UDP source port some entropy.
const firstQPN = 0x11

// AddHost adds a host. It needs one link to a switch or another host before it can send.
func (s *Sim) AddHost(cfg HostConfig) *Host {
	// Keys derive from the run's seed and the host's index (not from the run's random stream, which
	// scenarios' outcomes depend on), so traces replay bit for bit.
	var seed [32]byte
	kr := rand.New(rand.NewPCG(s.seed, uint64(len(s.Hosts))^0x6b657973))
	for i := range seed {
		seed[i] = byte(kr.Uint32())
	}
	h := &Host{s: s, idx: len(s.Hosts), cfg: cfg, Name: cfg.Name, Mem: mr.NewTableSeeded(seed), nextIOVA: 1 << 32}
	if h.Name == "" {
		h.Name = fmt.Sprintf("h%d", h.idx)
	}
	h.addr = hostAddr(h.idx)
	h.qpnBase = wire.QPN(firstQPN + s.rng.IntN(1<<16))
	h.PD = h.Mem.AllocPD()
	s.Hosts = append(s.Hosts, h)
	return h
}

// NodeName returns the host's name.
func (h *Host) NodeName() string { return h.Name }

func (h *Host) attach(p *Port) {
	if h.Port != nil {
		panic("sim: a host has one port")
	}
	p.host = h
	h.Port = p
}

// Addr returns the host's IPv4 address inside the simulation.
func (h *Host) Addr() [4]byte {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], h.addr)
	return a
}

// Register allocates and registers n bytes of memory at a deterministic IOVA, so that traces of one
// seed show the same addresses.
func (h *Host) Register(n int, access mr.Access) (*mr.Region, error) {
	r, err := h.Mem.Register(h.PD, make([]byte, n), access, mr.WithIOVA(h.nextIOVA))
	if err == nil {
		h.nextIOVA += uint64(n+4095) &^ 4095
	}
	return r, err
}

// QPOptions are the attributes a connection's queue pairs are created and connected with.
type QPOptions struct {
	MTU         wire.MTU // path MTU; 0 means 4096
	Timeout     uint8    // local ACK timeout code, 4.096 us * 2^Timeout; 0 means 14 (67 ms)
	RetryCnt    uint8    // 1..7; 0 means 7
	RNRRetry    uint8    // 1..7, 7 retries forever; 0 means 7
	MinRNRTimer uint8
	RdAtomic    uint8 // READs and atomics outstanding, both ways; 0 means 16
	SendDepth   int   // send queue depth; 0 means 256
	RecvDepth   int   // receive queue depth; 0 means 256
	CQDepth     int   // each CQ; 0 means 4096
	ECN         bool  // send ECT(0), so switches may mark CE
	Access      mr.Access
	TailProbe   bool // the requester's tail-loss probe (qp.Config.TailProbe), as goroce's device runs it
}

func (o *QPOptions) defaults() {
	if o.MTU == 0 {
		o.MTU = wire.MTU4096
	}
	if o.Timeout == 0 {
		o.Timeout = 14
	}
	if o.RetryCnt == 0 {
		o.RetryCnt = 7
	}
	if o.RNRRetry == 0 {
		o.RNRRetry = 7
	}
	if o.RdAtomic == 0 {
		o.RdAtomic = 16
	}
	if o.SendDepth == 0 {
		o.SendDepth = 256
	}
	if o.RecvDepth == 0 {
		o.RecvDepth = 256
	}
	if o.CQDepth == 0 {
		o.CQDepth = 4096
	}
	if o.Access == 0 {
		o.Access = mr.LocalWrite | mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic
	}
}

// EndpointStats counts one queue pair's packets as the host saw them.
type EndpointStats struct {
	TxPackets, TxBytes uint64
	RxPackets          uint64
	RxPayload          uint64 // payload bytes of received packets, duplicates included
	Retransmits        uint64 // request packets sent at or behind a PSN already sent
	CE                 uint64 // received packets marked Congestion Experienced
	CNPsSent           uint64
	CNPsRcvd           uint64
}

// Endpoint is one queue pair on a host, with its CQs, connected to a Peer endpoint.
type Endpoint struct {
	Host   *Host
	QP     *qp.QP
	SendCQ *qp.CQ
	RecvCQ *qp.CQ
	Peer   *Endpoint
	Sport  uint16 // UDP source port of its packets
	ECN    bool
	Stats  EndpointStats

	// RP is the queue pair's DCQCN reaction point and NP its notification point, when the host runs
	// DCQCN (WithDCQCN); nil otherwise. The NP is made at the first CE-marked packet.
	RP *congestion.DCQCN
	NP *congestion.NP

	// OnCompletion, if set, is called with every completion of the queue pair, send and receive, as
	// soon as the engine produces it. It may post work requests.
	OnCompletion func(ep *Endpoint, wc *qp.Completion)

	// RetransmitMismatch, with Sim.VerifyRetransmits set, describes the first request packet that was
	// sent again with a PSN it had carried different contents under; "" if none.
	RetransmitMismatch string
	sent               map[wire.PSN]sentRecord

	gidx       int32
	flow       int32
	delivering bool
	wcs        [16]qp.Completion
	timerAt    Time
	advancedAt Time // when timer last ran Advance
	active     bool
	sentAny    bool
	maxPSN     wire.PSN
}

// ErrNotConnected reports hosts that have no port yet.
var ErrNotConnected = errors.New("sim: host has no link")

// ConnectRC creates an RC queue pair on each of a and b and connects them, as ibv_rc_pingpong does,
// with initial PSNs drawn from the run's random source.
func (s *Sim) ConnectRC(a, b *Host, o QPOptions) (*Endpoint, *Endpoint, error) {
	o.defaults()
	ea, err := a.newEndpoint(o)
	if err != nil {
		return nil, nil, err
	}
	eb, err := b.newEndpoint(o)
	if err != nil {
		return nil, nil, err
	}
	ea.Peer, eb.Peer = eb, ea
	ea.Sport = UDPSourcePort(ea.QP.QPN(), eb.QP.QPN())
	eb.Sport = ea.Sport
	pa, pb := wire.PSN(s.rng.Uint32N(1<<24)), wire.PSN(s.rng.Uint32N(1<<24))
	if err := connectQP(s.now, ea.QP, eb.QP.QPN(), &o, pa, pb); err != nil {
		return nil, nil, err
	}
	if err := connectQP(s.now, eb.QP, ea.QP.QPN(), &o, pb, pa); err != nil {
		return nil, nil, err
	}
	return ea, eb, nil
}

func (h *Host) newEndpoint(o QPOptions) (*Endpoint, error) {
	s := h.s
	ep := &Endpoint{Host: h, SendCQ: qp.NewCQ(o.CQDepth), RecvCQ: qp.NewCQ(o.CQDepth), ECN: o.ECN,
		gidx: int32(len(s.eps)), flow: -1}
	cfg := qp.Config{Type: qp.RC, QPN: h.qpnBase + wire.QPN(len(h.eps)), PD: h.PD, Memory: h.Mem,
		SendCQ: ep.SendCQ, RecvCQ: ep.RecvCQ, MaxSendWR: o.SendDepth, MaxRecvWR: o.RecvDepth,
		MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 256, TailProbe: o.TailProbe}
	if h.cfg.Pacer != nil {
		cfg.Pacer = h.cfg.Pacer(ep)
	}
	q, err := qp.New(cfg)
	if err != nil {
		return nil, err
	}
	ep.QP = q
	h.eps = append(h.eps, ep)
	s.eps = append(s.eps, ep)
	return ep, nil
}

func connectQP(now Time, q *qp.QP, dest wire.QPN, o *QPOptions, sq, rq wire.PSN) error {
	return q.Connect(engineTime(now), &qp.ConnectParams{AccessFlags: o.Access, PathMTU: o.MTU, DestQPN: dest,
		RQPSN: rq, SQPSN: sq, Timeout: o.Timeout, RetryCnt: o.RetryCnt, RNRRetry: o.RNRRetry,
		MinRNRTimer: o.MinRNRTimer, RdAtomic: o.RdAtomic})
}

// PostSend posts a send work request at the current virtual time and lets the NIC send it.
func (ep *Endpoint) PostSend(wr *qp.SendWR) error {
	err := ep.QP.PostSend(engineTime(ep.Host.s.now), wr)
	ep.touched()
	return err
}

// PostRecv posts a receive work request.
func (ep *Endpoint) PostRecv(wr *qp.RecvWR) error {
	err := ep.QP.PostRecv(wr)
	ep.touched()
	return err
}

// touched runs after anything that may have changed the engine: it delivers completions, re-arms the
// deadline and wakes the transmitter.
func (ep *Endpoint) touched() {
	h := ep.Host
	if ep.OnCompletion != nil && !ep.delivering {
		// A handler may post work, which comes back here: the outer call keeps polling until both
		// queues are empty, and the inner one leaves the completions to it.
		ep.delivering = true
		for more := true; more; {
			more = false
			for _, cq := range [2]*qp.CQ{ep.SendCQ, ep.RecvCQ} {
				n := cq.Poll(ep.wcs[:])
				for i := 0; i < n; i++ {
					ep.OnCompletion(ep, &ep.wcs[i])
				}
				more = more || n > 0
			}
		}
		ep.delivering = false
	}
	ep.arm()
	if !ep.active {
		ep.active = true
		h.active = append(h.active, ep)
	}
	if h.Port != nil {
		h.Port.kick()
	}
}

// arm schedules the engine's next deadline. The engine runs its timers only in Advance, so a deadline
// that passed while the queue pair waited its turn for the port (as a local ACK timeout can while other
// queue pairs fill the link) runs at once, though only once per instant: a deadline Advance left in
// the past asks for nothing.
func (ep *Endpoint) arm() {
	s := ep.Host.s
	d := fromEngine(ep.QP.NextDeadline())
	if d == 0 {
		return
	}
	if d <= s.now {
		if ep.advancedAt == s.now {
			return
		}
		d = s.now
	}
	if ep.timerAt == 0 || d < ep.timerAt {
		ep.timerAt = d
		s.schedule(d, evTimer, ep.gidx, nil, int64(d))
	}
}

// timer runs the engine's deadline that was armed for at.
func (ep *Endpoint) timer(at Time) {
	if at != ep.timerAt {
		return // superseded by an earlier deadline
	}
	ep.timerAt = 0
	ep.advancedAt = ep.Host.s.now
	ep.QP.Advance(engineTime(ep.Host.s.now))
	ep.touched()
}

// pull puts the next packet on the wire: a waiting CNP, else the next queue pair's, round robin.
func (h *Host) pull(p *Port) {
	s := h.s
	if len(h.ctrl) > 0 {
		k := h.ctrl[0]
		copy(h.ctrl, h.ctrl[1:])
		h.ctrl = h.ctrl[:len(h.ctrl)-1]
		p.transmit(k)
		return
	}
	now := engineTime(s.now)
	for len(h.active) > 0 {
		ep := h.active[0]
		k := s.newPacket()
		out, tx, ok := ep.QP.AppendPacket(now, k.buf[:headerRoom])
		if !ok {
			s.freePacket(k)
			copy(h.active, h.active[1:])
			h.active[len(h.active)-1] = nil
			h.active = h.active[:len(h.active)-1]
			ep.active = false
			ep.arm()
			continue
		}
		// round robin: the queue pair goes to the back of the line
		copy(h.active, h.active[1:])
		h.active[len(h.active)-1] = ep
		k.buf = out
		peer := h.peerAddr(ep, tx)
		tos := uint8(0)
		if ep.ECN {
			tos = ecnECT0
		}
		frame(k.buf, h.addr, peer, ep.Sport, tos)
		s.nextID++
		k.id, k.flow = s.nextID, ep.flow
		ep.count(k)
		s.trace(TraceSend, h.Name, DropNone, k)
		p.transmit(k)
		return
	}
}

// peerAddr returns the address of the host an RC packet goes to.
func (h *Host) peerAddr(ep *Endpoint, tx qp.Tx) uint32 {
	if ep.Peer != nil {
		return ep.Peer.Host.addr
	}
	return 0
}

// count updates the send statistics: a request packet at or behind the highest PSN sent is a
// retransmission.
func (ep *Endpoint) count(k *packet) {
	ep.Stats.TxPackets++
	ep.Stats.TxBytes += uint64(k.ipLen())
	b := wire.BTH(k.transport())
	if b.Opcode().Info().Response {
		return
	}
	psn := b.PSN()
	if ep.Host.s.VerifyRetransmits {
		ep.verify(psn, k.transport())
	}
	if ep.sentAny && !ep.maxPSN.Before(psn) {
		ep.Stats.Retransmits++
		return
	}
	ep.sentAny, ep.maxPSN = true, psn
}

// verify checks that a request packet is the same packet every time its PSN is sent: a retransmission
// must repeat the original's opcode, headers and payload (only AckReq may differ).
func (ep *Endpoint) verify(psn wire.PSN, t []byte) {
	h := uint64(14695981039346656037)
	for i, c := range t[:len(t)-wire.ICRCLen] {
		if i == 8 {
			c &^= 0x80 // AckReq
		}
		h = (h ^ uint64(c)) * 1099511628211
	}
	if ep.sent == nil {
		ep.sent = make(map[wire.PSN]sentRecord)
	}
	old, ok := ep.sent[psn]
	if !ok {
		ep.sent[psn] = sentRecord{hash: h, op: wire.Opcode(t[0])}
		return
	}
	if old.hash != h && ep.RetransmitMismatch == "" {
		ep.RetransmitMismatch = fmt.Sprintf("request psn %#06x sent first as %v, then as a different %v",
			uint32(psn), old.op.Info().Name, wire.Opcode(t[0]).Info().Name)
	}
}

type sentRecord struct {
	hash uint64
	op   wire.Opcode
}

// receive runs a packet that arrived at the host through the datapath checks and into its queue pair.
func (h *Host) receive(k *packet) {
	s := h.s
	h.Stats.RxPackets++
	f, err := wire.ParseIP(k.buf)
	switch {
	case errors.Is(err, wire.ErrICRC):
		h.drop(k, DropICRC)
		return
	case err != nil || !ipChecksumOK(k.buf[:ipv4HeaderLen]):
		h.drop(k, DropMalformed)
		return
	}
	i := int(f.Packet.BTH().DestQP()) - int(h.qpnBase)
	if i < 0 || i >= len(h.eps) {
		h.drop(k, DropNoQP)
		return
	}
	ep := h.eps[i]
	s.trace(TraceRecv, h.Name, DropNone, k)
	ep.Stats.RxPackets++
	ep.Stats.RxPayload += uint64(f.Packet.PayloadLen())
	ce := k.tos()&ecnMask == ecnCE
	h.rx.CE = ce
	now := engineTime(s.now)
	if f.Packet.Opcode() == wire.CNP {
		ep.Stats.CNPsRcvd++
	}
	ep.QP.HandlePacket(now, f.Packet, &h.rx)
	if ce {
		ep.Stats.CE++
		if h.cfg.CNP != nil && !f.Packet.Info().Response && f.Packet.Opcode() != wire.CNP && ep.Peer != nil &&
			h.cfg.CNP(now, ep, f.Packet) {
			h.sendCNP(ep)
		}
	}
	s.freePacket(k)
	ep.touched()
}

func (h *Host) drop(k *packet, r DropReason) {
	h.Stats.Drops[r]++
	h.s.trace(TraceDrop, h.Name, r, k)
	h.s.freePacket(k)
}

// sendCNP queues a congestion notification packet to ep's peer queue pair: BTH with opcode CNP and
// BECN, 16 reserved zero bytes, ICRC. IBTA Annex A17.9.3.
func (h *Host) sendCNP(ep *Endpoint) {
	s := h.s
	k := s.newPacket()
	f := wire.Fields{BTH: wire.BTHFields{Opcode: wire.CNP, PKey: wire.DefaultPKey, DestQP: ep.Peer.QP.QPN(), BECN: true}}
	out, err := wire.Append(k.buf[:headerRoom], &f, nil)
	if err != nil {
		s.freePacket(k)
		return
	}
	k.buf = out
	frame(k.buf, h.addr, ep.Peer.Host.addr, ep.Sport, 0)
	s.nextID++
	k.id, k.flow = s.nextID, ep.flow
	h.Stats.CNPsSent++
	ep.Stats.CNPsSent++
	h.ctrl = append(h.ctrl, k)
	s.trace(TraceSend, h.Name, DropNone, k)
	if h.Port != nil {
		h.Port.kick()
	}
}
