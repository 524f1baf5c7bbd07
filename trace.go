package goroce

import (
	"net/netip"
	"time"

	"github.com/goroce/goroce/wire"
)

// Direction says whether a traced packet was sent or received.
type Direction uint8

// Directions.
const (
	Sent Direction = iota
	Received
)

func (d Direction) String() string {
	if d == Sent {
		return "sent"
	}
	return "received"
}

// TraceEvent is a packet a device sent or received.
type TraceEvent struct {
	Dir      Direction
	At       time.Time
	From, To netip.AddrPort
	Packet   wire.Packet // valid only during the call
}

// Tracer sees a device's packets and completions (Config.Tracer). Its methods run on the device's
// goroutines and must not block or keep the packet.
type Tracer interface {
	Packet(e TraceEvent)
	Completion(at time.Time, wc Completion)
}
