package sim

import "github.com/goroce/goroce/congestion"

// SwitchConfig describes a switch's ports. Every port gets the same buffer and policies.
type SwitchConfig struct {
	// Buffer is each output queue's capacity in bytes; a packet that does not fit is tail-dropped.
	// 0 means DefaultBuffer.
	Buffer int
	ECN    ECNConfig
	PFC    PFCConfig
	// ECMPSeed perturbs the switch's ECMP hash, so that tiers do not polarize onto the same choices.
	ECMPSeed uint64
}

// DefaultBuffer is an output queue's capacity when SwitchConfig.Buffer is zero: 1 MiB, in the range of
// a shallow-buffered datacenter switch's per-port share.
const DefaultBuffer = 1 << 20

// ECNConfig is RED-style marking on the instantaneous output queue, the congestion point DCQCN assumes:
// congestion.Marking applied to the queue a packet joins: at most Kmin no mark, between Kmin and Kmax
// marked with a probability rising linearly to Pmax, above Kmax always. Only ECN-capable packets (ECT)
// are marked. Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015, section
// 3.1. The queue is read when the packet is enqueued, unless Dequeue is set.
type ECNConfig struct {
	Enabled    bool
	Kmin, Kmax int // bytes
	Pmax       float64
	// Dequeue marks a packet as it leaves the queue, on the bytes queued behind it, as the authors' ns-3
	// model does (BroadcomNode::ShouldSendCN in the dequeue path): the mark then reports the queue as
	// it is now rather than one queueing delay ago, and reaches the receiver without waiting behind it.
	Dequeue bool
}

func (e *ECNConfig) marking() congestion.Marking {
	return congestion.Marking{Kmin: e.Kmin, Kmax: e.Kmax, Pmax: e.Pmax}
}

// PFCConfig is IEEE 802.1Qbb priority flow control on a single class: when the bytes a switch holds
// that arrived through one port reach XOff, it pauses the upstream transmitter of that port, and
// resumes it when they fall to XOn. The buffer above XOff must absorb what is in flight during the
// pause's propagation (the headroom).
type PFCConfig struct {
	Enabled   bool
	XOff, XOn int // bytes per ingress port
}

// Switch is an output-queued switch that forwards on the IP destination and spreads flows over equal-
// cost next hops by a hash of the 5-tuple.
type Switch struct {
	s      *Sim
	idx    int
	cfg    SwitchConfig
	routes [][]*Port // by destination host index

	Name  string
	Ports []*Port
}

// AddSwitch adds a switch.
func (s *Sim) AddSwitch(name string, cfg SwitchConfig) *Switch {
	if cfg.Buffer == 0 {
		cfg.Buffer = DefaultBuffer
	}
	sw := &Switch{s: s, idx: len(s.Switches), cfg: cfg, Name: name}
	s.Switches = append(s.Switches, sw)
	return sw
}

// NodeName returns the switch's name.
func (sw *Switch) NodeName() string { return sw.Name }

func (sw *Switch) attach(p *Port) {
	p.sw = sw
	sw.Ports = append(sw.Ports, p)
}

// Config returns the switch's configuration.
func (sw *Switch) Config() SwitchConfig { return sw.cfg }

// forward routes a packet that arrived on port in to an output queue.
func (sw *Switch) forward(in *Port, k *packet) {
	dst := hostIndex(k.dstIP())
	if dst < 0 || dst >= len(sw.routes) || len(sw.routes[dst]) == 0 {
		in.drop(k, DropNoRoute)
		return
	}
	outs := sw.routes[dst]
	out := outs[0]
	if len(outs) > 1 {
		out = outs[sw.ecmp(k)%uint64(len(outs))]
	}
	n := k.ipLen()
	if out.qbytes+n > sw.cfg.Buffer {
		out.drop(k, DropQueueFull)
		return
	}
	if !sw.cfg.ECN.Dequeue {
		out.mark(k)
	}
	k.inPort = in.idx
	in.chargeIngress(n)
	out.push(k)
	out.kick()
}

// mark applies the ECN policy of the port's switch to k against the port's queue: the queue k finds on
// enqueue, or the queue it leaves behind on dequeue.
func (p *Port) mark(k *packet) {
	e := &p.sw.cfg.ECN
	if !e.Enabled || k.tos()&ecnMask == 0 || k.tos()&ecnMask == ecnCE {
		return
	}
	// One random draw only where the policy is random, so runs without marking draw nothing.
	if pr := e.marking().Probability(p.qbytes); pr >= 1 || pr > 0 && p.s.rng.Float64() < pr {
		k.setTOS(k.tos() | ecnCE)
		p.Stats.Marks++
		p.s.trace(TraceMark, p.Name, DropNone, k)
	}
}

// ecmp hashes the packet's 5-tuple (protocol and destination port are always UDP and 4791).
func (sw *Switch) ecmp(k *packet) uint64 {
	x := uint64(k.srcIP())<<32 | uint64(k.dstIP())
	x ^= uint64(k.sport())<<17 ^ sw.cfg.ECMPSeed ^ uint64(sw.idx)*0x9E3779B97F4A7C15
	// splitmix64's finalizer
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}
