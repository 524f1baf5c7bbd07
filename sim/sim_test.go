package sim

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
)

func TestBackToBackWrite(t *testing.T) {
	s := New(1)
	topo := BackToBack(s, LinkConfig{Rate: 100e9, Delay: time.Microsecond}, HostConfig{})
	f, err := s.AddFlow(FlowSpec{Src: topo.Hosts[0], Dst: topo.Hosts[1], Op: OpWrite, Size: 10 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s.Run(Second)
	if testing.Verbose() {
		WriteSummary(os.Stdout, s.Summary())
		WritePorts(os.Stdout, s.Ports())
	}
	if !f.Done() || f.Stats.Err != 0 {
		t.Fatalf("flow not done: %+v", f.Stats)
	}
	// 10 MiB at 100 Gb/s is 839 us of payload; headers and ACK turnarounds cost a few percent.
	if g := f.Goodput(s.Now()); g < 90e9 || g > 100e9 {
		t.Errorf("goodput %.2f Gb/s, want 90..100", g/1e9)
	}
}

// TestDeterministic runs one lossy, reordering incast twice from the same seed and expects the same
// events, the same per-flow results and the same per-port counters.
func TestDeterministic(t *testing.T) {
	run := func() string {
		p, _ := DefaultParams("incast")
		p.Flows, p.Duration, p.Loss, p.Reorder, p.Dup, p.ECN = 4, 500*time.Microsecond, 0.01, 0.01, 0.01, true
		r, err := RunScenario("incast", p)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%d events\n", r.Sim.Processed)
		WriteSummary(&b, r.Sim.Summary())
		for _, pt := range r.Sim.Ports() {
			fmt.Fprintf(&b, "%s %+v\n", pt.Name, pt.Stats)
		}
		return b.String()
	}
	a, b := run(), run()
	if a != b {
		t.Fatalf("two runs of one seed differ:\n%s\n---\n%s", a, b)
	}
}

// TestIncastPFC checks that PFC makes an incast lossless and shares the bottleneck evenly, and that
// without it the same incast tail-drops.
func TestIncastPFC(t *testing.T) {
	p, _ := DefaultParams("incast")
	p.Flows, p.Duration, p.Msg = 8, 2*time.Millisecond, 64<<10
	for _, pfc := range []bool{false, true} {
		p.PFC = pfc
		r, err := RunScenario("incast", p)
		if err != nil {
			t.Fatal(err)
		}
		bott := r.Topo.Watch[0]
		drops := bott.Stats.Drops[DropQueueFull]
		if pfc != (drops == 0) {
			t.Errorf("pfc=%v: %d tail drops at the bottleneck", pfc, drops)
		}
		if !pfc {
			continue
		}
		if bott.Stats.MaxQueue > p.Buffer {
			t.Errorf("queue %d over the buffer %d", bott.Stats.MaxQueue, p.Buffer)
		}
		var paused Time
		for _, h := range r.Topo.Hosts[:p.Flows] {
			paused += h.Port.Stats.PausedTime
		}
		if paused == 0 {
			t.Error("no sender was ever paused")
		}
		// PFC is lossless, not fair: ports paused together share unevenly. The link stays full.
		total := 0.0
		for _, row := range r.Sim.Summary() {
			total += row.GoodputGbps
			if row.GoodputGbps < 4 || row.Retransmits != 0 {
				t.Errorf("pfc: %s goodput %.2f Gb/s, %d retransmissions", row.Name, row.GoodputGbps, row.Retransmits)
			}
		}
		if total < 90 || total > 100 {
			t.Errorf("pfc: total goodput %.2f Gb/s, want 90..100", total)
		}
	}
}

// TestECNMarking checks RED marking: ECN-capable traffic through a congested port gets marked, only
// when the queue passes Kmin, and the receivers count CE; traffic that is not ECN-capable is never
// marked.
func TestECNMarking(t *testing.T) {
	for _, ecn := range []bool{false, true} {
		p, _ := DefaultParams("incast")
		p.Flows, p.Duration, p.PFC, p.ECN = 4, time.Millisecond, true, ecn
		p.Buffer = 4 << 20
		p.XOff, p.XOn = 1<<20, 512<<10
		r, err := RunScenario("incast", p)
		if err != nil {
			t.Fatal(err)
		}
		bott := r.Topo.Watch[0]
		var ce uint64
		for _, ep := range r.Sim.Endpoints() {
			ce += ep.Stats.CE
		}
		// marked packets still queued at the end have not been received
		if ecn != (bott.Stats.Marks > 0) || ce > bott.Stats.Marks || ecn && ce == 0 {
			t.Errorf("ecn=%v: %d marks, %d CE received (max queue %d, Kmin %d)", ecn, bott.Stats.Marks, ce, bott.Stats.MaxQueue, p.Kmin)
		}
	}
}

// TestLeafSpineECMP checks that flows between leaves spread over every spine.
func TestLeafSpineECMP(t *testing.T) {
	p, _ := DefaultParams("leafspine")
	p.Duration, p.HostsPerLeaf, p.Msg = time.Millisecond, 8, 64<<10
	r, err := RunScenario("leafspine", p)
	if err != nil {
		t.Fatal(err)
	}
	for _, sw := range r.Sim.Switches[:p.Leaves] {
		used := 0
		for _, pt := range sw.Ports {
			if pt.peer.sw != nil && pt.Stats.TxPackets > 100 {
				used++
			}
		}
		// 8 flows leave each leaf: all on one of 2 spines has probability 2^-7
		if used < 2 {
			t.Errorf("%s sends over %d of %d spines", sw.Name, used, p.Spines)
		}
	}
	// Without congestion control, flows that collide on an uplink lose packets and some wait out a
	// 4 ms timeout; most must still make progress.
	done := 0
	for _, row := range r.Sim.Summary() {
		if row.Completed > 0 {
			done++
		}
	}
	if done < len(r.Sim.Flows())/2 {
		t.Errorf("%d of %d flows completed anything", done, len(r.Sim.Flows()))
	}
}

// TestCorruptionCaughtByICRC flips bits on a cable and expects every corrupted packet to be dropped by
// the receiver's ICRC check, and the flow to finish anyway.
func TestCorruptionCaughtByICRC(t *testing.T) {
	s := New(7)
	topo := BackToBack(s, LinkConfig{Rate: 25e9, Delay: time.Microsecond, Faults: Faults{Corrupt: 0.02}}, HostConfig{})
	f, err := s.AddFlow(FlowSpec{Src: topo.Hosts[0], Dst: topo.Hosts[1], Op: OpWrite, Size: 4 << 20, QP: QPOptions{Timeout: 8}})
	if err != nil {
		t.Fatal(err)
	}
	s.Run(Second)
	var corrupted, caught uint64
	for _, pt := range s.Ports() {
		corrupted += pt.Stats.Corrupted
	}
	for _, h := range s.Hosts {
		caught += h.Stats.Drops[DropICRC] + h.Stats.Drops[DropMalformed] // a flipped opcode fails parsing first
	}
	if corrupted == 0 || caught != corrupted || !f.Done() || f.Stats.Err != 0 {
		t.Fatalf("%d corrupted, %d caught by the ICRC; flow %+v", corrupted, caught, f.Stats)
	}
}

// TestHostCNPHook checks the notification-point hook: a host whose CNP hook says yes sends a CNP for
// each CE-marked request, and the sender's queue pair receives them.
func TestHostCNPHook(t *testing.T) {
	s := New(3)
	hc := HostConfig{CNP: func(now time.Time, ep *Endpoint, p wire.Packet) bool { return true }}
	topo := Incast(s, 2, LinkConfig{Rate: 100e9, Delay: time.Microsecond},
		SwitchConfig{ECN: ECNConfig{Enabled: true, Kmin: 10 << 10, Kmax: 50 << 10, Pmax: 1}}, hc)
	var flows []*Flow
	for i := 0; i < 2; i++ {
		f, err := s.AddFlow(FlowSpec{Src: topo.Hosts[i], Dst: topo.Hosts[2], Size: 1 << 20, QP: QPOptions{ECN: true}})
		if err != nil {
			t.Fatal(err)
		}
		flows = append(flows, f)
	}
	s.Run(Second)
	for _, f := range flows {
		c := f.Req.QP.Counters()
		if f.Resp.Stats.CE == 0 || f.Resp.Stats.CNPsSent != f.Resp.Stats.CE || c.RcvdCNP != f.Resp.Stats.CNPsSent {
			t.Errorf("%s: %d CE, %d CNPs sent, %d received by the QP", f.Spec.Name, f.Resp.Stats.CE, f.Resp.Stats.CNPsSent, c.RcvdCNP)
		}
	}
}

// TestTraceReplays runs campaign seeds twice with a packet trace and expects the traces to be equal to
// the byte: keys, ICRCs and all (memory keys derive from the run's seed).
func TestTraceReplays(t *testing.T) {
	for _, seed := range []uint64{3, 41} {
		var a, b strings.Builder
		if _, err := RunCampaignSeed(seed, &a); err != nil {
			t.Fatal(err)
		}
		if _, err := RunCampaignSeed(seed, &b); err != nil {
			t.Fatal(err)
		}
		if a.String() != b.String() || !strings.Contains(a.String(), "rkey=") {
			t.Fatalf("seed %d: traces differ (or carry no rkey)", seed)
		}
	}
}
