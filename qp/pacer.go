package qp

import "time"

// Pacer is the requester's rate control hook: before each request packet the requester asks when the
// packet may leave, and after sending it reports the bytes. A congestion controller (DCQCN in package
// congestion) implements it; with no pacer the requester sends as fast as the PSN window allows.
// Responses (ACKs, READ responses) are not paced.
type Pacer interface {
	// NextSend returns the earliest time a packet with n payload bytes may be sent; a time at or before
	// now lets it go.
	NextSend(now time.Time, n int) time.Time
	// OnSent records that a packet of n bytes (headers included) left at now.
	OnSent(now time.Time, n int)
}

// CNPReceiver is implemented by a Pacer that reacts to congestion notification packets addressed to its
// QP: the reaction point of DCQCN. IBTA Annex A17.9.3.
type CNPReceiver interface {
	OnCNP(now time.Time)
}
