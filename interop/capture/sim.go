package capture

import (
	"time"

	"github.com/goroce/goroce/sim"
)

// SimTracer returns a tracer for sim.Sim.SetTracer that writes the simulated packets, stamped in
// virtual time: epoch plus the simulator's clock (the zero epoch is taken as the Unix epoch, so that
// the file's clock reads as the run's). It passes every event on to next, if not nil.
//
// The simulator's datagrams are written as they are, IPv4 and UDP headers included (10.0.x.y
// addresses, identification 0 with DF, UDP checksum 0 as RoCEv2 NICs send it), behind an Ethernet
// header with synthetic MACs. As the device Tracer does, it writes one record per packet, when a host
// sends it; what befalls it after joins that record as a comment while the Writer holds it, naming the
// port or host where it happened: "lost: link loss (h0>h1)", "dropped: queue-full (sw0>r)",
// "dropped: bad ICRC (h1)", "marked: ECN CE (sw0>r)", "corrupted: a bit flipped (h0>h1)" (the
// record keeps the bytes as sent; a packet written again later has the bytes as they were then).
// A copy a link makes is written when it arrives, with "duplicate: copied by the network". PFC pause
// and resume events carry no packet and are not written.
//
// Like a sim.Sim, the returned function must not be called concurrently.
func (w *Writer) SimTracer(epoch time.Time, next func(*sim.TraceEvent)) func(*sim.TraceEvent) {
	if epoch.IsZero() {
		epoch = time.Unix(0, 0).UTC()
	}
	return func(e *sim.TraceEvent) {
		w.simEvent(epoch, e)
		if next != nil {
			next(e)
		}
	}
}

func (w *Writer) simEvent(epoch time.Time, e *sim.TraceEvent) {
	if len(e.Frame) == 0 {
		return // a PFC pause or resume
	}
	at := epoch.Add(e.At.Duration())
	k := key{sum: e.ID << 1}
	if e.Dup {
		k.sum |= 1
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.Kind == sim.TraceSend || (e.Dup && !w.seen(k)) {
		// A packet's first appearance: sent by a host, or a link's copy of one seen for the first time.
		r := w.newRecord(at, Outbound)
		if e.Dup {
			r.dir = NoDirection
			if e.Kind == sim.TraceRecv {
				r.dir = Inbound
			}
			r.comments = appendComments(r.comments, "duplicate: copied by the network", simNote(e))
		}
		r.frame = appendEthernet(r.frame, e.Frame)
		if e.Kind == sim.TraceSend || e.Kind == sim.TraceMark || e.Kind == sim.TraceCorrupt {
			w.track(k, r, e.Frame[1]) // more events for it follow
		}
		w.push(r)
		return
	}
	var s *sent
	dir := NoDirection
	switch e.Kind {
	case sim.TraceRecv:
		if s = w.settle(k); s != nil {
			return // on file as it was sent
		}
		dir = Inbound
	case sim.TraceDrop:
		s = w.settle(k)
	case sim.TraceMark, sim.TraceCorrupt:
		s = w.lookup(k)
	default:
		return
	}
	note := simNote(e)
	if w.annotate(s, note) {
		return
	}
	r := w.newRecord(at, dir)
	r.frame = appendEthernet(r.frame, e.Frame)
	r.comments = appendComments(r.comments, note)
	w.push(r)
}

// simNote words what a simulator event did to a packet, or returns "" for a send or a reception.
func simNote(e *sim.TraceEvent) string {
	switch e.Kind {
	case sim.TraceMark:
		return "marked: ECN CE (" + e.Where + ")"
	case sim.TraceCorrupt:
		return "corrupted: a bit flipped (" + e.Where + ")"
	case sim.TraceDrop:
		switch e.Reason {
		case sim.DropLoss:
			return "lost: link loss (" + e.Where + ")"
		case sim.DropICRC:
			return "dropped: bad ICRC (" + e.Where + ")"
		}
		return "dropped: " + e.Reason.String() + " (" + e.Where + ")"
	}
	return ""
}
