package sim

import "time"

// DefaultMTU is the IP MTU of a link when LinkConfig.MTU is zero: jumbo enough for 4096-byte RoCE
// payloads (4096 + 28 + 12 + 16 + 4 = 4156, rounded up).
const DefaultMTU = 4200

// LinkConfig describes a full-duplex link.
type LinkConfig struct {
	Rate   int64         // bits per second, each direction
	Delay  time.Duration // propagation delay
	MTU    int           // largest IP packet; larger ones are dropped (DropMTU). 0 means DefaultMTU
	Faults Faults        // applied to both directions; set Port.Faults to differ
}

// Link is a full-duplex link: A transmits from the first node Connect was given to the second, B the
// other way.
type Link struct {
	s    *Sim
	cfg  LinkConfig
	down bool

	Name string
	A, B *Port
}

// Config returns the link's configuration.
func (l *Link) Config() LinkConfig { return l.cfg }

// Down reports whether the link is down.
func (l *Link) Down() bool { return l.down }

// SetDown takes the link down or brings it back up. While down, every packet that finishes
// serialization on either direction is lost (DropLinkDown); queues keep draining, as a port whose
// carrier dropped discards its frames.
func (l *Link) SetDown(down bool) { l.down = down }

// DropReason says why a packet was dropped.
type DropReason uint8

// Drop reasons.
const (
	DropNone      DropReason = iota
	DropLoss                 // a fault model lost it on the link
	DropLinkDown             // the link was down
	DropMTU                  // larger than the link MTU
	DropQueueFull            // a switch output queue was full (tail drop)
	DropICRC                 // the receiving host's ICRC check failed
	DropMalformed            // the receiving host could not parse it
	DropNoQP                 // no queue pair at the receiving host has its destination QPN
	DropNoRoute              // a switch has no route to the destination address
	numDropReasons
)

var dropNames = [...]string{"none", "loss", "link-down", "mtu", "queue-full", "icrc", "malformed", "no-qp", "no-route"}

func (r DropReason) String() string {
	if int(r) < len(dropNames) {
		return dropNames[r]
	}
	return "unknown"
}

// PortStats counts what happened on one direction of a link.
type PortStats struct {
	TxPackets, TxBytes uint64 // serialized onto the wire (IP bytes)
	Drops              [numDropReasons]uint64
	Marks              uint64 // packets marked CE
	Corrupted          uint64 // packets a bit flip hit
	Duplicated         uint64
	Reordered          uint64 // packets held back by the reordering model
	MaxQueue           int    // largest queue seen, bytes
	PausesSent         uint64 // PFC XOFF sent upstream (this port as ingress)
	PausedTime         Time   // total time this port was paused by its peer
}

// Port is one direction of a link at its transmitting end: at a switch an output queue, at a host the
// NIC's transmitter, which pulls the next packet from the host's queue pairs whenever the wire is free.
type Port struct {
	s    *Sim
	idx  int32
	link *Link
	peer *Port   // the other direction, transmitting toward this port's node
	host *Host   // the owner, if a host
	sw   *Switch // the owner, if a switch

	Name   string
	Faults Faults // fault models applied to packets leaving this port
	bad    bool   // Gilbert-Elliott state

	// output queue (switch ports)
	q      []*packet
	qhead  int
	qn     int
	qbytes int

	busy        bool
	paused      bool
	pausedSince Time

	// PFC ingress state: bytes buffered in this switch that arrived through this port.
	ingress   int
	pausing   bool
	lastArriv Time // last arrival at the far end: keeps a link FIFO while reordering is off

	Stats PortStats
}

// Link returns the port's link.
func (p *Port) Link() *Link { return p.link }

// Peer returns the port transmitting the other way on the same link.
func (p *Port) Peer() *Port { return p.peer }

// QueueBytes returns the bytes waiting in the port's output queue, not counting the packet being
// serialized.
func (p *Port) QueueBytes() int { return p.qbytes }

// PausedFor returns the time the port has spent paused by PFC up to now, the pause in progress included.
func (p *Port) PausedFor(now Time) Time {
	if p.paused {
		return p.Stats.PausedTime + now - p.pausedSince
	}
	return p.Stats.PausedTime
}

// Paused reports whether PFC holds the port.
func (p *Port) Paused() bool { return p.paused }

func (p *Port) serialization(n int) Time {
	return Time(int64(n) * 8 * int64(Second) / p.link.cfg.Rate)
}

// push appends to the output queue.
func (p *Port) push(k *packet) {
	if p.qn == len(p.q) {
		n := max(16, 2*len(p.q))
		q := make([]*packet, n)
		for i := 0; i < p.qn; i++ {
			q[i] = p.q[(p.qhead+i)%len(p.q)]
		}
		p.q, p.qhead = q, 0
	}
	p.q[(p.qhead+p.qn)%len(p.q)] = k
	p.qn++
	p.qbytes += k.ipLen()
	p.Stats.MaxQueue = max(p.Stats.MaxQueue, p.qbytes)
}

func (p *Port) pop() *packet {
	k := p.q[p.qhead]
	p.q[p.qhead] = nil
	p.qhead++
	if p.qhead == len(p.q) {
		p.qhead = 0
	}
	p.qn--
	p.qbytes -= k.ipLen()
	return k
}

// kick starts the next transmission if the port is free.
func (p *Port) kick() {
	if p.busy || p.paused {
		return
	}
	if p.host != nil {
		p.host.pull(p)
		return
	}
	if p.qn > 0 {
		k := p.pop()
		if k.inPort >= 0 {
			p.s.ports[k.inPort].releaseIngress(k.ipLen())
		}
		if p.sw.cfg.ECN.Dequeue {
			p.mark(k)
		}
		p.transmit(k)
	}
}

// transmit starts serializing k.
func (p *Port) transmit(k *packet) {
	p.busy = true
	p.Stats.TxPackets++
	p.Stats.TxBytes += uint64(k.ipLen())
	p.s.schedule(p.s.now+p.serialization(k.wireLen()), evTxDone, p.idx, k, 0)
}

// txDone puts a serialized packet on the wire, through the fault models, and starts the next.
func (p *Port) txDone(k *packet) {
	p.busy = false
	p.propagate(k)
	p.kick()
}

func (p *Port) drop(k *packet, r DropReason) {
	p.Stats.Drops[r]++
	p.s.trace(TraceDrop, p.Name, r, k)
	p.s.freePacket(k)
}

func (p *Port) propagate(k *packet) {
	s := p.s
	switch {
	case p.link.down:
		p.drop(k, DropLinkDown)
		return
	case k.ipLen() > p.link.cfg.MTU:
		p.drop(k, DropMTU)
		return
	}
	f := &p.Faults
	if f.lost(s, &p.bad) {
		p.drop(k, DropLoss)
		return
	}
	if f.Corrupt > 0 && s.rng.Float64() < f.Corrupt {
		// Any bit of the transport packet but BTH byte 4 (FECN, BECN, Resv6): the ICRC masks that byte
		// by design, as a variant field switches may rewrite. IBTA Annex A17 (ICRC).
		t := k.transport()
		bit := s.rng.IntN((len(t) - 1) * 8)
		if bit >= 4*8 {
			bit += 8
		}
		t[bit/8] ^= 1 << (bit % 8)
		p.Stats.Corrupted++
		s.trace(TraceCorrupt, p.Name, DropNone, k)
	}
	at := s.now + FromDuration(p.link.cfg.Delay)
	if f.Reorder > 0 && f.ReorderDelay > 0 && s.rng.Float64() < f.Reorder {
		at += Time(s.rng.Int64N(int64(FromDuration(f.ReorderDelay)))) + 1
		p.Stats.Reordered++
	} else if at < p.lastArriv {
		at = p.lastArriv // a packet never overtakes one the reordering model did not hold back
	}
	p.lastArriv = max(p.lastArriv, at)
	if f.Duplicate > 0 && s.rng.Float64() < f.Duplicate {
		p.Stats.Duplicated++
		c := s.clone(k)
		s.schedule(at, evArrive, p.idx, k, 0)
		s.schedule(at, evArrive, p.idx, c, 0)
		return
	}
	s.schedule(at, evArrive, p.idx, k, 0)
}

// arrive hands a packet that crossed this port's link to the node at the far end.
func (p *Port) arrive(k *packet) {
	in := p.peer
	switch {
	case in.host != nil:
		in.host.receive(k)
	case in.sw != nil:
		in.sw.forward(in, k)
	default:
		p.s.freePacket(k)
	}
}

// pause applies a PFC XOFF (true) or XON (false) from the peer.
func (p *Port) pause(on bool) {
	if on == p.paused {
		return
	}
	p.paused = on
	if on {
		p.pausedSince = p.s.now
		p.s.trace(TracePause, p.Name, DropNone, nil)
		return
	}
	p.Stats.PausedTime += p.s.now - p.pausedSince
	p.s.trace(TraceResume, p.Name, DropNone, nil)
	p.kick()
}

// chargeIngress accounts n bytes that arrived through this (switch) port and sends XOFF upstream past
// the threshold.
func (p *Port) chargeIngress(n int) {
	p.ingress += n
	c := &p.sw.cfg.PFC
	if c.Enabled && !p.pausing && p.ingress >= c.XOff {
		p.pausing = true
		p.Stats.PausesSent++
		p.s.schedule(p.s.now+FromDuration(p.link.cfg.Delay), evPause, p.peer.idx, nil, 1)
	}
}

// releaseIngress returns n bytes that arrived through this port and sends XON below the threshold.
func (p *Port) releaseIngress(n int) {
	p.ingress -= n
	c := &p.sw.cfg.PFC
	if p.pausing && p.ingress <= c.XOn {
		p.pausing = false
		p.s.schedule(p.s.now+FromDuration(p.link.cfg.Delay), evPause, p.peer.idx, nil, 0)
	}
}
