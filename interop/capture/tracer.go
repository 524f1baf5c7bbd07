package capture

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"time"

	"github.com/goroce/goroce"
)

// Tracer writes the packets of goroce devices to a Writer: it is a goroce.Tracer for Config.Tracer,
// and Lost takes what an impairment drops (goroce.Impairment.Dropped). One Tracer may serve several
// devices, and is safe for concurrent use.
//
// It writes one record per packet, as a capture on the wire between the devices shows it:
//
//   - A packet a device sends is written when it is sent, outbound, with the IPv4 identification and
//     TOS it was sealed with; a request sent again carries what set the resend off, which the wire
//     cannot show ("resent: timeout", "resent: tail-loss probe"; goroce.TraceEvent.Resent).
//   - A packet a device receives is written, inbound, only if no device traced by the same Writer
//     sent it: otherwise it is on file already.
//   - What befalls a packet after it was sent joins its record as a comment: "lost: injected loss"
//     (Lost), "dropped: " and the device's reason (goroce.TraceEvent.Reason, e.g. "dropped: bad
//     ICRC"), "marked: ECN CE on the way" (received CE-marked, sent without), "duplicate: delivered
//     again by the network" (received more often than sent). That works while the Writer holds the
//     record (Options.Hold); later, the packet is written again as it arrived, with the comment.
//   - A packet a device drops that no traced device sent is written inbound with its comment.
//
// A received packet is matched to the sent one by its addresses and its bytes; a packet a device
// sends again unchanged (a retransmission with the same identification) is two packets, each matched
// once. Completions are not packets: the Tracer passes them, like every packet event, on to the
// Tracer it was made with.
type Tracer struct {
	w    *Writer
	next goroce.Tracer
	seed maphash.Seed
}

// Tracer returns a Tracer that writes to w and then passes every event on to next, if not nil: set
// Config.Tracer to w.Tracer(cfg.Tracer) to capture and keep the tracer a program had.
func (w *Writer) Tracer(next goroce.Tracer) *Tracer {
	return &Tracer{w: w, next: next, seed: maphash.MakeSeed()}
}

var _ goroce.Tracer = (*Tracer)(nil)

// Packet writes e's packet as the type's doc says, then passes e on.
func (t *Tracer) Packet(e *goroce.TraceEvent) {
	t.packet(e)
	if t.next != nil {
		t.next.Packet(e)
	}
}

func (t *Tracer) packet(e *goroce.TraceEvent) {
	w := t.w
	k := t.key(e.From, e.To, e.Bytes)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch e.Dir {
	case goroce.Sent:
		r := w.newRecord(e.At, Outbound)
		r.frame = appendFrame(r.frame, e.From, e.To, e.TOS, e.IPID, e.Bytes)
		if e.Resent != "" {
			r.comments = appendComments(r.comments, "resent: "+e.Resent)
		}
		w.track(k, r, e.TOS)
		w.push(r)
		return
	case goroce.Received:
		s := w.settle(k)
		var note string
		switch {
		case s != nil && s.tos == e.TOS:
			return // on file as it was sent
		case s != nil:
			note = tosNote(s.tos, e.TOS)
			if w.annotate(s, note) {
				return
			}
		case w.seen(k):
			note = "duplicate: delivered again by the network"
		}
		t.write(e, Inbound, note)
	default:
		note := "dropped: " + e.Reason
		if !w.annotate(w.settle(k), note) {
			t.write(e, Inbound, note)
		}
	}
}

// write writes e's packet as it arrived. w.mu is held.
func (t *Tracer) write(e *goroce.TraceEvent, dir Direction, note string) {
	w := t.w
	r := w.newRecord(e.At, dir)
	r.frame = appendFrame(r.frame, e.From, e.To, e.TOS, e.IPID, e.Bytes)
	r.comments = appendComments(r.comments, note)
	w.push(r)
}

// Completion passes the completion on; it writes nothing.
func (t *Tracer) Completion(at time.Time, wc goroce.Completion) {
	if t.next != nil {
		t.next.Completion(at, wc)
	}
}

// Lost records that an impairment dropped the packet b on its way from `from` to `to`: its signature
// is that of goroce.Impairment.Dropped. The comment "lost: injected loss" joins the packet's record if
// a traced device sent it; otherwise, or once that record is written, the packet is written, outbound,
// with the IPv4 identification its ICRC was sealed with (solved from the ICRC, as wire.IDRecovery
// does), the TOS it was sent with if known (else 0: the ICRC does not cover it), and the time it was
// sent if known (else now: the impairment drops it as it is written).
func (t *Tracer) Lost(b []byte, from, to netip.AddrPort) {
	const note = "lost: injected loss"
	w := t.w
	k := t.key(from, to, b)
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.settle(k)
	if w.annotate(s, note) {
		return
	}
	var tos uint8
	if s != nil {
		tos = s.tos
	}
	at := time.Now() // the impairment tells no time: the loss happens as the packet is written
	if s != nil && s.rec != nil && s.rec.gen == s.gen {
		at = s.rec.at // when it was sent, if its record is still at hand
	}
	r := w.newRecord(at, Outbound)
	r.frame = appendFrame(r.frame, from, to, tos, 0, b)
	if is4(from.Addr(), to.Addr()) {
		ip := r.frame[ethHeaderLen : ethHeaderLen+ipv4HeaderLen]
		udp := r.frame[ethHeaderLen+ipv4HeaderLen : ethHeaderLen+ipv4HeaderLen+8]
		if id, _, err := w.idr.VerifyIPv4(ip, udp, b); err == nil && id != 0 {
			r.frame = appendFrame(r.frame[:0], from, to, tos, id, b)
		}
	}
	r.comments = appendComments(r.comments, note)
	w.push(r)
}

// key identifies a packet: its addresses, without zones and IPv4-mapping, and a hash of its bytes.
func (t *Tracer) key(from, to netip.AddrPort, b []byte) key {
	norm := func(a netip.AddrPort) netip.AddrPort {
		return netip.AddrPortFrom(a.Addr().Unmap().WithZone(""), a.Port())
	}
	return key{norm(from), norm(to), maphash.Bytes(t.seed, b)}
}

// ecnCE is the Congestion Experienced codepoint of the TOS byte's ECN bits. RFC 3168 section 5.
const (
	ecnMask = 0x3
	ecnCE   = 0x3
)

// tosNote says how a packet's TOS changed on the way.
func tosNote(sent, got uint8) string {
	if got&ecnMask == ecnCE && sent&ecnMask != ecnCE {
		return "marked: ECN CE on the way"
	}
	return fmt.Sprintf("marked: TOS %#02x on the way (sent %#02x)", got, sent)
}
