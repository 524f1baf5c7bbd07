package goroce

import (
	"net/netip"
	"time"

	"github.com/goroce/goroce/wire"
)

// Direction says whether a traced packet was sent, received, or received and dropped.
type Direction uint8

// Directions.
const (
	Sent     Direction = iota
	Received           // taken by a QP
	Dropped            // received and dropped by the device, for TraceEvent.Reason (and counted in Stats)
)

func (d Direction) String() string {
	switch d {
	case Sent:
		return "sent"
	case Received:
		return "received"
	}
	return "dropped"
}

// TraceEvent is a packet a device sent or received, with what a capture needs to rebuild its IP and
// UDP headers as they were on the wire.
type TraceEvent struct {
	Dir      Direction
	At       time.Time
	From, To netip.AddrPort // UDP addresses: a sent packet's source port is its QP's (Config.SourcePorts)
	TOS      uint8          // the IPv4 TOS or IPv6 traffic class: DSCP and ECN
	// IPID is an IPv4 packet's identification: what a sent packet's ICRC was sealed with (i for the
	// i-th segment of a GSO write), what a received one's verified with. A GSO write the kernel
	// refuses leaves again one datagram at a time with identification 0, not traced again.
	IPID uint16
	// Bytes is the UDP payload, BTH through ICRC; Packet is it parsed, the zero Packet for a packet
	// dropped as malformed. Both are valid only during the call.
	Bytes  []byte
	Packet wire.Packet
	// Reason says why a Dropped packet was dropped: "malformed", "bad ICRC", "unknown QPN", "wrong
	// peer", "not ready" or "truncated".
	Reason string
	// Resent, for a Sent RC request packet that goes again, says what set the resend off: "NAK" (go-back-N
	// from the PSN a sequence NAK names), "NAK to a tail-loss probe", "timeout" (the local ACK timer),
	// "RNR NAK" (the wait it asked for is over), "implied NAK" (a response past a READ or atomic whose
	// response is missing) or "tail-loss probe" (the probe itself); "" for a first transmission. It is
	// what the wire cannot show: a capture (interop/capture) keeps it as a packet comment, and goroce
	// dump -explain reads it there instead of inferring the cause.
	Resent string
}

// Tracer sees a device's packets and completions (Config.Tracer). Its methods run on the device's
// goroutines and must not block, nor keep the event or its bytes: the device reuses both once Packet
// returns.
type Tracer interface {
	Packet(e *TraceEvent)
	Completion(at time.Time, wc Completion)
}
