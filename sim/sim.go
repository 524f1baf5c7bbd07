package sim

import (
	"fmt"
	"math/rand/v2"
)

// Sim is one simulated network: a virtual clock, the event queue, the seeded random source, and the
// hosts, switches and links built on it. A Sim is not safe for concurrent use; run many Sims in
// parallel instead.
type Sim struct {
	now    Time
	seq    uint64
	events eventHeap
	rng    *rand.Rand
	seed   uint64

	Hosts    []*Host
	Switches []*Switch
	Links    []*Link
	ports    []*Port
	eps      []*Endpoint
	flows    []*Flow

	pool      pool
	nextID    uint64
	calls     []func()
	freeCalls []int32
	routed    bool
	stopped   bool

	tracer func(*TraceEvent)
	tev    TraceEvent

	// VerifyRetransmits makes hosts remember every request packet by PSN and check that each
	// retransmission repeats it (Endpoint.RetransmitMismatch). It costs a map entry per PSN: for tests.
	VerifyRetransmits bool

	// Processed counts the events run so far.
	Processed uint64
}

// New returns an empty network whose every random choice derives from seed.
func New(seed uint64) *Sim {
	return &Sim{seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))}
}

// Seed returns the seed the simulator was created with.
func (s *Sim) Seed() uint64 { return s.seed }

// Now returns the current virtual time.
func (s *Sim) Now() Time { return s.now }

// Rand returns the run's random source. Drawing from it in the order events happen keeps runs
// reproducible; drawing from anything else does not.
func (s *Sim) Rand() *rand.Rand { return s.rng }

// SetTracer installs fn to see every packet event: sends, receptions, drops, marks, corruption. The
// event and its Frame are valid only during the call.
func (s *Sim) SetTracer(fn func(*TraceEvent)) { s.tracer = fn }

// Ports returns every port, in creation order.
func (s *Sim) Ports() []*Port { return s.ports }

// Endpoints returns every queue pair endpoint, in creation order.
func (s *Sim) Endpoints() []*Endpoint { return s.eps }

// Flows returns every flow, in creation order.
func (s *Sim) Flows() []*Flow { return s.flows }

// At schedules fn to run at virtual time t (or now, if t has passed).
func (s *Sim) At(t Time, fn func()) {
	var i int32
	if n := len(s.freeCalls); n > 0 {
		i = s.freeCalls[n-1]
		s.freeCalls = s.freeCalls[:n-1]
		s.calls[i] = fn
	} else {
		i = int32(len(s.calls))
		s.calls = append(s.calls, fn)
	}
	s.schedule(max(t, s.now), evCall, i, nil, 0)
}

// Every runs fn at start and then every interval until fn returns false.
func (s *Sim) Every(start, interval Time, fn func(now Time) bool) {
	var tick func()
	tick = func() {
		if fn(s.now) {
			s.At(s.now+interval, tick)
		}
	}
	s.At(start, tick)
}

func (s *Sim) schedule(at Time, k evKind, obj int32, p *packet, arg int64) {
	s.seq++
	s.events.push(event{at: at, seq: s.seq, kind: k, obj: obj, pkt: p, arg: arg})
}

// Stop makes the running Run return after the current event.
func (s *Sim) Stop() { s.stopped = true }

// Run processes events up to and including virtual time until, or until none is left or Stop is
// called, and returns the time it stopped at. With events left, the clock ends at until.
func (s *Sim) Run(until Time) Time {
	if !s.routed {
		s.computeRoutes()
	}
	s.stopped = false
	for len(s.events) > 0 && !s.stopped {
		if s.events[0].at > until {
			s.now = until
			return s.now
		}
		e := s.events.pop()
		s.now = e.at
		s.Processed++
		s.dispatch(&e)
	}
	return s.now
}

func (s *Sim) dispatch(e *event) {
	switch e.kind {
	case evTxDone:
		s.ports[e.obj].txDone(e.pkt)
	case evArrive:
		s.ports[e.obj].arrive(e.pkt)
	case evTimer:
		s.eps[e.obj].timer(Time(e.arg))
	case evPause:
		s.ports[e.obj].pause(e.arg != 0)
	case evCall:
		fn := s.calls[e.obj]
		s.calls[e.obj] = nil
		s.freeCalls = append(s.freeCalls, e.obj)
		fn()
	}
}

func (s *Sim) newPacket() *packet {
	p := s.pool.get()
	p.inPort, p.flow = -1, -1
	return p
}

func (s *Sim) freePacket(p *packet) { s.pool.put(p) }

// clone copies p into a fresh packet, for duplication.
func (s *Sim) clone(p *packet) *packet {
	c := s.newPacket()
	c.buf = append(c.buf[:0], p.buf...)
	c.id, c.flow, c.inPort, c.dup = p.id, p.flow, p.inPort, true
	return c
}

// Node is a host or a switch: something a link connects.
type Node interface {
	NodeName() string
	attach(p *Port)
}

// Connect joins a and b with a full-duplex link. Each direction gets its own port, queue and fault state.
func (s *Sim) Connect(a, b Node, cfg LinkConfig) *Link {
	if cfg.Rate <= 0 {
		panic("sim: link rate must be positive")
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	l := &Link{s: s, cfg: cfg, Name: a.NodeName() + "-" + b.NodeName()}
	l.A = s.newPort(a.NodeName()+">"+b.NodeName(), l)
	l.B = s.newPort(b.NodeName()+">"+a.NodeName(), l)
	l.A.peer, l.B.peer = l.B, l.A
	l.A.Faults, l.B.Faults = cfg.Faults, cfg.Faults
	a.attach(l.A)
	b.attach(l.B)
	s.Links = append(s.Links, l)
	s.routed = false
	return l
}

func (s *Sim) newPort(name string, l *Link) *Port {
	p := &Port{s: s, idx: int32(len(s.ports)), Name: name, link: l}
	s.ports = append(s.ports, p)
	return p
}

// computeRoutes fills every switch's table: for each destination host, the ports on a shortest path.
func (s *Sim) computeRoutes() {
	s.routed = true
	ns := len(s.Switches)
	for _, sw := range s.Switches {
		sw.routes = make([][]*Port, len(s.Hosts))
	}
	dist := make([]int, ns)
	queue := make([]int, 0, ns)
	for hi, h := range s.Hosts {
		if h.Port == nil {
			continue
		}
		for i := range dist {
			dist[i] = -1
		}
		queue = queue[:0]
		if sw := h.Port.peer.sw; sw != nil {
			dist[sw.idx] = 0
			queue = append(queue, sw.idx)
		}
		for len(queue) > 0 {
			i := queue[0]
			queue = queue[1:]
			for _, p := range s.Switches[i].Ports {
				if o := p.peer.sw; o != nil && dist[o.idx] < 0 {
					dist[o.idx] = dist[i] + 1
					queue = append(queue, o.idx)
				}
			}
		}
		for i, sw := range s.Switches {
			if dist[i] < 0 {
				continue
			}
			for _, p := range sw.Ports {
				switch {
				case p.peer.host == h:
					sw.routes[hi] = append(sw.routes[hi], p)
				case dist[i] > 0 && p.peer.sw != nil && dist[p.peer.sw.idx] == dist[i]-1:
					sw.routes[hi] = append(sw.routes[hi], p)
				}
			}
		}
	}
}

// trace reports a packet event to the tracer, if any.
func (s *Sim) trace(k TraceKind, where string, r DropReason, p *packet) {
	if s.tracer == nil {
		return
	}
	s.tev = TraceEvent{At: s.now, Kind: k, Where: where, Reason: r, Flow: -1}
	if p != nil {
		s.tev.ID, s.tev.Dup, s.tev.Flow, s.tev.Frame = p.id, p.dup, int(p.flow), p.buf
	}
	s.tracer(&s.tev)
}

func (s *Sim) String() string {
	return fmt.Sprintf("sim(seed %d, %d hosts, %d switches, %d links, t=%v)", s.seed, len(s.Hosts), len(s.Switches), len(s.Links), s.now)
}
