package congestion

import "time"

// Controller is a per-QP rate controller: it paces the requester's packets and reacts to CNPs. Its method
// set includes qp.Pacer and qp.CNPReceiver, so any Controller can be given to a QP as its Pacer; this
// package does not import qp (qp sits above congestion), and a test asserts the method sets match.
//
// A Controller is not safe for concurrent use: it belongs to the goroutine that owns its QP.
type Controller interface {
	// NextSend returns the earliest time a request packet with n payload bytes may leave; a time at or
	// before now lets it go. It does not consume anything: OnSent does.
	NextSend(now time.Time, n int) time.Time
	// OnSent records that a request packet of n bytes (transport headers included, as qp reports it)
	// left at now.
	OnSent(now time.Time, n int)
	// OnCNP records a congestion notification packet for this QP received at now. IBTA Annex A17.9.3.
	OnCNP(now time.Time)
	// Rate returns the current sending rate in bits per second on the wire.
	Rate() float64
	// NextDeadline returns when the controller's next timer is due, or the zero time if none is armed.
	NextDeadline() time.Time
	// OnTimer fires the timers due at or before now.
	OnTimer(now time.Time)
}

var _ Controller = (*DCQCN)(nil)
