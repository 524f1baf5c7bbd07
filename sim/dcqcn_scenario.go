package sim

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"github.com/goroce/goroce/congestion"
)

// The DCQCN experiments of Zhu et al., SIGCOMM 2015 ([P]), each run with DCQCN off or on (Params.DCQCN):
// dcqcn-fairness (flows joining one by one on a dumbbell), dcqcn-incast (N:1 into one switch port) and
// dcqcn-victim (a flow that never crosses the congested port, caught by PFC backpressure). Each finishes
// with a DCQCNReport. With DCQCN on, every host runs WithDCQCN with congestion.DefaultParams at the link
// rate, the queue pairs send ECT(0), and switches mark CE with the RED policy of congestion.Marking.

// paperMarking returns the marking thresholds for a link of rateGbps: [P]'s 40 GbE setting
// (congestion.DefaultMarking: Kmin 5 KB, Kmax 200 KB, Pmax 1 %) with Kmin and Kmax scaled with the link
// rate, as the HPCC simulator scales its DCQCN thresholds (UNCERTAIN: [P] gives no rule for other speeds).
func paperMarking(rateGbps float64) congestion.Marking {
	m := congestion.DefaultMarking()
	m.Kmin = int(math.Round(float64(m.Kmin) * rateGbps / 40))
	m.Kmax = int(math.Round(float64(m.Kmax) * rateGbps / 40))
	return m
}

// dcqcnDefaults are the settings the three DCQCN scenarios share: [P]'s 40 GbE links, about 1 KB
// packets ([S] PACKET_PAYLOAD_SIZE 1000; path MTU 1024 here), marking thresholds from paperMarking
// (Kmin = Kmax = 0 picks them), marked on dequeue as [S] does, PFC on, as DCQCN assumes a lossless
// network [P §1], and a 10 µs sampling interval for the time series. Each switch port has a 1 MiB output
// queue and PFC pauses an ingress port at 32 KiB (resumes at 16 KiB): static thresholds, where [P]'s
// switch used dynamic ones; 16 ports × (32 KiB + the in-flight headroom of a 100 Gb/s, 1 µs link) still
// fit in the queue, so PFC stays lossless in the 16:1 incast.
func dcqcnDefaults(p *Params) {
	p.Rate, p.MTU, p.DCQCN = 40, 1024, true
	p.Kmin, p.Kmax, p.Pmax = 0, 0, congestion.DefaultMarking().Pmax
	p.ECNDequeue, p.PFC = true, true
	p.Sample = 10 * time.Microsecond
	p.Buffer = 1 << 20
	p.XOff, p.XOn = 32<<10, 16<<10
	p.Timeout = 14 // 67 ms: a go-back-N timeout longer than the run, as RoCE NICs default to
}

// dcqcnSetup applies Params.DCQCN: the host configuration, the switches' ECN and the queue pairs' ECT.
func (p *Params) dcqcnSetup() HostConfig {
	if p.Kmin == 0 && p.Kmax == 0 {
		m := paperMarking(p.Rate)
		p.Kmin, p.Kmax = m.Kmin, m.Kmax
	}
	if !p.DCQCN {
		return HostConfig{}
	}
	p.ECN = true
	return WithDCQCN(HostConfig{}, DCQCNConfig{})
}

// fairnessSettle is how long dcqcn-fairness runs after the last flow joins, unless -duration says.
const fairnessSettle = 30 * time.Millisecond

// runDCQCNFairness: -flows senders (2..8) on the left of a dumbbell write to as many receivers on the
// right through one bottleneck link; flow i starts at i·stagger. [P §6]: with DCQCN each flow converges
// to C/n.
func runDCQCNFairness(p Params) (*Result, error) {
	if p.Flows < 1 {
		return nil, fmt.Errorf("sim: dcqcn-fairness needs at least one flow")
	}
	if p.Duration == 0 {
		p.Duration = time.Duration(p.Flows-1)*p.Stagger + fairnessSettle
	}
	hc := p.dcqcnSetup()
	s := p.newSim()
	t := Dumbbell(s, p.Flows, p.link(), p.link(), p.switchCfg(), hc)
	var pairs [][2]*Host
	for i := 0; i < p.Flows; i++ {
		pairs = append(pairs, [2]*Host{t.Hosts[i], t.Hosts[p.Flows+i]})
	}
	r, err := runFlows(s, p, t, pairs)
	if err != nil {
		return nil, err
	}
	from := Time(p.Flows-1) * FromDuration(p.Stagger)
	r.Report = analyzeDCQCN(r, p, from, -1)
	return r, nil
}

// runDCQCNIncast: -flows senders (16 by default) write to one receiver through one switch port, all
// starting at once.
func runDCQCNIncast(p Params) (*Result, error) {
	hc := p.dcqcnSetup()
	s := p.newSim()
	t := Incast(s, p.Flows, p.link(), p.switchCfg(), hc)
	var pairs [][2]*Host
	for i := 0; i < p.Flows; i++ {
		pairs = append(pairs, [2]*Host{t.Hosts[i], t.Hosts[p.Flows]})
	}
	r, err := runFlows(s, p, t, pairs)
	if err != nil {
		return nil, err
	}
	r.Report = analyzeDCQCN(r, p, 0, -1)
	return r, nil
}

// Victim builds the victim-flow network: switches swA and swB joined by one link; senders a0.. on swA
// and b0.. on swB (hot senders each) write to the receiver r on swB, and the victim v on swA writes to
// vr on swB. The victim never crosses the congested port swB>r, but shares the link swA>swB with the
// hot flows from swA, so PFC pauses that swB sends up that link hold the victim too, and swA's pauses
// reach v's own port. Hosts holds a0.., b0.., r, v, vr; Watch is swB>r then swA>swB.
func Victim(s *Sim, hotA, hotB int, link LinkConfig, sc SwitchConfig, hc HostConfig) *Topology {
	a := s.AddSwitch("swA", sc)
	b := s.AddSwitch("swB", sc)
	t := &Topology{Switches: []*Switch{a, b}}
	for i := 0; i < hotA; i++ {
		h := s.AddHost(hostCfg(hc, fmt.Sprintf("a%d", i)))
		s.Connect(h, a, link)
		t.Hosts = append(t.Hosts, h)
	}
	for i := 0; i < hotB; i++ {
		h := s.AddHost(hostCfg(hc, fmt.Sprintf("b%d", i)))
		s.Connect(h, b, link)
		t.Hosts = append(t.Hosts, h)
	}
	r := s.AddHost(hostCfg(hc, "r"))
	hot := s.Connect(b, r, link)
	v := s.AddHost(hostCfg(hc, "v"))
	s.Connect(v, a, link)
	vr := s.AddHost(hostCfg(hc, "vr"))
	s.Connect(b, vr, link)
	ab := s.Connect(a, b, link)
	t.Hosts = append(t.Hosts, r, v, vr)
	t.Watch = []*Port{hot.A, ab.A}
	return t
}

// runDCQCNVictim: -flows hot senders, half on each switch of Victim, write to r; the victim flow (the
// last flow) goes v→vr. [P §2]: without DCQCN, PFC pauses spread from the congested port and the victim
// loses throughput; with DCQCN the pauses stop.
func runDCQCNVictim(p Params) (*Result, error) {
	if p.Flows < 2 {
		return nil, fmt.Errorf("sim: dcqcn-victim needs at least two hot flows")
	}
	hc := p.dcqcnSetup()
	s := p.newSim()
	hotA := p.Flows / 2
	hotB := p.Flows - hotA
	t := Victim(s, hotA, hotB, p.link(), p.switchCfg(), hc)
	var pairs [][2]*Host
	r := t.Hosts[p.Flows]
	for i := 0; i < p.Flows; i++ {
		pairs = append(pairs, [2]*Host{t.Hosts[i], r})
	}
	pairs = append(pairs, [2]*Host{t.Hosts[p.Flows+1], t.Hosts[p.Flows+2]})
	p.Stagger = 0
	res, err := runFlows(s, p, t, pairs)
	if err != nil {
		return nil, err
	}
	rep := analyzeDCQCN(res, p, 0, p.Flows)
	// Max-min fair share of the victim: the hot flows share swB>r's goodput G evenly; the hotA of them
	// on swA>swB leave the victim the rest of that link, G·(1 − hotA/flows) in goodput terms.
	rep.VictimFairGbps = rep.TotalGbps * (1 - float64(hotA)/float64(p.Flows))
	res.Report = rep
	return res, nil
}

// DCQCNReport holds the figures the DCQCN experiments are judged by.
type DCQCNReport struct {
	DCQCN      bool
	Flows      int
	RateGbps   float64
	From, To   Time      // the window the figures cover: from the last flow's start to the end
	Window     Time      // averaging window of the fairness figures
	Goodput    []float64 // each flow's mean arrival rate over the second half of the window, Gb/s
	TotalGbps  float64   // their sum, the victim's excluded
	Jain       float64   // Jain's index of the flows' mean rates over the second half of the window
	JainMin    float64   // the smallest Jain's index of one averaging window in that second half
	Converge   Time      // from From until every later averaging window has Jain ≥ FairGoal; -1 if never
	Bottleneck string
	QueueP50   int // bottleneck queue percentiles over the second half of the window, bytes
	QueueP90   int
	QueueP99   int
	QueueMax   int // largest bottleneck queue over the whole run
	Kmin, Kmax int
	Buffer     int
	Marks      uint64 // CE marks at the bottleneck
	Drops      uint64 // queue-full drops at every switch port
	Retransmit uint64 // request packets sent again
	Pauses     uint64 // PFC XOFFs sent by every switch port
	PausedTime Time   // time ports spent paused, summed over every port
	HostPaused Time   // of which the hosts' NIC ports
	CNPs       uint64 // CNPs the receivers sent

	Victim         int     // index of the victim flow, -1 if none
	VictimGbps     float64 // its mean rate over the second half of the window
	VictimFairGbps float64 // its max-min fair share
	VictimPaused   Time    // time the victim's NIC port spent paused
}

// FairGoal is the Jain's index the issue asks DCQCN to reach after convergence.
const FairGoal = 0.95

// Jain returns Jain's fairness index (Σx)²/(n·Σx²) of xs: 1 when all are equal, 1/n when one has all.
func Jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 1
	}
	return s * s / (float64(len(xs)) * s2)
}

// analyzeDCQCN computes the report from the recorder, over [from, end] of the run; victim is the victim
// flow's index or -1. The fairness figures cover every flow but the victim.
func analyzeDCQCN(r *Result, p Params, from Time, victim int) *DCQCNReport {
	rec := r.Rec
	rep := &DCQCNReport{DCQCN: p.DCQCN, RateGbps: p.Rate, From: from, To: r.Sim.Now(), Victim: victim,
		Kmin: p.Kmin, Kmax: p.Kmax, Buffer: p.Buffer, Converge: -1}
	var fair []int // flows the fairness figures cover
	for i := range rec.Flows {
		if i != victim {
			fair = append(fair, i)
		}
	}
	rep.Flows = len(fair)
	// samples k with Times[k] in (from, end]: each rate covers the interval before its sample
	first := sort.Search(len(rec.Times), func(k int) bool { return rec.Times[k] > from })
	n := len(rec.Times) - first
	mean := func(i, a, b int) float64 { // flow i's mean over samples [a, b)
		if b <= a {
			return 0
		}
		var s float64
		for _, x := range rec.FlowRate[i][a:b] {
			s += x
		}
		return s / float64(b-a)
	}
	half := first + n/2
	rep.Goodput = make([]float64, len(rec.Flows))
	for i := range rec.Flows {
		rep.Goodput[i] = mean(i, half, len(rec.Times)) / 1e9
		if i != victim {
			rep.TotalGbps += rep.Goodput[i]
		}
	}
	if victim >= 0 {
		rep.VictimGbps = rep.Goodput[victim]
		rep.VictimPaused = rec.Flows[victim].Spec.Src.Port.PausedFor(r.Sim.Now())
	}
	// fairness: averaging windows of w samples, 100 µs
	w := max(1, int(100*Microsecond/rec.Interval))
	rep.Window = Time(w) * rec.Interval
	jainOf := func(a, b int) float64 {
		xs := make([]float64, len(fair))
		for j, i := range fair {
			xs[j] = mean(i, a, b)
		}
		return Jain(xs)
	}
	rep.Jain = jainOf(half, len(rec.Times))
	rep.JainMin = 1
	var js []float64
	for a := first; a+w <= len(rec.Times); a += w {
		j := jainOf(a, a+w)
		js = append(js, j)
		if a >= half {
			rep.JainMin = min(rep.JainMin, j)
		}
	}
	for k := len(js) - 1; k >= 0 && js[k] >= FairGoal; k-- {
		rep.Converge = Time(k+1) * rep.Window
	}
	// the bottleneck queue
	b := r.Topo.Watch[0]
	rep.Bottleneck = b.Name
	q := append([]int(nil), rec.Queue[0][half:]...)
	sort.Ints(q)
	pct := func(f float64) int {
		if len(q) == 0 {
			return 0
		}
		return q[min(len(q)-1, int(f*float64(len(q))))]
	}
	rep.QueueP50, rep.QueueP90, rep.QueueP99 = pct(0.5), pct(0.9), pct(0.99)
	rep.QueueMax = b.Stats.MaxQueue
	rep.Marks = b.Stats.Marks
	now := r.Sim.Now()
	for _, pt := range r.Sim.Ports() {
		rep.Pauses += pt.Stats.PausesSent
		pt := pt.PausedFor(now)
		rep.PausedTime += pt
	}
	for _, h := range r.Sim.Hosts {
		rep.HostPaused += h.Port.PausedFor(now)
		rep.CNPs += h.Stats.CNPsSent
	}
	for _, sw := range r.Sim.Switches {
		for _, pt := range sw.Ports {
			rep.Drops += pt.Stats.Drops[DropQueueFull]
		}
	}
	for _, f := range r.Sim.Flows() {
		rep.Retransmit += f.Req.Stats.Retransmits
	}
	return rep
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func fmtConverge(t Time) string {
	if t < 0 {
		return "never"
	}
	return t.Duration().String()
}

// reportRows returns the report as (name, value) lines, in a fixed order.
func (rep *DCQCNReport) rows() [][2]string {
	kb := func(n int) string { return fmt.Sprintf("%.1f KB", float64(n)/1000) }
	rows := [][2]string{
		{"dcqcn", onOff(rep.DCQCN)},
		{"window", fmt.Sprintf("%v..%v", rep.From.Duration(), rep.To.Duration())},
		{"flows", fmt.Sprint(rep.Flows)},
		{"goodput (2nd half)", fmt.Sprintf("%.2f Gb/s of %g", rep.TotalGbps, rep.RateGbps)},
		{"jain (2nd half)", fmt.Sprintf("%.3f", rep.Jain)},
		{"jain min (100us)", fmt.Sprintf("%.3f", rep.JainMin)},
		{"converged after", fmtConverge(rep.Converge)},
		{"queue p50 (2nd half)", kb(rep.QueueP50)},
		{"queue p90 (2nd half)", kb(rep.QueueP90)},
		{"queue p99 (2nd half)", kb(rep.QueueP99)},
		{"queue max", kb(rep.QueueMax)},
		{"kmin/kmax/buffer", fmt.Sprintf("%s / %s / %s", kb(rep.Kmin), kb(rep.Kmax), kb(rep.Buffer))},
		{"marks", fmt.Sprint(rep.Marks)},
		{"cnps", fmt.Sprint(rep.CNPs)},
		{"queue drops", fmt.Sprint(rep.Drops)},
		{"retransmits", fmt.Sprint(rep.Retransmit)},
		{"pfc pauses", fmt.Sprint(rep.Pauses)},
		{"paused (all ports)", rep.PausedTime.Duration().String()},
		{"paused (host ports)", rep.HostPaused.Duration().String()},
	}
	if rep.Victim >= 0 {
		rows = append(rows,
			[2]string{"victim goodput", fmt.Sprintf("%.2f Gb/s (fair share %.2f)", rep.VictimGbps, rep.VictimFairGbps)},
			[2]string{"victim paused", rep.VictimPaused.Duration().String()})
	}
	per := ""
	for i, g := range rep.Goodput {
		if i > 0 {
			per += " "
		}
		per += fmt.Sprintf("%.2f", g)
	}
	return append(rows, [2]string{"per flow (2nd half)", per})
}

// WriteReports prints one column per report, side by side.
func WriteReports(w io.Writer, reps ...*DCQCNReport) {
	if len(reps) == 0 {
		return
	}
	cols := make([][][2]string, len(reps))
	for i, r := range reps {
		cols[i] = r.rows()
	}
	for k := range cols[0] {
		fmt.Fprintf(w, "%-21s", cols[0][k][0])
		for _, c := range cols {
			fmt.Fprintf(w, "  %-32s", c[k][1])
		}
		fmt.Fprintln(w)
	}
}

// WriteReportsCSV writes the reports as CSV: a metric per row, a column per report.
func WriteReportsCSV(w io.Writer, reps ...*DCQCNReport) error {
	if len(reps) == 0 {
		return nil
	}
	cols := make([][][2]string, len(reps))
	for i, r := range reps {
		cols[i] = r.rows()
	}
	for k := range cols[0] {
		line := cols[0][k][0]
		for _, c := range cols {
			line += ",\"" + c[k][1] + "\""
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}
