package congestion

// Marking is the congestion point's ECN marking policy, RED on the instantaneous egress queue length as
// DCQCN uses it [P §3 Fig. 5; S BroadcomNode::ShouldSendCN]: a packet is never marked while the queue
// holds at most Kmin bytes, is marked with probability rising linearly from 0 to Pmax as the queue grows
// from Kmin to Kmax, and is always marked above Kmax. Kmin == Kmax gives DCTCP-style step marking.
// [S] takes the queue length when the packet is dequeued.
type Marking struct {
	Kmin, Kmax int     // queue thresholds in bytes
	Pmax       float64 // marking probability at Kmax, in [0, 1]
}

// DefaultMarking returns [P]'s 40 GbE setting, Kmin = 5 KB, Kmax = 200 KB, Pmax = 1 %. UNCERTAIN: Kmax
// (DCQCN-validation uses 100 KB) and the unit (KB taken as 1000 bytes; [S] counts 1030-byte units).
func DefaultMarking() Marking {
	return Marking{Kmin: 5_000, Kmax: 200_000, Pmax: 0.01}
}

// Probability returns the chance that a packet leaving a queue of queueBytes is CE-marked.
func (m Marking) Probability(queueBytes int) float64 {
	switch {
	case queueBytes <= m.Kmin:
		return 0
	case queueBytes > m.Kmax:
		return 1
	default: // Kmin < q ≤ Kmax, so Kmax > Kmin
		return m.Pmax * float64(queueBytes-m.Kmin) / float64(m.Kmax-m.Kmin)
	}
}

// Mark reports whether to CE-mark a packet leaving a queue of queueBytes, given a uniform draw u in [0, 1).
func (m Marking) Mark(queueBytes int, u float64) bool { return u < m.Probability(queueBytes) }
