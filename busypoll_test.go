package goroce

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestBusyPoll runs a ping-pong between two devices on loopback sockets with Config.BusyPoll: replies
// that come while the waiting goroutine polls are read without it sleeping (Stats.BusyPolls), a reply
// later than the poll is still waited for after it (Stats.BusyPollMisses), and every byte arrives.
// Without BusyPoll neither counter moves.
func TestBusyPoll(t *testing.T) {
	for _, poll := range []time.Duration{0, 2 * time.Millisecond} {
		p := newPairConfig(t, Config{BusyPoll: poll}, RC, ConnectOptions{})
		ma, _ := p.pda.RegMR(make([]byte, 64), LocalWrite)
		mb, _ := p.pdb.RegMR(make([]byte, 64), LocalWrite)

		const rounds, slow = 200, 3 // the last slow replies come 10 ms late, past any poll
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		echoed := make(chan error, 1)
		go func() {
			wcs := make([]Completion, 8)
			for i := 0; i < rounds; {
				if err := p.qb.PostRecv(&RecvWR{SGL: []SGE{mb.SGE(0, 64)}}); err != nil {
					echoed <- err
					return
				}
				for got := false; !got; {
					n, err := p.cqb.Wait(ctx, wcs)
					if err != nil {
						echoed <- err
						return
					}
					for _, wc := range wcs[:n] {
						got = got || wc.Opcode == CompRecv
					}
				}
				if i >= rounds-slow {
					time.Sleep(10 * time.Millisecond)
				}
				if err := p.qb.PostSend(&SendWR{Opcode: WRSend, SGL: []SGE{mb.SGE(0, 64)}}); err != nil {
					echoed <- err
					return
				}
				i++
			}
			echoed <- nil
		}()
		wcs := make([]Completion, 8)
		for i := range rounds {
			msg := bytes.Repeat([]byte{byte(i)}, 64)
			copy(ma.Bytes(), msg)
			// The echo sends the buffer it received into: the reply carries msg back, into ma.
			must(t, p.qa.PostRecv(&RecvWR{SGL: []SGE{ma.SGE(0, 64)}}))
			must(t, p.qa.PostSend(&SendWR{Opcode: WRSend, SGL: []SGE{ma.SGE(0, 64)}}))
			for got := false; !got; {
				n, err := p.cqa.Wait(ctx, wcs)
				must(t, err)
				for _, wc := range wcs[:n] {
					if wc.Status != StatusSuccess {
						t.Fatalf("round %d: %+v", i, wc)
					}
					got = got || wc.Opcode == CompRecv
				}
			}
			if !bytes.Equal(ma.Bytes(), msg) {
				t.Fatalf("round %d: reply %x, want %x", i, ma.Bytes()[:8], msg[:8])
			}
		}
		must(t, <-echoed)
		s := p.a.Stats()
		switch {
		case poll == 0 && (s.BusyPolls != 0 || s.BusyPollMisses != 0):
			t.Errorf("without BusyPoll: BusyPolls %d, BusyPollMisses %d, want 0 and 0", s.BusyPolls, s.BusyPollMisses)
		case poll > 0 && (s.BusyPolls == 0 || s.BusyPollMisses < slow):
			t.Errorf("BusyPoll %v, %d round trips, %d of them late: BusyPolls %d, BusyPollMisses %d, want some and at least %d",
				poll, rounds, slow, s.BusyPolls, s.BusyPollMisses, slow)
		}
	}
}
