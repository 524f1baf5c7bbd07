package sim

import (
	"flag"
	"os"
	"runtime"
	"strings"
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
	var reqs, pkts, icrc, lost, failed, skipped int
	for _, o := range out {
		reqs += o.res.Requests
		pkts += int(o.res.Packets)
		icrc += int(o.res.ICRCDrop)
		lost += int(o.res.Lost)
		failed += o.res.Failed
		if o.err != nil {
			if reason := knownBug(o.err); reason != "" {
				skipped++
				t.Logf("seed %d: known engine bug (%s): %v", o.res.Seed, reason, o.err)
				continue
			}
			t.Errorf("seed %d (%s): %v\nreplay: %s", o.res.Seed, o.res.Profile, o.err, ReplayCommand(o.res.Seed))
		}
	}
	t.Logf("%d seeds, %d work requests, %d packets, %d lost on links, %d caught by the ICRC, %d connections failed cleanly after a cut, %d known-bug seeds",
		n, reqs, pkts, lost, icrc, failed, skipped)
}

// knownBug classifies failures caused by engine bugs already reported; it returns "" for the rest.
func knownBug(err error) string {
	if strings.Contains(err.Error(), errStalePSN) {
		return "qp requester resumes at a stale PSN, see TestKnownBugStaleRetransmitPSN"
	}
	return ""
}

// TestKnownBugStaleRetransmitPSN pins a qp engine bug the campaign found. Seed 298: a PSN sequence NAK
// for psn 0x291b91 makes the requester go back to the SEND_LAST_WITH_IMMEDIATE at 0x291b91 and the next
// SEND's SEND_FIRST at 0x291b92; then a (reordered) RDMA_READ_RESPONSE_MIDDLE for the READ at 0x291b95
// arrives, which implicitly acknowledges both SENDs and completes them. The requester then moves on to
// the READ but keeps the PSN counter where its retransmission stopped: it sends the READ request with
// psn 0x291b93 (first sent with 0x291b95; 0x291b93 was the SEND's SEND_MIDDLE), and every later
// request two PSNs early. The responder takes 0x291b93 for a duplicate, the READ's responses do not
// match, and the READ completes with "bad response" and the QP fails. Seed 262 shows the same with a
// WRITE_LAST_WITH_IMMEDIATE overwritten by a READ request. Expected: after completions retire the WQE
// being retransmitted, the next WQE restarts at its own first PSN.
func TestKnownBugStaleRetransmitPSN(t *testing.T) {
	t.Skip("qp bug: requester resumes at a stale PSN when an implied ACK retires the WQE it is retransmitting (campaign seeds 262, 298); replay: " + ReplayCommand(298))
	for _, seed := range []uint64{262, 298} {
		if res, err := RunCampaignSeed(seed, nil); err != nil {
			t.Errorf("seed %d (%s): %v", seed, res.Profile, err)
		}
	}
}
