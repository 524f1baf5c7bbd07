package explain

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/goroce/goroce/wire"
)

// channel is one direction of requests in a pair: the requests one QP sends, the responses the other
// returns, and the CNPs that throttle the sender. It replays them in capture order, keeping a model of
// both ends: what the requester has sent and learned, and what the responder expects next.
//
// The model follows IBTA Vol 1 9.7 (reliable service): a responder executes the request with the PSN it
// expects and moves on; a later PSN is a sequence error it NAKs once, naming the PSN it expects; an
// earlier one is a duplicate it answers again without executing it twice (9.7.5.1.6, responder
// resources, for READs and atomics). A requester resends from the PSN a NAK names (go-back-N), after an
// RNR NAK's timer, after its local ACK timeout (9.7.6.1.3, transport timer), and re-requests a READ
// from the first response PSN it misses.
type channel struct {
	req, resp *Endpoint
	pair      *Pair
	st        *Stats
	tr        wire.Transport
	pkts      []*pkt
	pmtu      int

	// The requester.
	started  bool
	next     wire.PSN          // the PSN of the next new request
	origs    []*sendRec        // new requests, in PSN order
	lastTx   map[wire.PSN]*pkt // the latest request sent with each PSN
	cause    *cause            // the latest response that calls for a resend, not yet acted on
	burst    *pkt              // the retransmission that began the resend under way
	burstTo  wire.PSN          // the PSN the resend under way goes on with
	rnrs     map[wire.PSN]int  // RNR NAKs per PSN
	read     bool              // the requester waits for READ responses from readAt
	readAt   wire.PSN          // the next READ response PSN it waits for
	reqs     []*pkt            // every request, for rates
	rcvAck   *pkt              // the response that told the requester the most, of those that arrived
	rcvAckTo wire.PSN          // the PSN up to which it did
	lostRsp  []*pkt            // responses the capture says were lost, for timeouts

	// The responder.
	rStarted bool
	ePSN     wire.PSN // the PSN it expects next
	nakState bool     // it NAKed a sequence error and waits for ePSN
	seqErr   *pkt     // the first later PSN it got since it began to wait for ePSN
	dups     []*pkt   // duplicate requests it got and has not answered yet
	ackIdx   int      // origs[ackIdx:] are not acknowledged yet
	acked    bool     // it has acknowledged something
	ackedTo  wire.PSN // the last PSN it acknowledged
	lastAck  *pkt     // its last ACK
	msn      wire.MSN
	msnAt    *pkt // the packet that carried msn, nil before the first
	respTx   map[wire.PSN]*pkt

	pos int // the index in pkts of the packet being replayed

	// Congestion.
	lastCE  *pkt
	ceSince int
	lastCNP *pkt
}

// sendRec is a request the requester sent for the first time.
type sendRec struct {
	p    *pkt
	psn  wire.PSN
	span uint32 // the PSNs it takes: the responses a READ asks for, one otherwise
}

// cause is a response that makes the requester resend: a NAK, an RNR NAK, a gap in READ responses.
type cause struct {
	kind causeKind
	p    *pkt
	psn  wire.PSN // the PSN to resend from
}

type causeKind uint8

const (
	causeNAK causeKind = iota
	causeRNR
	causeReadGap
)

type chanKey struct{ req, resp *Endpoint }

// channels groups the RC and UC packets into channels, in the order they first appear.
func (a *Analysis) channels(ps []*pkt) []*channel {
	m := map[chanKey]*channel{}
	var order []*channel
	for _, p := range ps {
		if !p.ok || p.ex.Pair == nil {
			continue
		}
		tr := p.info.Transport
		if tr != wire.TransportRC && tr != wire.TransportUC && tr != wire.TransportCNP {
			continue
		}
		k := chanKey{p.ex.From, p.ex.To}
		if p.role != RoleRequest {
			k = chanKey{p.ex.To, p.ex.From}
		}
		c, ok := m[k]
		if !ok {
			c = &channel{req: k.req, resp: k.resp, pair: p.ex.Pair, st: &p.ex.Pair.Stats, tr: tr,
				lastTx: map[wire.PSN]*pkt{}, rnrs: map[wire.PSN]int{},
				respTx: map[wire.PSN]*pkt{}}
			m[k] = c
			order = append(order, c)
		}
		if c.tr == wire.TransportCNP {
			c.tr = tr
		}
		c.pkts = append(c.pkts, p)
		if pos := p.info.Pos; (pos == wire.PosFirst || pos == wire.PosMiddle) && p.err == "" {
			c.pmtu = max(c.pmtu, p.payload)
		}
	}
	return order
}

// run replays the channel's packets.
func (c *channel) run() {
	for i, p := range c.pkts {
		c.pos = i
		switch {
		case p.role == RoleCNP:
			c.cnp(p)
		case c.tr == wire.TransportUC:
			c.uc(p)
		case p.role == RoleRequest:
			c.request(p)
		default:
			c.response(p)
		}
	}
}

// span is the number of PSNs the request p takes.
func (c *channel) span(p *pkt) uint32 {
	if p.info.Op != wire.OpReadRequest {
		return 1
	}
	if c.pmtu > 0 {
		return readSpan(p.dmaLen, c.pmtu)
	}
	// No first or middle packet shows the path MTU. A READ that fits the smallest MTU has one response;
	// for a larger one, its responses show how many there were: from its PSN to the first that ends a
	// message.
	if int(p.dmaLen) <= wire.MTU256.Bytes() {
		return 1
	}
	end, found := wire.PSN(0), false
	for _, q := range c.pkts {
		if q.role != RoleResponse || q.info.Op != wire.OpReadResponse || !q.info.Pos.EndsMessage() {
			continue
		}
		if d := q.bth.PSN.Diff(p.bth.PSN); d >= 0 && d < maxReadSpan && (!found || q.bth.PSN.Before(end)) {
			end, found = q.bth.PSN, true
		}
	}
	if !found {
		return 1
	}
	return uint32(end.Diff(p.bth.PSN)) + 1
}

// find returns the new request whose PSNs hold psn, or nil.
func (c *channel) find(psn wire.PSN) *sendRec {
	if len(c.origs) == 0 {
		return nil
	}
	base := c.origs[0].psn
	d := psn.Diff(base)
	i := sort.Search(len(c.origs), func(i int) bool { return c.origs[i].psn.Diff(base) > d }) - 1
	if i < 0 {
		return nil
	}
	if r := c.origs[i]; psn.InWindow(r.psn, r.span) {
		return r
	}
	return nil
}

// request handles a request the requester sends.
func (c *channel) request(p *pkt) {
	psn := p.bth.PSN
	span := c.span(p)
	c.reqs = append(c.reqs, p)
	switch {
	case !c.started || !psn.Before(c.next):
		if c.started && psn.After(c.next) {
			p.note(KindInfo, true, "the PSN jumps from %v to %v: the capture lacks %s", c.next, psn,
				plural(int(psn.Diff(c.next)), "PSN"))
		}
		c.started = true
		c.origs = append(c.origs, &sendRec{p: p, psn: psn, span: span})
		c.next = psn.Add(span)
		c.burst = nil
		if p.info.Pos.EndsMessage() {
			c.st.Messages++
		}
		if p.info.Op == wire.OpReadRequest {
			resp := "one response packet, PSN " + psn.String()
			if span > 1 {
				resp = plural(int(span), "response packet") + ", PSNs " + psn.String() + ".." + psn.Add(span-1).String()
			}
			p.note(KindInfo, c.pmtu == 0 && span == 1, "READ of %d bytes: the responder answers with %s (the READ takes them all: the next request's PSN is %v)",
				p.dmaLen, resp, c.next)
			c.expectRead(psn)
		}
	case p.copied:
		if o := c.lastTx[psn]; o != nil {
			p.note(KindDuplicate, false, "a copy of #%d the network made, not a retransmission: the responder gets PSN %v twice", o.frame(), psn)
		}
	default:
		c.retransmit(p, span)
	}
	c.lastTx[psn] = p
	if p.ce {
		c.lastCE = p
		c.ceSince++
	}
	if p.arrived() {
		c.arrive(p, span)
	}
}

// traced settles a retransmission's note against the cause its sender traced (its "resent:" comment):
// an inference the trace confirms is no longer one; one it contradicts gives way to the trace.
func (c *channel) traced(p *pkt) {
	if p.resent == "" || len(p.notes) == 0 {
		return
	}
	n := &p.notes[len(p.notes)-1]
	if n.Kind != KindRetransmit {
		return
	}
	agree := map[string]string{"NAK": "the NAK", "NAK to a tail-loss probe": "the NAK", "timeout": "timer expired",
		"RNR NAK": "the RNR NAK", "implied NAK": "READ response"}[p.resent]
	switch {
	case agree != "" && strings.Contains(n.Text, agree):
		n.Inferred = false
		n.Text += " (so the sender's own trace says)"
	case strings.Contains(n.Text, "going on with the resend"):
		n.Inferred = false // a later packet of a resend the trace explained at its start
	default:
		n.Inferred = false
		n.Text = "resends PSN " + p.bth.PSN.String() + ": the sender's own trace says a " + p.resent + " set it off, which the capture alone does not show"
	}
}

// expectRead notes that the requester waits for READ responses from psn, unless it waits already.
func (c *channel) expectRead(psn wire.PSN) {
	if !c.read {
		c.read, c.readAt = true, psn
	}
}

// retransmit explains a request sent again.
func (c *channel) retransmit(p *pkt, span uint32) {
	psn := p.bth.PSN
	c.st.Retransmits++
	orig := c.find(psn)
	prev := c.lastTx[psn]
	what := "PSN " + psn.String()
	var sent string
	switch {
	case orig != nil && orig.psn != psn && orig.p.info.Op == wire.OpReadRequest:
		what = "the rest of READ #" + itoa(orig.p.frame()) + " from PSN " + psn.String()
		if p.reth && orig.p.reth && p.va >= orig.p.va {
			what += ", " + itoa(int(p.va-orig.p.va)) + " bytes in, " + itoa(int(p.dmaLen)) + " bytes"
		}
		if prev != nil {
			sent = ", last asked as #" + itoa(prev.frame())
		}
	case orig != nil:
		sent = " (first sent as #" + itoa(orig.p.frame())
		if prev != nil && prev != orig.p {
			sent += ", last as #" + itoa(prev.frame())
		}
		sent += ")"
	}
	if p.info.Op == wire.OpReadRequest {
		c.read, c.readAt = true, psn
	}
	if p.resent != "" {
		c.st.Traced++
	}
	if p.resent == "tail-loss probe" {
		// Not go-back-N: one packet, and the resend it may lead to starts with the answer.
		c.st.Probes++
		ref := prev
		if ref == nil && orig != nil {
			ref = orig.p
		}
		after := ""
		if ref != nil {
			after = " " + fmtDur(p.in.At.Sub(ref.in.At)) + " after #" + itoa(ref.frame())
		}
		p.note(KindRetransmit, false, "resends %s%s as a tail-loss probe%s: nothing had come back for twice the measured round trip, so the requester sends its last packet again with AckReq; the answer, an ACK through it or a PSN sequence NAK for the first packet missing, tells what became of the tail (the sender's own trace)",
			what, sent, after)
		return
	}
	defer c.traced(p)

	cs := c.cause
	switch {
	case cs != nil:
		c.cause = nil
		c.burst, c.burstTo = p, psn.Add(span)
		gap := fmtDur(p.in.At.Sub(cs.p.in.At))
		switch cs.kind {
		case causeNAK:
			c.st.AfterNAK++
			from := ""
			if cs.psn != psn {
				from = " (it asked for PSN " + cs.psn.String() + ")"
			}
			p.note(KindRetransmit, true, "resends %s%s %s after the NAK #%d%s: go-back-N, the requester sends everything from the PSN the NAK names again",
				what, sent, gap, cs.p.frame(), from)
		case causeRNR:
			c.st.AfterRNR++
			soon := ""
			if p.in.At.Sub(cs.p.in.At) < cs.p.syn.RNRTimer() {
				soon = ", sooner than that"
			}
			p.note(KindRetransmit, true, "resends %s%s %s after the RNR NAK #%d, which asked it to wait at least %s%s",
				what, sent, gap, cs.p.frame(), fmtDur(cs.p.syn.RNRTimer()), soon)
		case causeReadGap:
			c.st.AfterReadGap++
			p.note(KindRetransmit, true, "asks again for %s: READ response PSN %v never reached the requester, which got #%d (PSN %v) %s before",
				what, cs.psn, cs.p.frame(), cs.p.bth.PSN, gap)
		}
	case c.burst != nil && psn == c.burstTo:
		c.st.InBurst++
		c.burstTo = psn.Add(span)
		p.note(KindRetransmit, true, "resends %s%s, going on with the resend #%d began", what, sent, c.burst.frame())
	default:
		c.st.AfterTimeout++
		c.burst, c.burstTo = p, psn.Add(span)
		ref := prev
		if ref == nil && orig != nil {
			ref = orig.p
		}
		if ref == nil {
			p.note(KindRetransmit, true, "resends %s, which the capture does not show sent before", what)
			return
		}
		gap := fmtDur(p.in.At.Sub(ref.in.At))
		if a := c.rcvAck; a != nil && !psn.After(c.rcvAckTo) && a.in.Frame > ref.in.Frame {
			p.note(KindRetransmit, true, "resends %s%s %s after #%d, though #%d acknowledged it %s before: the requester did not take that ACK (it dropped it on arrival, or it came too late), and its local ACK timer expired",
				what, sent, gap, ref.frame(), a.frame(), fmtDur(p.in.At.Sub(a.in.At)))
			return
		}
		p.note(KindRetransmit, true, "resends %s%s %s after #%d with no ACK for it in between: the requester's local ACK timer expired%s",
			what, sent, gap, ref.frame(), c.whyNoAck(ref, psn))
	}
}

// whyNoAck says why the requester had no ACK for psn after ref: ref was lost, or the ACK was.
func (c *channel) whyNoAck(ref *pkt, psn wire.PSN) string {
	if !ref.arrived() {
		return "; #" + itoa(ref.frame()) + " never arrived (" + ref.lost + ")"
	}
	for i := len(c.lostRsp) - 1; i >= 0; i-- {
		q := c.lostRsp[i]
		if q.in.At.Before(ref.in.At) && q.in.Frame < ref.in.Frame {
			break
		}
		if !q.bth.PSN.Before(psn) {
			return "; the response that answered it, #" + itoa(q.frame()) + ", was lost (" + q.lost + ")"
		}
	}
	return "; the capture shows no answer that was lost: the responder did not answer in time, or the loss was out of the capture's sight"
}

// arrive updates the responder's model with a request it got.
func (c *channel) arrive(p *pkt, span uint32) {
	psn := p.bth.PSN
	if !c.rStarted {
		c.rStarted, c.ePSN = true, psn
	}
	switch {
	case psn == c.ePSN:
		c.ePSN = psn.Add(span)
		c.nakState, c.seqErr = false, nil
	case psn.After(c.ePSN):
		if c.seqErr == nil && !c.nakState {
			c.seqErr = p
		}
	default:
		c.dups = append(c.dups, p)
	}
}

// takeDup returns the latest duplicate request with a PSN in [from, to] the responder got and has not
// answered, and forgets it and the ones before it.
func (c *channel) takeDup(from, to wire.PSN) *pkt {
	for i := len(c.dups) - 1; i >= 0; i-- {
		d := c.dups[i]
		if !d.bth.PSN.Before(from) && !d.bth.PSN.After(to) {
			c.dups = c.dups[i+1:]
			return d
		}
	}
	return nil
}

// takeDups returns the duplicate requests with a PSN up to psn the responder got and has not answered,
// and forgets them.
func (c *channel) takeDups(psn wire.PSN) []*pkt {
	var ds, rest []*pkt
	for _, d := range c.dups {
		if d.bth.PSN.After(psn) {
			rest = append(rest, d)
		} else {
			ds = append(ds, d)
		}
	}
	c.dups = rest
	return ds
}

// response handles a response the responder sends.
func (c *channel) response(p *pkt) {
	if !p.arrived() {
		c.lostRsp = append(c.lostRsp, p)
	}
	switch p.info.Op {
	case wire.OpAcknowledge:
		switch p.syn.Kind() {
		case wire.KindACK:
			c.ack(p)
		case wire.KindRNRNAK:
			c.rnr(p)
		case wire.KindNAK:
			if p.syn.NAKCode() == wire.NAKPSNSequenceError {
				c.nakSeq(p)
			} else {
				c.nakErr(p)
			}
		}
	case wire.OpReadResponse:
		c.readResponse(p)
	case wire.OpAtomicAcknowledge:
		c.atomicAck(p)
	}
}

// ack explains a positive acknowledgment.
func (c *channel) ack(p *pkt) {
	psn := p.bth.PSN
	c.st.ACKs++
	c.ackOnReadAtomic(p, psn)
	if c.acked && !psn.After(c.ackedTo) {
		c.st.Duplicates++
		switch ds := c.takeDups(psn); len(ds) {
		case 0:
			p.note(KindDuplicate, true, "acknowledges PSN %v again, with nothing new since #%d", psn, c.lastAck.frame())
		case 1:
			p.note(KindDuplicate, true, "acknowledges PSN %v again, for #%d: the responder had executed PSN %v already, so it answers the duplicate without executing it twice, and a requester that lost the first ACK can go on",
				psn, ds[0].frame(), ds[0].bth.PSN)
		default:
			p.note(KindDuplicate, true, "acknowledges PSN %v again, for the duplicates #%d..#%d: the responder had executed them already, so it answers without executing them twice, and a requester that lost the first ACK can go on",
				psn, ds[0].frame(), ds[len(ds)-1].frame())
		}
		c.lastAck = p
	} else {
		c.cover(p, psn, true)
	}
	c.msnNote(p, true)
	c.raiseEPSN(psn.Add(1))
}

// ackOnReadAtomic warns of a plain ACK whose PSN is the last PSN of a READ or atomic: it says the
// request was done but carries none of what it returns. A requester must take it for a lost response
// and ask again (IBTA Vol 1 9.7.5.1.4, implied NAK); rxe's completer takes it for the READ's
// completion, with no data placed (rxe_comp.c check_ack). A responder avoids it by ACKing duplicates
// with the PSN of the last SEND or WRITE, as rxe does.
func (c *channel) ackOnReadAtomic(p *pkt, psn wire.PSN) {
	r := c.find(psn)
	if r == nil || r.psn.Add(r.span-1) != psn {
		return
	}
	what := ""
	switch r.p.info.Op {
	case wire.OpReadRequest:
		what = "READ"
	case wire.OpCompareSwap, wire.OpFetchAdd:
		what = "atomic"
	default:
		return
	}
	c.st.AckOnReadAtomic++
	p.note(KindError, true, "a plain ACK with PSN %v, the last PSN of the %s #%d: it carries none of the %s's data, so the requester must take it for a lost response and ask again; rxe's completer instead completes the %s with nothing placed",
		psn, what, r.p.frame(), what, what)
}

// cover notes which requests a response acknowledges, up to psn, and advances the acknowledged PSN.
func (c *channel) cover(p *pkt, psn wire.PSN, say bool) {
	var first, last *sendRec
	n := 0
	for c.ackIdx < len(c.origs) && !c.origs[c.ackIdx].psn.After(psn) {
		r := c.origs[c.ackIdx]
		if first == nil {
			first = r
		}
		last = r
		n++
		if r.span > 1 && r.psn.Add(r.span-1).After(psn) {
			break // a READ whose responses go on past psn
		}
		c.ackIdx++
	}
	if !c.acked || psn.After(c.ackedTo) {
		c.acked, c.ackedTo, c.lastAck = true, psn, p
	}
	if p.arrived() && (c.rcvAck == nil || psn.After(c.rcvAckTo)) {
		c.rcvAck, c.rcvAckTo = p, psn
	}
	c.st.MaxCoalesced = max(c.st.MaxCoalesced, n)
	if !say || first == nil {
		return
	}
	if n == 1 {
		req := ""
		if first.p.bth.AckReq {
			req = ", which asked for an ACK"
		}
		p.note(KindAck, false, "acknowledges PSN %v (#%d%s)", first.psn, first.p.frame(), req)
		return
	}
	p.note(KindAck, false, "acknowledges %s at once, PSNs %v..%v (#%d..#%d): an ACK covers every request up to its PSN, so one answers many (coalescing)",
		plural(n, "request packet"), first.psn, psn, first.p.frame(), last.p.frame())
}

// msnNote explains the MSN of a response that carries an AETH.
func (c *channel) msnNote(p *pkt, say bool) {
	if !p.aeth {
		return
	}
	m := p.msn
	c.st.MSN = int(m)
	prev := c.msnAt
	c.msn, c.msnAt = m, p
	if !say {
		return
	}
	if prev == nil {
		p.note(KindAck, false, "MSN %d: the responder has completed %s on this QP", m, plural(int(m), "message"))
		return
	}
	d := int((uint32(m) - uint32(prev.msn)) & 0xFFFFFF) // the MSN is 24 bits and wraps
	if d > 0 {
		p.note(KindAck, false, "MSN %d: %s completed since #%d", m, plural(d, "more message"), prev.frame())
	}
}

// raiseEPSN tells the responder's model what a response shows: the responder expects psn at least.
func (c *channel) raiseEPSN(psn wire.PSN) {
	if !c.rStarted || c.ePSN.Before(psn) {
		c.rStarted, c.ePSN = true, psn
	}
}

// nakSeq explains a NAK for a PSN sequence error.
func (c *channel) nakSeq(p *pkt) {
	e := p.bth.PSN
	c.st.NAKs++
	p.note(KindNAK, false, "NAK, PSN sequence error: the responder expected PSN %v; the NAK acknowledges every PSN before it and asks for everything from %v again", e, e)
	got := "a later PSN"
	if s := c.seqErr; s != nil && !s.bth.PSN.Before(e) {
		got = "PSN " + s.bth.PSN.String() + " (#" + itoa(s.frame()) + ")"
	}
	tx := c.lastTx[e]
	if tx == nil {
		if r := c.find(e); r != nil {
			tx = r.p
		}
	}
	var why string
	switch {
	case tx == nil:
		why = "the capture has no packet with PSN " + e.String()
	case !tx.arrived():
		why = "#" + itoa(tx.frame()) + ", which carried PSN " + e.String() + ", never arrived (" + tx.lost + ")"
	default:
		why = "#" + itoa(tx.frame()) + ", which carried PSN " + e.String() + ", did not arrive, or came after it"
	}
	p.note(KindNAK, true, "it got %s instead: %s", got, why)
	c.ePSN, c.rStarted, c.nakState, c.seqErr = e, true, true, nil
	c.cover(p, e.Sub(1), false)
	if p.arrived() {
		c.cause = &cause{causeNAK, p, e}
	}
}

// rnr explains an RNR NAK.
func (c *channel) rnr(p *pkt) {
	psn := p.bth.PSN
	c.st.RNRNAKs++
	c.rnrs[psn]++
	req := ""
	if tx := c.lastTx[psn]; tx != nil {
		req = " (#" + itoa(tx.frame()) + ")"
	}
	nth := ""
	if n := c.rnrs[psn]; n > 1 {
		nth = "; it is the " + ordinal(n) + " for this PSN"
	}
	p.note(KindNAK, false, "RNR NAK (receiver not ready): no receive was posted for the SEND with PSN %v%s; the requester is to wait at least %s, the syndrome's RNR timer, and send it again%s",
		psn, req, fmtDur(p.syn.RNRTimer()), nth)
	c.ePSN, c.rStarted, c.nakState, c.seqErr = psn, true, false, nil
	c.cover(p, psn.Sub(1), false)
	if p.arrived() {
		c.cause = &cause{causeRNR, p, psn}
	}
}

// nakErr explains a NAK for a remote error.
func (c *channel) nakErr(p *pkt) {
	psn := p.bth.PSN
	c.st.ErrorNAKs++
	req := ""
	if tx := c.lastTx[psn]; tx != nil {
		req = " (#" + itoa(tx.frame()) + ", " + OpcodeName(tx.bth.Opcode) + ")"
	}
	var why string
	switch p.syn.NAKCode() {
	case wire.NAKInvalidRequest:
		why = "invalid request: an operation it does not support or allow on this QP, or a malformed request"
	case wire.NAKRemoteAccessError:
		why = "remote access error: the R_Key, the address or the length lies outside what the memory region allows"
	case wire.NAKRemoteOperationalError:
		why = "remote operational error: the responder failed while carrying the request out"
	default:
		why = p.syn.String()
	}
	p.note(KindError, false, "NAK: the responder refused the request with PSN %v%s, %s; the requester completes the work request in error and its QP goes to the error state, nothing is resent",
		psn, req, why)
	c.cover(p, psn.Sub(1), false)
}

// readResponse explains a READ response.
func (c *channel) readResponse(p *pkt) {
	psn := p.bth.PSN
	rd := c.find(psn)
	first := p.info.Pos.StartsMessage()
	if o, ok := c.respTx[psn]; ok {
		c.st.Duplicates++
		if first {
			if d := c.takeDup(psn, psn); d != nil {
				p.note(KindDuplicate, true, "sends READ response PSN %v again (first sent as #%d): it answers #%d, which asked again from PSN %v; the responder keeps recent READs (its responder resources) so it can answer a repeat",
					psn, o.frame(), d.frame(), psn)
			} else {
				p.note(KindDuplicate, true, "sends READ response PSN %v again (first sent as #%d)", psn, o.frame())
			}
		} else {
			p.note(KindDuplicate, true, "sends PSN %v again (first sent as #%d)", psn, o.frame())
		}
	} else {
		c.respTx[psn] = p
		if first && rd != nil {
			if rd.span > 1 {
				p.note(KindInfo, false, "answers READ #%d (PSNs %v..%v): response %d of %d", rd.p.frame(), rd.psn,
					rd.psn.Add(rd.span-1), psn.Diff(rd.psn)+1, rd.span)
			} else {
				p.note(KindInfo, false, "answers READ #%d", rd.p.frame())
			}
		}
	}
	if p.aeth {
		c.cover(p, psn, false)
		c.msnNote(p, p.info.Pos.EndsMessage())
	}
	c.raiseEPSN(psn.Add(1))
	if !p.arrived() || !c.read {
		return
	}
	switch {
	case psn == c.readAt:
		c.readAt = psn.Add(1)
		if rd != nil && c.readAt == rd.psn.Add(rd.span) {
			c.read = false
			if r := c.find(c.readAt); r != nil && r.p.info.Op == wire.OpReadRequest && r.psn == c.readAt {
				c.read = true
			}
		}
	case psn.After(c.readAt):
		p.note(KindRetransmit, true, "the requester waited for READ response PSN %v and got %v: it drops this one and asks again from %v%s",
			c.readAt, psn, c.readAt, c.missing(c.readAt))
		c.cause = &cause{causeReadGap, p, c.readAt}
		c.read = false
	}
}

// missing says what became of the response with PSN psn.
func (c *channel) missing(psn wire.PSN) string {
	for i := len(c.lostRsp) - 1; i >= 0; i-- {
		if q := c.lostRsp[i]; q.bth.PSN == psn {
			return " (#" + itoa(q.frame()) + ", which carried it, was " + q.lost + ")"
		}
	}
	return ""
}

// atomicAck explains an atomic acknowledgment.
func (c *channel) atomicAck(p *pkt) {
	psn := p.bth.PSN
	if o, ok := c.respTx[psn]; ok {
		c.st.Duplicates++
		d := c.takeDup(psn, psn)
		if d != nil {
			p.note(KindDuplicate, true, "replays the result first sent as #%d for #%d, the atomic sent again: the responder keeps its atomic results so that a repeat is not executed twice", o.frame(), d.frame())
		} else {
			p.note(KindDuplicate, true, "sends the result first sent as #%d again", o.frame())
		}
	} else {
		c.respTx[psn] = p
		if r := c.find(psn); r != nil {
			p.note(KindInfo, false, "answers %s #%d: orig is the value the responder's memory held before it", OpcodeName(r.p.bth.Opcode), r.p.frame())
		}
	}
	c.cover(p, psn, false)
	c.msnNote(p, true)
	c.raiseEPSN(psn.Add(1))
}

// uc explains an unreliable-connection packet: it has PSNs but no responses and no resends.
func (c *channel) uc(p *pkt) {
	psn := p.bth.PSN
	switch {
	case !c.started || psn == c.next:
	case psn.After(c.next):
		c.st.PSNGaps++
		p.note(KindNAK, true, "PSNs %v..%v are missing: UC never resends, so the receiver drops the message they belonged to and waits for the next first or only packet",
			c.next, psn.Sub(1))
	default:
		p.note(KindDuplicate, true, "PSN %v again: UC does not resend, so this is a copy", psn)
	}
	if !c.started || psn.After(c.next) || psn == c.next {
		c.started, c.next = true, psn.Add(1)
		if p.info.Pos.EndsMessage() {
			c.st.Messages++
		}
	}
}

// rateWindow is the number of packets before and after a CNP over which the sender's rate is measured.
const rateWindow = 16

// cnp explains a congestion notification packet.
func (c *channel) cnp(p *pkt) {
	p.note(KindCongestion, false, "CNP to %v: the receiver got packets of this flow marked CE by a congested switch and asks the sender to slow down; with DCQCN the sender cuts its rate when the CNP arrives",
		c.req)
	if c.lastCE != nil {
		since := " since the flow began"
		if c.lastCNP != nil {
			since = " since the CNP #" + itoa(c.lastCNP.frame())
		}
		p.note(KindCongestion, true, "the latest marked packet before it is #%d, %s%s", c.lastCE.frame(),
			plural(c.ceSince, "marked packet"), since)
	}
	// The CNP takes a while to reach the sender: allow it as long as the marked packet took to become
	// this CNP.
	var lag time.Duration
	if c.lastCE != nil {
		lag = p.in.At.Sub(c.lastCE.in.At)
	}
	c.lastCNP, c.ceSince = p, 0
	before, after := c.rate(p.in.At, lag)
	if before > 0 && after > 0 {
		p.note(KindCongestion, true, "the sender's packets went out at %.2f Gb/s over the %d before it and at %.2f Gb/s over %d from %s after it, when the CNP has had time to arrive (from their median spacing)",
			before/1e9, rateWindow, after/1e9, rateWindow, fmtDur(lag))
	}
}

// rate returns the sender's rate in bits per second over the rateWindow requests before t and over as
// many from lag after t, or 0 where there are too few: a packet's bits over the median gap between two, which a pause of the
// sender's (an empty window, a PFC pause) does not skew.
func (c *channel) rate(t time.Time, lag time.Duration) (before, after float64) {
	i := 0
	for i < len(c.reqs) && !c.reqs[i].in.At.After(t) {
		i++
	}
	measure := func(ps []*pkt) float64 {
		if len(ps) < rateWindow {
			return 0
		}
		gaps := make([]time.Duration, 0, len(ps)-1)
		bits := 0
		for j, q := range ps[1:] {
			gaps = append(gaps, q.in.At.Sub(ps[j].in.At))
			bits += 8 * q.in.IPLen
		}
		slices.Sort(gaps)
		if g := gaps[len(gaps)/2]; g > 0 {
			return float64(bits) / float64(len(gaps)) / g.Seconds()
		}
		return 0
	}
	if i >= rateWindow {
		before = measure(c.reqs[i-rateWindow : i])
	}
	// The requests after t are not replayed yet: look ahead in the channel's packets.
	var next []*pkt
	for _, q := range c.pkts[c.pos:] {
		if q.role == RoleRequest && q.in.At.After(t.Add(lag)) {
			next = append(next, q)
			if len(next) == rateWindow {
				break
			}
		}
	}
	after = measure(next)
	return before, after
}
