package congestion

import "time"

// DefaultCNPInterval is N, the shortest time between two CNPs for one flow. [P] §3 Fig. 6 (N = 50 µs);
// [S] CNP_INTERVAL 50. NVIDIA's min_time_between_cnps plays the same role in hardware.
const DefaultCNPInterval = 50 * time.Microsecond

// NPStats counts what a notification point did.
type NPStats struct {
	CE         uint64 // CE-marked packets seen
	CNPs       uint64 // CNPs asked for
	Suppressed uint64 // CE-marked packets that produced no CNP
}

// NP is the notification point of DCQCN for one flow (one responder QP, whose peer is the reaction
// point): it decides whether a CE-marked packet produces a CNP. A CE packet sends a CNP at once unless one
// was sent for the flow less than Interval ago, so a flow gets at most one CNP per Interval [P §3].
//
// [S] instead checks each flow on a 50 µs tick and sends at the tick if a CE packet arrived since the
// last one, which can delay the first CNP by up to 50 µs and sends one for a CE seen within the previous
// window; the paper's immediate rule is kept here. The zero NP sends a CNP for every CE packet.
//
// An NP is owned by the goroutine that owns its QP; it is not safe for concurrent use.
type NP struct {
	// Interval is N. Zero means every CE-marked packet produces a CNP.
	Interval time.Duration

	sent  bool
	last  time.Time
	stats NPStats
}

// NewNP returns a notification point with the given CNP interval.
func NewNP(interval time.Duration) *NP { return &NP{Interval: interval} }

// OnCE records a CE-marked packet of the flow received at now and reports whether a CNP should go to the
// flow's sender now. A now earlier than the last CNP sends nothing.
func (np *NP) OnCE(now time.Time) bool {
	np.stats.CE++
	if np.sent && now.Sub(np.last) < np.Interval {
		np.stats.Suppressed++
		return false
	}
	np.sent, np.last = true, now
	np.stats.CNPs++
	return true
}

// Stats returns the counters.
func (np *NP) Stats() NPStats { return np.stats }
