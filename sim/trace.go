package sim

import (
	"fmt"
	"strconv"

	"github.com/goroce/goroce/wire"
)

// TraceKind says what happened to a packet.
type TraceKind uint8

// Trace event kinds.
const (
	TraceSend    TraceKind = iota // a host put the packet on its port
	TraceRecv                     // a host accepted the packet (ICRC good, queue pair found)
	TraceDrop                     // dropped; Reason says why
	TraceMark                     // a switch marked it CE
	TraceCorrupt                  // a link flipped one of its bits
	TracePause                    // PFC paused the port named in Where (no packet)
	TraceResume                   // PFC resumed the port (no packet)
)

var traceNames = [...]string{"send", "recv", "drop", "mark", "corrupt", "pause", "resume"}

func (k TraceKind) String() string {
	if int(k) < len(traceNames) {
		return traceNames[k]
	}
	return "unknown"
}

// TraceEvent is one packet event. Frame is the whole datagram, IPv4 header first; it and the event
// are valid only during the tracer's call.
type TraceEvent struct {
	At     Time
	Kind   TraceKind
	Where  string // the host, or the port (as "from>to")
	Reason DropReason
	ID     uint64 // the packet's sequence number; a duplicate shares its original's
	Dup    bool
	Flow   int // the sending endpoint's flow, or -1
	Frame  []byte
}

// Packet parses the event's transport packet; ok is false for pause events and for packets that do
// not parse (after corruption, say).
func (e *TraceEvent) Packet() (wire.Packet, bool) {
	if len(e.Frame) <= headerRoom {
		return wire.Packet{}, false
	}
	p, err := wire.Parse(e.Frame[headerRoom:])
	return p, err == nil
}

// String renders the event on one line:
//
//	12.345us send    h0         #17 10.0.0.1>10.0.0.2 ect RC SEND_FIRST qp=0x000011 psn=0x10b60a payload=4096
func (e *TraceEvent) String() string {
	b := make([]byte, 0, 160)
	b = append(b, fmt.Sprintf("%12.3fus %-7s %-10s", float64(e.At)/float64(Microsecond), e.Kind, e.Where)...)
	if len(e.Frame) < headerRoom {
		return string(b)
	}
	b = append(b, " #"...)
	b = strconv.AppendUint(b, e.ID, 10)
	if e.Dup {
		b = append(b, " dup"...)
	}
	if e.Kind == TraceDrop {
		b = append(b, " ("...)
		b = append(b, e.Reason.String()...)
		b = append(b, ')')
	}
	f := e.Frame
	b = append(b, fmt.Sprintf(" %d.%d.%d.%d>%d.%d.%d.%d", f[12], f[13], f[14], f[15], f[16], f[17], f[18], f[19])...)
	switch f[1] & ecnMask {
	case ecnCE:
		b = append(b, " ce"...)
	case ecnECT0, 1:
		b = append(b, " ect"...)
	}
	b = append(b, ' ')
	if p, ok := e.Packet(); ok {
		b = p.AppendText(b)
	} else {
		b = append(b, "(unparseable)"...)
	}
	return string(b)
}
