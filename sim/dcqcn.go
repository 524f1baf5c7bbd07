package sim

import (
	"time"

	"github.com/goroce/goroce/congestion"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// DCQCNConfig turns on DCQCN for a host's queue pairs (WithDCQCN).
type DCQCNConfig struct {
	// Params, if set, are every reaction point's parameters; nil means congestion.DefaultParams at the
	// rate of the host's link.
	Params *congestion.Params
	// CNPInterval is the notification point's N; 0 means congestion.DefaultCNPInterval (50 µs).
	CNPInterval time.Duration
}

// WithDCQCN returns hc with DCQCN on, as goroce's device runs it with Config.DCQCN: each queue pair's
// requester is paced by its own congestion.DCQCN reaction point (Endpoint.RP), which also takes the
// CNPs addressed to the queue pair, and each queue pair answers CE-marked requests with CNPs to the
// sending queue pair through its own congestion.NP (Endpoint.NP). Packets are ECN-capable only on
// connections made with QPOptions.ECN, which the DCQCN scenarios set.
//
// The reaction point's timers need no event of their own: every NextSend, OnSent and OnCNP first plays
// the increase timer and the α decay forward to now, each event at its own time, and a paced requester
// that is held back asks NextSend for the instant it may send, timer increases included; the qp engine
// reports that instant as its NextDeadline, which the host schedules. So a queue pair that has work
// sees every increase when it matters, and one that has none sees them, in order, at its next packet.
// This is what the device does too. Endpoint.Rate reads the rate as of a given time without disturbing
// the controller.
func WithDCQCN(hc HostConfig, c DCQCNConfig) HostConfig {
	interval := c.CNPInterval
	if interval == 0 {
		interval = congestion.DefaultCNPInterval
	}
	hc.Pacer = func(ep *Endpoint) qp.Pacer {
		var p congestion.Params
		switch {
		case c.Params != nil:
			p = *c.Params
		case ep.Host.Port != nil:
			p = congestion.DefaultParams(float64(ep.Host.Port.link.cfg.Rate))
		default:
			return nil // no link, no line rate: the queue pair is not paced
		}
		rp, err := congestion.NewDCQCN(p)
		if err != nil {
			return nil
		}
		ep.RP = rp
		return rp
	}
	hc.CNP = func(now time.Time, ep *Endpoint, _ wire.Packet) bool {
		if ep.NP == nil {
			ep.NP = congestion.NewNP(interval)
		}
		return ep.NP.OnCE(now)
	}
	return hc
}

// Rate returns the sending rate, bits per second, the endpoint's reaction point allows at virtual time
// t, with the increase events due by then applied to a copy, so that reading it changes nothing. It is 0
// for an endpoint without DCQCN.
func (ep *Endpoint) Rate(t Time) float64 {
	if ep.RP == nil {
		return 0
	}
	c := *ep.RP
	c.OnTimer(engineTime(t))
	return c.Rate()
}
