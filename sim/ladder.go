package sim

import (
	"fmt"
	"strings"
)

// Ladder records the first packets of one flow between two hosts for a packet ladder diagram: when
// each left its host, and when it arrived or where it was dropped.
type Ladder struct {
	A, B    string // the two hosts, left and right
	Max     int
	Entries []LadderEntry
	byID    map[uint64]int
}

// LadderEntry is one packet on the ladder.
type LadderEntry struct {
	ID      uint64
	FromA   bool
	Sent    Time
	End     Time // arrival, or the drop
	Dropped bool
	Reason  DropReason
	Dup     bool
	Label   string
}

// newLadder records up to max packets of flow between hosts a and b; it chains onto any tracer.
func newLadder(s *Sim, a, b *Host, flow, max int) *Ladder {
	l := &Ladder{A: a.Name, B: b.Name, Max: max, byID: map[uint64]int{}}
	prev := s.tracer
	s.SetTracer(func(e *TraceEvent) {
		if prev != nil {
			prev(e)
		}
		l.record(e, flow)
	})
	return l
}

func (l *Ladder) record(e *TraceEvent, flow int) {
	if e.Flow != flow || len(e.Frame) == 0 {
		return
	}
	i, seen := l.byID[e.ID]
	switch e.Kind {
	case TraceSend:
		if len(l.Entries) >= l.Max {
			return
		}
		label := "?"
		if p, ok := e.Packet(); ok {
			label = shortLabel(p.String())
		}
		l.byID[e.ID] = len(l.Entries)
		l.Entries = append(l.Entries, LadderEntry{ID: e.ID, FromA: e.Where == l.A, Sent: e.At, Label: label})
	case TraceRecv, TraceDrop:
		if !seen {
			return
		}
		en := &l.Entries[i]
		if en.End != 0 { // the second copy of a duplicated packet
			c := *en
			c.Dup, c.Dropped, c.Reason = true, false, DropNone
			l.Entries = append(l.Entries, c)
			en = &l.Entries[len(l.Entries)-1]
		}
		en.End = e.At
		if e.Kind == TraceDrop {
			en.Dropped, en.Reason = true, e.Reason
		}
	}
}

// shortLabel trims a packet's trace text to what fits beside an arrow: the opcode and PSN.
func shortLabel(s string) string {
	f := strings.Fields(s)
	if len(f) < 4 {
		return s
	}
	out := f[1] + " " + strings.TrimPrefix(f[3], "psn=")
	for _, x := range f[4:] {
		switch {
		case x == "ACK" || x == "NAK" || strings.HasPrefix(x, "psn-") || strings.HasPrefix(x, "rnr"):
			out += " " + x
		}
	}
	return out
}

func (e *LadderEntry) String() string {
	dir := "->"
	if !e.FromA {
		dir = "<-"
	}
	end := fmt.Sprintf("arrives %v", e.End.Duration())
	if e.Dropped {
		end = "dropped (" + e.Reason.String() + ")"
	}
	return fmt.Sprintf("%v %s %s %s", e.Sent.Duration(), dir, e.Label, end)
}
