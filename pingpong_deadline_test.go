package goroce

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPingPongKeepsDeadline plays perftest's send_lat between two devices on UDP loopback (signaled
// SENDs of 16 inline bytes, each side waiting for the other's SEND before it answers) and checks that
// the shards do not set their read deadlines every round trip: each set moves a Go runtime timer, and
// the runtime wakes a second thread for it when none waits in the netpoller. The deadlines a
// ping-pong needs come once a tail-loss probe timeout (1 ms) at most, about 30 to 50 of them in the
// 200 ms this takes without the race detector, whatever the round trip; the ACK each side holds back
// for company (AckDelay) leaves with the reply and must not arm one.
//
// Nor may the reads end at those deadlines once a probe timeout: each reply cancels the probe, so the
// deadline armed for it finds nothing due, and the next one is armed later (the shard's staleSlack),
// up to 16 ms later once the loop has run a few, where it was every millisecond or two before.
func TestPingPongKeepsDeadline(t *testing.T) {
	const rounds = 10000
	p := newPair(t, nil, RC, ConnectOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	err := pingPongPair(ctx, p, Signaled, rounds)
	elapsed := time.Since(start)
	// A deadline at most once a probe timeout (1 ms), with room for one more each: twice a millisecond.
	limit := uint64(2*elapsed/time.Millisecond) + 20
	// A read ended by one at most every 2.5 ms. Usual is every 13 ms or so: 19 in 245 ms, and 190 to
	// 380 in 2.2 to 2.7 s with the race detector, where probes that really fire are common; with the
	// slack at most 3 ms it was 54 to 68 in 290 ms and 700 to 870 in 3 s, and before staleSlack 120 to
	// 170 and 2160 to 2220. A probe that really fires (a round trip held up past it on a loaded machine)
	// sets the slack back to 0 for a few wakes, hence the room.
	wakeLimit := uint64(elapsed/(2500*time.Microsecond)) + 20
	must(t, err)
	for _, d := range []*Device{p.a, p.b} {
		s := d.dp.Stats()
		t.Logf("%v: %d read deadlines armed, %d reads ended by one (%d with nothing due), %d GSO writes, for %d round trips in %v",
			d.dp.LocalAddr(), s.DeadlineArms, s.DeadlineWakes, s.StaleWakes, s.TxGSO, rounds, elapsed)
		if s.DeadlineArms > limit {
			t.Errorf("%v: %d read deadlines armed for %d round trips in %v (at most %d)", d.dp.LocalAddr(), s.DeadlineArms, rounds, elapsed, limit)
		}
		if s.DeadlineWakes > wakeLimit {
			t.Errorf("%v: %d reads ended by their deadline in %v (at most %d)", d.dp.LocalAddr(), s.DeadlineWakes, elapsed, wakeLimit)
		}
	}
}

// pingPongPair plays both sides of a SEND ping-pong on p (pingPong), a's first, each answering with
// a 16-byte inline SEND with flags (Inline and these) into 16-byte receives of a region of its own, and
// returns the first side's error, if any.
func pingPongPair(ctx context.Context, p *testPair, flags SendFlags, rounds int) error {
	errs := make(chan error, 2)
	var posted sync.WaitGroup
	posted.Add(2)
	side := func(pd *PD, q *QP, cq *CQ, first bool) {
		m, err := pd.AllocMR(16, LocalWrite)
		if err != nil {
			posted.Done()
			errs <- err
			return
		}
		send := &SendWR{Opcode: WRSend, Flags: flags | Inline, InlineData: make([]byte, 16)}
		errs <- pingPong(ctx, q, cq, send, &RecvWR{SGL: []SGE{m.SGE(0, 16)}}, rounds, first, &posted)
	}
	go side(p.pda, p.qa, p.cqa, true)
	go side(p.pdb, p.qb, p.cqb, false)
	return errors.Join(<-errs, <-errs)
}

// pingPong plays one side of a SEND ping-pong on q, waiting on cq: it keeps four receives posted, and
// answers each SEND that arrives with send, rounds times. The first side sends first, and does not
// answer the last reply. Both sides of a pair share posted (Add(2) before they start): the first sends
// only once the other has posted its receives, or a goroutine started late on a loaded machine (the
// race detector, CI's parallel packages) gets an RNR NAK for each try until the SEND fails with the
// retry counter exceeded (7 tries 0.64 ms apart by default).
func pingPong(ctx context.Context, q *QP, cq *CQ, send *SendWR, recv *RecvWR, rounds int, first bool, posted *sync.WaitGroup) error {
	var err error
	for range 4 {
		if err = q.PostRecv(recv); err != nil {
			break
		}
	}
	posted.Done()
	if err != nil {
		return err
	}
	if first {
		posted.Wait()
		if err := q.PostSend(send); err != nil {
			return err
		}
	}
	wcs := make([]Completion, 16)
	for got := 0; got < rounds; {
		n, err := cq.Wait(ctx, wcs)
		if err != nil {
			return fmt.Errorf("after %d rounds: %w", got, err)
		}
		for _, wc := range wcs[:n] {
			if err := wc.Err(); err != nil {
				return err
			}
			if wc.Opcode != CompRecv {
				continue
			}
			got++
			if err := q.PostRecv(recv); err != nil {
				return err
			}
			if got < rounds || !first {
				if err := q.PostSend(send); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// TestStoppedLoopTakeover checks that a shard whose request-reply loop stops is driven again. After a
// ping-pong has run long enough for the background goroutine's looks at the linger to back off to
// their bound (Linger 1 ms, then 2, 4, 8 and 16 ms past it: maxLingerSlack), the first side stops
// waiting on its CQ, and the second side sends one more SEND. No goroutine of the first side's program
// reads its socket now: its shard's own goroutine must take over once the linger has passed, place the
// SEND in a receive and acknowledge it, within Linger plus 16 ms on an idle machine.
func TestStoppedLoopTakeover(t *testing.T) {
	p := newPair(t, nil, RC, ConnectOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	send := &SendWR{Opcode: WRSend, Flags: Signaled | Inline, InlineData: make([]byte, 16)}
	ma, err := p.pda.AllocMR(16, LocalWrite)
	must(t, err)
	mb, err := p.pdb.AllocMR(16, LocalWrite)
	must(t, err)
	errs := make(chan error, 2)
	var wg, posted sync.WaitGroup
	posted.Add(2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		errs <- pingPong(ctx, p.qa, p.cqa, send, &RecvWR{SGL: []SGE{ma.SGE(0, 16)}}, 3000, true, &posted)
	}()
	go func() {
		defer wg.Done()
		errs <- pingPong(ctx, p.qb, p.cqb, send, &RecvWR{SGL: []SGE{mb.SGE(0, 16)}}, 3000, false, &posted)
	}()
	wg.Wait()
	for range 2 {
		must(t, <-errs)
	}
	// The first side's last Wait has returned; its program now only polls.
	wcs := make([]Completion, 16)
	for p.cqa.Poll(wcs) > 0 {
	}
	start := time.Now()
	last := *send
	last.WRID = 1 << 40 // told apart from the completions of the loop's own SENDs, which may still come
	must(t, p.qb.PostSend(&last))
	var placed time.Duration
	for placed == 0 {
		n := p.cqa.Poll(wcs)
		for _, wc := range wcs[:n] {
			if wc.Opcode == CompRecv {
				must(t, wc.Err())
				placed = time.Since(start)
			}
		}
		if placed == 0 && time.Since(start) > 10*time.Second {
			t.Fatal("the SEND sent after the first side stopped waiting was not received in 10 s")
		}
		time.Sleep(100 * time.Microsecond)
	}
	for acked := false; !acked; {
		n, err := p.cqb.Wait(ctx, wcs)
		must(t, err)
		for _, wc := range wcs[:n] {
			must(t, wc.Err())
			acked = acked || wc.WRID == last.WRID
		}
	}
	acked := time.Since(start)
	t.Logf("received %v and acknowledged %v after it was sent, with nobody waiting on the receiver's CQ", placed, acked)
	// Linger plus maxLingerSlack is 17 ms; a loaded machine (the race detector, CI's parallel packages)
	// may take longer to run the goroutine whose timer fired.
	if placed > 2*time.Second {
		t.Errorf("received %v after it was sent, want about 17 ms at most", placed)
	}
}

// countingClock is a ManualClock that counts its readings.
type countingClock struct {
	*ManualClock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time { c.reads.Add(1); return c.ManualClock.Now() }

// TestPingPongClockReads plays send_lat's ping-pong between two devices on one counting clock and
// checks how often they read it: each side's PostSend once, and each shard once after each read that
// returned packets. The step before a read does not read it when it has nothing to fire or arm (every
// step of such a loop), where it used to: three readings a side a round trip instead of two. A loaded
// machine adds readings (hand-overs to a shard's own goroutine, deadlines filed from outside), so the
// test keeps the best of three runs.
func TestPingPongClockReads(t *testing.T) {
	const rounds = 1000
	run := func() float64 {
		clock := &countingClock{ManualClock: NewManualClock(time.Unix(1e9, 0))}
		p := newPairConfig(t, Config{Clock: clock}, RC, ConnectOptions{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		before := clock.reads.Load()
		must(t, pingPongPair(ctx, p, 0, rounds))
		return float64(clock.reads.Load()-before) / rounds
	}
	best := math.Inf(1)
	for range 3 {
		r := run()
		t.Logf("%.2f clock readings a round trip", r)
		best = min(best, r)
	}
	// Two a side is four; every step reading it made six.
	if best > 5 {
		t.Errorf("at best %.2f clock readings a round trip, want at most 5 (4: a PostSend and a receive a side)", best)
	}
}
