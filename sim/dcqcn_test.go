package sim

import (
	"testing"
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/wire"
)

// runBoth runs scenario name with DCQCN off and on, in parallel, and returns the two reports.
func runBoth(t *testing.T, name string, p Params) (off, on *DCQCNReport) {
	t.Helper()
	type res struct {
		rep *DCQCNReport
		err error
	}
	ch := [2]chan res{make(chan res, 1), make(chan res, 1)}
	for i, dcqcn := range []bool{false, true} {
		go func() {
			q := p
			q.DCQCN = dcqcn
			r, err := RunScenario(name, q)
			if err != nil {
				ch[i] <- res{err: err}
				return
			}
			ch[i] <- res{rep: r.Report}
		}()
	}
	a, b := <-ch[0], <-ch[1]
	if a.err != nil || b.err != nil {
		t.Fatalf("%s (seed %d): %v %v", name, p.Seed, a.err, b.err)
	}
	return a.rep, b.rep
}

// TestDCQCNRecovers checks the wiring of the reaction point into sim: CNPs that a receiver sends
// through the network cut the sender's rate, and with no more CNPs the rate climbs back to line rate
// while the flow keeps sending. The increase timer needs no event of its own: the paced requester's
// deadline and every NextSend play it forward.
func TestDCQCNRecovers(t *testing.T) {
	s := New(5)
	params := congestion.DefaultParams(40e9)
	params.ByteCounter = 200_000 // hyper increase within a millisecond, so the test is short
	hc := WithDCQCN(HostConfig{}, DCQCNConfig{Params: &params})
	topo := BackToBack(s, LinkConfig{Rate: 40e9, Delay: time.Microsecond}, hc)
	f, err := s.AddFlow(FlowSpec{Src: topo.Hosts[0], Dst: topo.Hosts[1], MsgSize: 1 << 20, Depth: 4,
		QP: QPOptions{MTU: wire.MTU1024, ECN: true}})
	if err != nil {
		t.Fatal(err)
	}
	// Four CNPs 60 µs apart from the receiver's queue pair, as its NP would send them.
	for i := 0; i < 4; i++ {
		s.At(100*Microsecond+Time(i)*60*Microsecond, func() { topo.Hosts[1].sendCNP(f.Resp) })
	}
	rec := s.Record(10*Microsecond, topo.Watch)
	s.Run(3 * Millisecond)
	rp := f.Req.RP
	if rp == nil {
		t.Fatal("no reaction point on the requester")
	}
	st := rp.Stats()
	if st.CNPs != 4 || st.Cuts != 4 || f.Req.Stats.CNPsRcvd != 4 {
		t.Fatalf("CNPs received %d, cuts %d, host saw %d: want 4", st.CNPs, st.Cuts, f.Req.Stats.CNPsRcvd)
	}
	// lowest rate and throughput after the cuts, and the rate at the end
	lowRate, lowTput := 40e9, 40e9
	for k, tm := range rec.Times {
		if tm > 300*Microsecond && tm < 400*Microsecond {
			lowRate = min(lowRate, rec.CCRate[0][k])
			lowTput = min(lowTput, rec.FlowRate[0][k])
		}
	}
	end := f.Req.Rate(s.Now())
	if lowRate > 10e9 || lowTput > 12e9 {
		t.Errorf("after four cuts: rate %.2f Gb/s, throughput %.2f Gb/s; want both near 40/16", lowRate/1e9, lowTput/1e9)
	}
	if end != 40e9 || st.TimerEvents == 0 {
		t.Errorf("rate at the end %.2f Gb/s after %d timer and %d byte events; want back at line rate", end/1e9, st.TimerEvents, st.ByteEvents)
	}
	n := len(rec.Times)
	var last float64
	for _, x := range rec.FlowRate[0][n-20:] {
		last += x / 20
	}
	if last < 36e9 {
		t.Errorf("throughput over the last 200 µs %.2f Gb/s, want line-rate goodput (about 37)", last/1e9)
	}
	// Reading the rate for the recorder changed nothing: the controller saw no call since its last packet.
	if c := *rp; c.Rate() != rp.Rate() {
		t.Error("Endpoint.Rate disturbed the controller")
	}
}

// TestDCQCNFairness checks [P]'s convergence experiment on a short schedule: four flows join a 40 Gb/s
// dumbbell 1 ms apart; with DCQCN their rates converge to C/4 (Jain ≥ 0.95) and PFC pauses almost
// stop.
func TestDCQCNFairness(t *testing.T) {
	t.Parallel()
	p, _ := DefaultParams("dcqcn-fairness")
	p.Flows, p.Stagger, p.Duration = 4, time.Millisecond, 23*time.Millisecond
	off, on := runBoth(t, "dcqcn-fairness", p)
	t.Logf("off: jain %.3f converge %v pauses %d; on: jain %.3f converge %v pauses %d, per flow %.2f",
		off.Jain, off.Converge, off.Pauses, on.Jain, on.Converge, on.Pauses, on.Goodput)
	if on.Jain < FairGoal || on.Converge < 0 || on.Converge > 18*Millisecond {
		t.Errorf("DCQCN on: Jain %.3f, converged after %v; want ≥ %.2f within 18 ms", on.Jain, on.Converge, FairGoal)
	}
	if on.TotalGbps < 35 || on.Drops != 0 {
		t.Errorf("DCQCN on: goodput %.2f Gb/s, %d drops", on.TotalGbps, on.Drops)
	}
	if on.Pauses*4 > off.Pauses || on.QueueP50*2 > off.QueueP50 {
		t.Errorf("pauses %d → %d, median queue %d → %d: want DCQCN to cut both", off.Pauses, on.Pauses, off.QueueP50, on.QueueP50)
	}
}

// TestDCQCNIncast checks the 16:1 incast at 40 Gb/s without PFC: with DCQCN the queue settles in the
// marking band instead of sitting near the buffer, losses stop after the first burst, and every flow
// keeps a share; without it the go-back-N timeouts leave most flows stalled.
func TestDCQCNIncast(t *testing.T) {
	t.Parallel()
	p, _ := DefaultParams("dcqcn-incast")
	p.PFC, p.Duration = false, 6*time.Millisecond
	off, on := runBoth(t, "dcqcn-incast", p)
	t.Logf("off: q p50 %d p99 %d drops %d jain %.3f; on: q p50 %d p99 %d drops %d jain %.3f",
		off.QueueP50, off.QueueP99, off.Drops, off.Jain, on.QueueP50, on.QueueP99, on.Drops, on.Jain)
	if on.QueueP99 > on.Kmax+20_000 || on.QueueP50 < on.Kmin {
		t.Errorf("DCQCN on: queue p50 %d p99 %d, want inside Kmin %d .. Kmax %d", on.QueueP50, on.QueueP99, on.Kmin, on.Kmax)
	}
	if on.Drops*2 > off.Drops {
		t.Errorf("drops %d with DCQCN, %d without: want at most half", on.Drops, off.Drops)
	}
	if on.Jain < 0.9 || off.Jain > 0.5 {
		t.Errorf("Jain %.3f without DCQCN, %.3f with: want most flows stalled without, all running with", off.Jain, on.Jain)
	}
}

// TestDCQCNIncastPFC checks the same incast at 100 Gb/s with PFC: lossless both ways, and DCQCN cuts
// the pause time and the standing queue.
func TestDCQCNIncastPFC(t *testing.T) {
	t.Parallel()
	p, _ := DefaultParams("dcqcn-incast")
	p.PFC, p.Rate, p.Duration = true, 100, 6*time.Millisecond
	off, on := runBoth(t, "dcqcn-incast", p)
	t.Logf("off: q p50 %d paused %v; on: q p50 %d paused %v", off.QueueP50, off.PausedTime, on.QueueP50, on.PausedTime)
	if off.Drops != 0 || on.Drops != 0 {
		t.Errorf("drops with PFC: %d off, %d on", off.Drops, on.Drops)
	}
	if on.PausedTime*4 > off.PausedTime || on.QueueP50*2 > off.QueueP50 {
		t.Errorf("paused %v → %v, median queue %d → %d: want DCQCN to cut both", off.PausedTime, on.PausedTime, off.QueueP50, on.QueueP50)
	}
}

// TestDCQCNVictim checks [P §2]'s victim flow: without DCQCN PFC backpressure from the incast holds a
// flow that never crosses the congested port far below its fair share; with DCQCN the pauses stop and
// it gets most of its share.
func TestDCQCNVictim(t *testing.T) {
	t.Parallel()
	p, _ := DefaultParams("dcqcn-victim")
	p.Duration = 40 * time.Millisecond
	off, on := runBoth(t, "dcqcn-victim", p)
	t.Logf("victim off %.2f on %.2f (fair %.2f); paused off %v on %v", off.VictimGbps, on.VictimGbps, on.VictimFairGbps,
		off.VictimPaused, on.VictimPaused)
	if off.VictimGbps > 0.4*off.VictimFairGbps {
		t.Errorf("DCQCN off: victim at %.2f Gb/s of a fair %.2f; want PFC to hold it far below", off.VictimGbps, off.VictimFairGbps)
	}
	if on.VictimGbps < 0.75*on.VictimFairGbps || on.VictimPaused*10 > off.VictimPaused || on.Drops != 0 {
		t.Errorf("DCQCN on: victim at %.2f Gb/s of a fair %.2f, paused %v (off: %v), %d drops", on.VictimGbps,
			on.VictimFairGbps, on.VictimPaused, off.VictimPaused, on.Drops)
	}
}

func TestJain(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{[]float64{1, 1, 1, 1}, 1}, {[]float64{1, 0, 0, 0}, 0.25}, {[]float64{3, 1}, 0.8}, {[]float64{0, 0}, 1}} {
		if got := Jain(c.xs); got < c.want-1e-12 || got > c.want+1e-12 {
			t.Errorf("Jain(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}
