package sim

import (
	"flag"
	"os"
	"runtime"
	"sync"
	"testing"
)

var (
	campaignSeeds = flag.Int("sim.campaign", 0, "run the fault campaign over this many seeds (default: a short campaign)")
	campaignSeed  = flag.Uint64("sim.seed", 0, "run the fault campaign on this seed only, with a packet trace on failure")
)

// shortCampaign is the campaign's size in the normal test suite; -race slows it about tenfold.
const shortCampaign = 300

// TestCampaign runs the fault campaign (see campaign.go) over many seeds. Every failure names its seed
// and the command that replays it with a packet trace.
func TestCampaign(t *testing.T) {
	if *campaignSeed != 0 {
		res, err := RunCampaignSeed(*campaignSeed, nil)
		if err != nil {
			_, _ = RunCampaignSeed(*campaignSeed, os.Stdout)
			t.Fatalf("seed %d (%s): %v\nreplay: %s", res.Seed, res.Profile, err, ReplayCommand(res.Seed))
		}
		t.Logf("seed %d (%s): ok, %d requests, %d packets", res.Seed, res.Profile, res.Requests, res.Packets)
		return
	}
	n := shortCampaign
	if testing.Short() {
		n = 60
	}
	if *campaignSeeds > 0 {
		n = *campaignSeeds
	}
	type outcome struct {
		res CampaignResult
		err error
	}
	out := make([]outcome, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res, err := RunCampaignSeed(uint64(i+1), nil)
				out[i] = outcome{res, err}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	var reqs, pkts, icrc, lost, failed, lossFailed, skipped int
	for _, o := range out {
		reqs += o.res.Requests
		pkts += int(o.res.Packets)
		icrc += int(o.res.ICRCDrop)
		lost += int(o.res.Lost)
		failed += o.res.Failed
		if !o.res.Cut && o.res.Failed > 0 {
			lossFailed += o.res.Failed
			t.Logf("seed %d (%s): %d connection(s) exhausted their retries under loss and failed cleanly", o.res.Seed, o.res.Profile, o.res.Failed)
		}
		if o.err != nil {
			if reason := knownBug(o.err); reason != "" {
				skipped++
				t.Logf("seed %d: known engine bug (%s): %v", o.res.Seed, reason, o.err)
				continue
			}
			t.Errorf("seed %d (%s): %v\nreplay: %s", o.res.Seed, o.res.Profile, o.err, ReplayCommand(o.res.Seed))
		}
	}
	t.Logf("%d seeds, %d work requests, %d packets, %d lost on links, %d caught by the ICRC, %d connections failed cleanly (%d of them without a cut), %d known-bug seeds",
		n, reqs, pkts, lost, icrc, failed, lossFailed, skipped)
}

// knownBug classifies failures caused by engine bugs already reported, so that the short campaign stays
// green while they are fixed; it returns "" for the rest. None is open. The campaign's first find, a
// requester that resumed at a stale PSN when an implied ACK retired the WQE it was retransmitting
// (caught by the retransmission check as errStalePSN, seeds 262 and 298 of sim at 704085c), was fixed
// in qp by 1a6553b.
func knownBug(err error) string { return "" }
