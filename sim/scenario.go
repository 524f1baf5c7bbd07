package sim

import (
	"fmt"
	"time"

	"github.com/goroce/goroce/wire"
)

// Params are the knobs of the named scenarios; each scenario reads the ones it needs. DefaultParams
// gives a scenario's defaults.
type Params struct {
	Seed     uint64
	Rate     float64       // link rate, Gb/s
	Delay    time.Duration // propagation delay per link
	Flows    int
	Duration time.Duration // simulated time to run
	Size     int64         // bytes per flow; 0 runs until Duration
	Msg      int           // bytes per work request
	Depth    int           // work requests outstanding per flow
	Op       Op
	MTU      int // path MTU: 256, 512, 1024, 2048 or 4096
	Timeout  uint8
	Stagger  time.Duration // start of flow i is i*Stagger

	Loss, Reorder, Dup, Corrupt float64
	Burst                       float64 // Gilbert-Elliott: probability of entering a loss burst per packet (bursts average 4 packets)

	Buffer     int // switch output queue, bytes
	ECN        bool
	Kmin, Kmax int
	Pmax       float64
	ECNDequeue bool // mark on dequeue (ECNConfig.Dequeue)
	PFC        bool
	XOff, XOn  int
	DCQCN      bool // the dcqcn-* scenarios: DCQCN on every host (and ECN on), or off

	Leaves, Spines, HostsPerLeaf int

	Packets int           // ladder: packets to draw
	Sample  time.Duration // recorder interval; 0 picks Duration/400

	// Tracer, if set, sees every packet event of the run (Sim.SetTracer), from before the scenario
	// builds its network: "goroce sim run -w" captures a run with it.
	Tracer func(*TraceEvent)
}

// Scenario is a named experiment.
type Scenario struct {
	Name string
	Help string
	run  func(p Params) (*Result, error)
	def  func(p *Params)
}

// Result is a finished scenario run.
type Result struct {
	Name   string
	Params Params
	Sim    *Sim
	Topo   *Topology
	Rec    *Recorder
	Ladder *Ladder      // the ladder scenario only
	Report *DCQCNReport // the dcqcn-* scenarios only
	Wall   time.Duration
}

var scenarios = []Scenario{
	{"backtoback", "two hosts on one cable, one flow; -loss -burst -reorder -dup -corrupt impair it", runBackToBack,
		func(p *Params) { p.Flows, p.Duration = 1, 2*time.Millisecond }},
	{"dumbbell", "-flows senders share one bottleneck link to as many receivers", runDumbbell,
		func(p *Params) { p.Flows, p.Duration, p.Stagger = 4, 4*time.Millisecond, 500*time.Microsecond }},
	{"incast", "-flows senders write to one receiver through one switch port (N:1)", runIncast,
		func(p *Params) { p.Flows, p.Duration = 16, 10*time.Millisecond }},
	{"leafspine", "-leaves x -hosts hosts under -spines spines; each host writes to a host on the next leaf, ECMP on the UDP source port", runLeafSpine,
		func(p *Params) { p.Leaves, p.Spines, p.HostsPerLeaf, p.Duration = 4, 2, 4, 2*time.Millisecond }},
	{"ladder", "a packet ladder of the first -packets packets of one flow over a lossy cable", runLadder,
		func(p *Params) {
			p.Flows, p.Duration, p.Packets, p.Loss, p.Size, p.Msg, p.MTU, p.Rate = 1, 5*time.Millisecond, 40, 0.05, 64<<10, 16<<10, 1024, 10
			p.Timeout, p.Delay = 8, 2*time.Microsecond
		}},
	{"dcqcn-fairness", "-flows (2..8) senders join a 40 Gb/s dumbbell one by one (-stagger); -dcqcn on|off: Jain index and time to converge", runDCQCNFairness,
		func(p *Params) {
			dcqcnDefaults(p)
			p.Flows, p.Stagger, p.Duration = 4, 2*time.Millisecond, 0 // 0: 30 ms after the last start
		}},
	{"dcqcn-incast", "-flows:1 incast at -rate 40 or 100 Gb/s, -pfc or not; -dcqcn on|off: queue against Kmin/Kmax, drops, pauses", runDCQCNIncast,
		func(p *Params) {
			dcqcnDefaults(p)
			p.Flows, p.Duration, p.PFC = 16, 10*time.Millisecond, false
		}},
	{"dcqcn-victim", "a victim flow that shares no congested port, behind PFC pauses of a -flows:1 incast; -dcqcn on|off", runDCQCNVictim,
		func(p *Params) {
			dcqcnDefaults(p)
			// PFC at 96 KiB: the swA port's share of the queue DCQCN holds at swB>r (up to Kmax) stays
			// under it (t_ECN < t_PFC, [P §4]); at 32 or 64 KiB it does not, and PFC keeps pausing the
			// victim with DCQCN on.
			p.Flows, p.Duration, p.XOff, p.XOn = 8, 60*time.Millisecond, 96<<10, 80<<10
		}},
}

// Scenarios lists the named scenarios.
func Scenarios() []Scenario { return scenarios }

// DefaultParams returns scenario name's defaults.
func DefaultParams(name string) (Params, error) {
	p := Params{Seed: 1, Rate: 100, Delay: time.Microsecond, Msg: 1 << 20, Depth: 4, Op: OpWrite, MTU: 4096,
		Timeout: 10, Buffer: 1 << 20, Kmin: 100 << 10, Kmax: 400 << 10, Pmax: 0.2, XOff: 24 << 10, XOn: 12 << 10,
		Packets: 40}
	for _, sc := range scenarios {
		if sc.Name == name {
			sc.def(&p)
			return p, nil
		}
	}
	return p, fmt.Errorf("sim: unknown scenario %q", name)
}

// RunScenario runs scenario name with p.
func RunScenario(name string, p Params) (*Result, error) {
	for _, sc := range scenarios {
		if sc.Name == name {
			start := time.Now() // wall time for the report only; never reaches the simulation
			r, err := sc.run(p)
			if r != nil {
				r.Name, r.Params, r.Wall = name, p, time.Since(start)
			}
			return r, err
		}
	}
	return nil, fmt.Errorf("sim: unknown scenario %q", name)
}

// newSim returns the run's simulator, with the run's tracer installed.
func (p *Params) newSim() *Sim {
	s := New(p.Seed)
	s.SetTracer(p.Tracer)
	return s
}

func (p *Params) link() LinkConfig {
	return LinkConfig{Rate: int64(p.Rate * 1e9), Delay: p.Delay}
}

func (p *Params) faults() Faults {
	f := Faults{Loss: p.Loss, Reorder: p.Reorder, Duplicate: p.Dup, Corrupt: p.Corrupt}
	if p.Reorder > 0 {
		f.ReorderDelay = 10 * time.Microsecond
	}
	if p.Burst > 0 {
		f.Burst = &GilbertElliott{PGoodBad: p.Burst, PBadGood: 0.25, LossBad: 1}
	}
	return f
}

func (p *Params) switchCfg() SwitchConfig {
	return SwitchConfig{Buffer: p.Buffer,
		ECN: ECNConfig{Enabled: p.ECN, Kmin: p.Kmin, Kmax: p.Kmax, Pmax: p.Pmax, Dequeue: p.ECNDequeue},
		PFC: PFCConfig{Enabled: p.PFC, XOff: p.XOff, XOn: p.XOn}}
}

func (p *Params) qp() (QPOptions, error) {
	m, ok := wire.MTUFromBytes(p.MTU)
	if !ok {
		return QPOptions{}, fmt.Errorf("sim: path MTU %d is not one of 256, 512, 1024, 2048, 4096", p.MTU)
	}
	return QPOptions{MTU: m, Timeout: p.Timeout, RetryCnt: 7, RNRRetry: 7, ECN: p.ECN}, nil
}

func (p *Params) sample() Time {
	if p.Sample > 0 {
		return FromDuration(p.Sample)
	}
	return max(FromDuration(p.Duration)/400, Microsecond)
}

// addFlows adds one flow per (src, dst) pair and runs the simulation with a recorder on watch.
func runFlows(s *Sim, p Params, t *Topology, pairs [][2]*Host) (*Result, error) {
	o, err := p.qp()
	if err != nil {
		return nil, err
	}
	for i, pr := range pairs {
		_, err := s.AddFlow(FlowSpec{Name: fmt.Sprintf("f%d", i), Src: pr[0], Dst: pr[1], Op: p.Op, Size: p.Size,
			MsgSize: p.Msg, Depth: p.Depth, Start: Time(i) * FromDuration(p.Stagger), QP: o})
		if err != nil {
			return nil, err
		}
	}
	rec := s.Record(p.sample(), t.Watch)
	s.Run(FromDuration(p.Duration))
	return &Result{Sim: s, Topo: t, Rec: rec}, nil
}

func runBackToBack(p Params) (*Result, error) {
	s := p.newSim()
	l := p.link()
	l.Faults = p.faults()
	t := BackToBack(s, l, HostConfig{})
	pairs := make([][2]*Host, max(p.Flows, 1))
	for i := range pairs {
		pairs[i] = [2]*Host{t.Hosts[0], t.Hosts[1]}
	}
	return runFlows(s, p, t, pairs)
}

func runDumbbell(p Params) (*Result, error) {
	s := p.newSim()
	mid := p.link()
	mid.Faults = p.faults()
	t := Dumbbell(s, p.Flows, p.link(), mid, p.switchCfg(), HostConfig{})
	var pairs [][2]*Host
	for i := 0; i < p.Flows; i++ {
		pairs = append(pairs, [2]*Host{t.Hosts[i], t.Hosts[p.Flows+i]})
	}
	return runFlows(s, p, t, pairs)
}

func runIncast(p Params) (*Result, error) {
	s := p.newSim()
	l := p.link()
	l.Faults = p.faults()
	t := Incast(s, p.Flows, l, p.switchCfg(), HostConfig{})
	var pairs [][2]*Host
	for i := 0; i < p.Flows; i++ {
		pairs = append(pairs, [2]*Host{t.Hosts[i], t.Hosts[p.Flows]})
	}
	return runFlows(s, p, t, pairs)
}

func runLeafSpine(p Params) (*Result, error) {
	s := p.newSim()
	l := p.link()
	l.Faults = p.faults()
	t := LeafSpine(s, p.Leaves, p.Spines, p.HostsPerLeaf, l, l, p.switchCfg(), HostConfig{})
	var pairs [][2]*Host
	n := len(t.Hosts)
	for i := 0; i < n; i++ {
		pairs = append(pairs, [2]*Host{t.Hosts[i], t.Hosts[(i+p.HostsPerLeaf)%n]})
	}
	r, err := runFlows(s, p, t, pairs)
	if err != nil {
		return nil, err
	}
	r.Rec.keepBusiest(8) // the plot stays readable
	return r, nil
}

func runLadder(p Params) (*Result, error) {
	s := p.newSim()
	l := p.link()
	l.Faults = p.faults()
	t := BackToBack(s, l, HostConfig{})
	lad := newLadder(s, t.Hosts[0], t.Hosts[1], 0, p.Packets)
	r, err := runFlows(s, p, t, [][2]*Host{{t.Hosts[0], t.Hosts[1]}})
	if err != nil {
		return nil, err
	}
	r.Ladder = lad
	return r, nil
}
