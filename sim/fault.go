package sim

import "time"

// Faults are the impairments a port applies to each packet it puts on the wire, in this order: link
// down, MTU, loss (independent, then bursty), corruption, reordering, duplication.
type Faults struct {
	Loss  float64         // probability each packet is lost, independently
	Burst *GilbertElliott // bursty loss, in addition to Loss; nil for none

	// Reorder is the probability a packet is held back by up to ReorderDelay (uniformly), so that
	// packets sent after it may arrive first.
	Reorder      float64
	ReorderDelay time.Duration

	Duplicate float64 // probability a packet arrives twice
	Corrupt   float64 // probability one bit of the transport packet (BTH to ICRC, but not the ICRC-masked BTH byte 4) flips
}

// GilbertElliott is a two-state Markov loss model: a good and a bad state with their own loss rates, and
// the probabilities of moving between them at each packet. Gilbert 1960; Elliott 1963. The mean burst
// length is 1/PBadGood packets.
type GilbertElliott struct {
	PGoodBad float64 // per packet, from good to bad
	PBadGood float64 // per packet, from bad to good
	LossGood float64 // loss probability in the good state (often 0)
	LossBad  float64 // loss probability in the bad state (often 1)
}

// lost draws whether a packet is lost; bad is the port's Gilbert-Elliott state.
func (f *Faults) lost(s *Sim, bad *bool) bool {
	if f.Loss > 0 && s.rng.Float64() < f.Loss {
		return true
	}
	g := f.Burst
	if g == nil {
		return false
	}
	if *bad {
		if s.rng.Float64() < g.PBadGood {
			*bad = false
		}
	} else if s.rng.Float64() < g.PGoodBad {
		*bad = true
	}
	l := g.LossGood
	if *bad {
		l = g.LossBad
	}
	return l > 0 && s.rng.Float64() < l
}
