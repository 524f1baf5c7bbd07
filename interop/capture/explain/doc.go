// Package explain tells the story of each queue pair in a RoCEv2 capture, from the packets alone: why a
// responder sent a NAK (a PSN sequence error: it expected one PSN and got a later one), which packet a
// retransmission repeats and what set it off (a NAK, a timeout after so many microseconds, an RNR NAK's
// wait, a gap in READ responses, a tail-loss probe), which duplicates a responder answered (a READ response sent
// again from its responder resources, an ACK repeated), which requests one ACK covers (coalescing), how
// the MSN advances, and what CNPs answer.
//
// Analyze takes the RoCEv2 packets of a capture in order (ReadFile reads them from a pcap or pcapng file)
// and returns an Analysis: the queue pairs (Pair), each packet's endpoints and its notes (Note). `goroce
// dump -explain` prints the notes under each packet and a story per pair; `goroce view` shows them in
// the browser.
//
// Everything here is read off the wire. A Note says whether it is a fact of the capture (a field of the
// packet, or a pcapng comment goroce's own capture wrote, such as "lost: injected loss") or an inference
// (Note.Inferred): which packet a NAK's responder got instead of the one it expected, what set off a
// retransmission, which request a duplicate answers. Where goroce sent the packets and its capture
// Tracer wrote them, each request sent again carries its cause from the engine itself ("resent:
// timeout", "resent: tail-loss probe"; goroce.TraceEvent.Resent): that cause is taken as a fact, an
// inference it confirms stops being one, and one it contradicts gives way (Stats.Traced counts them).
//
// The endpoints of a packet are inferred too: a BTH names only the destination QP, so the source QP of
// a reliable-connection request is the destination QP of the responses that answer it, matched by
// their PSNs (Pair.Inferred says when a pairing rests on weaker evidence).
package explain
