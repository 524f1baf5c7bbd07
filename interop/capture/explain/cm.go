package explain

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// The connection manager's MADs on QP1 (IBTA Vol 1 chapter 12), told as connections: which side asks
// for which service, what each answer means, which MADs are resent (the same transaction ID and
// communication ID again: the sender's timeout ran out, or its peer's answer was lost), and the CMA
// header rdma_cm puts in a REQ (IBTA Vol 1 Annex A11).

// gsiQPN is the general services QP that CM MADs go to. IBTA Vol 1 13.5.1.
const gsiQPN wire.QPN = 1

// CMConn is one connection of the connection manager, as its MADs tell it: REQ, MRA, REP, RTU, REJ,
// DREQ, DREP, or a SIDR_REQ and its SIDR_REP for a UD service.
type CMConn struct {
	ID              int        // from 1, in the order the connections first appear
	Active, Passive netip.Addr // the side that sent the REQ (or SIDR_REQ), the side it asked
	ServiceID       uint64
	SIDR            bool
	Frames          []int    // its MADs' frames, in capture order
	Pair            *Pair    // the conversation of the QPs it connected, if the capture has it
	Story           []string // a sentence each
}

// String names the connection: "REQ 10.0.0.1 -> 10.0.0.2 rdma_cm TCP port 7174".
func (c *CMConn) String() string {
	what := "REQ"
	if c.SIDR {
		what = "SIDR_REQ"
	}
	return fmt.Sprintf("%s %v -> %v %s", what, c.Active, c.Passive, service(c.ServiceID))
}

// service names a service ID: rdma_cm's port space and port when it is of that form (Annex A11).
func service(sid uint64) string {
	if ps, port, ok := mad.ParseServiceID(sid); ok && knownPortSpace(ps) {
		return fmt.Sprintf("rdma_cm %v port %d (service ID %#x)", ps, port, sid)
	}
	return fmt.Sprintf("service ID %#016x", sid)
}

func knownPortSpace(ps mad.PortSpace) bool {
	switch ps {
	case mad.PortSpaceIPoIB, mad.PortSpaceTCP, mad.PortSpaceUDP, mad.PortSpaceIB:
		return true
	}
	return false
}

// cmTimeout returns what a 5-bit CM timeout code stands for: 4.096 us x 2^code. IBTA Vol 1 12.6.5.
func cmTimeout(code uint8) time.Duration { return 4096 * time.Nanosecond << min(code, 31) }

// cmKey names a connection by one side's address and its communication ID (a SIDR_REQ's request ID).
type cmKey struct {
	addr netip.Addr
	id   uint32
	sidr bool
}

// madKey names one MAD as its sender resends it: the same attribute and transaction ID.
type madKey struct {
	from netip.Addr
	attr mad.AttributeID
	tid  uint64
}

// cmState follows one connection through the capture.
type cmState struct {
	c          *CMConn
	activeQPN  wire.QPN
	passiveQPN wire.QPN
	hasREP     bool
	first      time.Time
	sent       map[madKey]*sentMAD
	order      []madKey
	steps      []string // the story's steps, a sentence each
	ended      bool
}

// sentMAD is a MAD seen once or more.
type sentMAD struct {
	frames []int
	at     time.Time // the last time it was sent
	name   string
}

// cmTracker tells the CM's story over a capture's MADs.
type cmTracker struct {
	a     *Analysis
	conns map[cmKey]*cmState
	all   []*cmState
}

// cmMAD returns the MAD a packet carries: a UD SEND to QP1, its whole payload.
func cmMAD(p *pkt) []byte {
	if !p.ok || p.err != "" || !p.deth || p.bth.DestQP != gsiQPN {
		return nil
	}
	return p.madData
}

// analyzeCM tells the story of every CM connection of the capture and notes each MAD.
func (a *Analysis) analyzeCM(ps []*pkt) {
	t := &cmTracker{a: a, conns: map[cmKey]*cmState{}}
	for _, p := range ps {
		if b := cmMAD(p); b != nil {
			t.add(p, b)
		}
	}
	for _, s := range t.all {
		s.finish(a)
		a.CM = append(a.CM, s.c)
	}
}

// lookup returns the connection a MAD from one side belongs to: its own communication ID, or the
// peer's it names.
func (t *cmTracker) lookup(from, to netip.Addr, local, remote uint32) *cmState {
	if s := t.conns[cmKey{addr: from, id: local}]; s != nil && local != 0 {
		return s
	}
	return t.conns[cmKey{addr: to, id: remote}]
}

func (t *cmTracker) open(p *pkt, from, to netip.Addr, sid uint64, sidr bool) *cmState {
	s := &cmState{c: &CMConn{ID: len(t.all) + 1, Active: from, Passive: to, ServiceID: sid, SIDR: sidr},
		first: p.in.At, sent: map[madKey]*sentMAD{}}
	t.all = append(t.all, s)
	return s
}

// add takes one MAD of the capture.
func (t *cmTracker) add(p *pkt, b []byte) {
	from, to := p.in.Src.Addr(), p.in.Dst.Addr()
	m, err := mad.ParseCM(b)
	if err != nil {
		if h, herr := mad.ParseHeader(b); herr == nil {
			p.note(KindInfo, false, "a MAD on QP1 that the CM does not take (%v %s): %v", h.MgmtClass(), h.AttributeName(), err)
		} else {
			p.note(KindError, false, "on QP1 but not a MAD: %v", err)
		}
		return
	}
	h := m.Header()
	attr, tid := h.AttributeID(), h.TransactionID()
	var s *cmState
	var text string
	kind := KindInfo
	switch attr {
	case mad.AttrConnectRequest:
		r := m.REQ()
		k := cmKey{addr: from, id: r.LocalCommID()}
		if s = t.conns[k]; s == nil || s.ended {
			s = t.open(p, from, to, r.ServiceID(), false)
			t.conns[k] = s
		}
		s.activeQPN = r.LocalQPN()
		text = fmt.Sprintf("REQ: %v asks %v for a connection to %s: %v QP %v, first PSN %v, path MTU %v, responder resources %d, initiator depth %d, retry count %d, RNR retry %d; the peer's CM should answer within %s (remote CM response timeout %d) plus the round trip, else the REQ is resent, up to %d times",
			from, to, service(r.ServiceID()), r.TransportServiceType(), r.LocalQPN(), r.StartingPSN(), r.PathMTU().Bytes(),
			r.ResponderResources(), r.InitiatorDepth(), r.RetryCount(), r.RNRRetryCount(),
			fmtDur(cmTimeout(r.RemoteCMResponseTimeout())), r.RemoteCMResponseTimeout(), r.MaxCMRetries())
		if cma := describeCMA(r.ServiceID(), r.PrivateData()); cma != "" {
			text += "; " + cma
		}
	case mad.AttrMRA:
		r := m.MRA()
		s = t.lookup(from, to, r.LocalCommID(), r.RemoteCommID())
		text = fmt.Sprintf("MRA: %v got the %s and needs more time: wait up to %s more (service timeout %d) before resending it",
			from, r.MessageMRAed(), fmtDur(cmTimeout(r.ServiceTimeout())), r.ServiceTimeout())
	case mad.AttrConnectReply:
		r := m.REP()
		s = t.lookup(from, to, r.LocalCommID(), r.RemoteCommID())
		if s != nil {
			t.conns[cmKey{addr: from, id: r.LocalCommID()}] = s
			s.passiveQPN, s.hasREP = r.LocalQPN(), true
		}
		text = fmt.Sprintf("REP: %v accepts: its QP %v, first PSN %v, responder resources %d, initiator depth %d, RNR retry %d, CA ACK delay %s; its QP now takes the peer's packets",
			from, r.LocalQPN(), r.StartingPSN(), r.ResponderResources(), r.InitiatorDepth(), r.RNRRetryCount(),
			fmtDur(cmTimeout(r.TargetACKDelay())))
	case mad.AttrReadyToUse:
		r := m.RTU()
		s = t.lookup(from, to, r.LocalCommID(), r.RemoteCommID())
		text = fmt.Sprintf("RTU: %v confirms: the connection is established, both QPs may send", from)
	case mad.AttrConnectReject:
		r := m.REJ()
		s = t.lookup(from, to, r.LocalCommID(), r.RemoteCommID())
		kind = KindError
		text = fmt.Sprintf("REJ: %v rejects the %s: %s", from, r.MessageRejected(), rejectWhy(r))
		if s != nil {
			s.ended = true
		}
	case mad.AttrDisconnectRequest:
		r := m.DREQ()
		s = t.lookup(from, to, r.LocalCommID(), r.RemoteCommID())
		text = fmt.Sprintf("DREQ: %v disconnects: its QP is in the error state, and it asks %v to tear down QP %v", from, to, r.RemoteQPN())
	case mad.AttrDisconnectReply:
		r := m.DREP()
		s = t.lookup(from, to, r.LocalCommID(), r.RemoteCommID())
		text = fmt.Sprintf("DREP: %v agrees: the connection is over; both sides wait out timewait before reusing its IDs", from)
		if s != nil {
			s.ended = true
		}
	case mad.AttrSIDRRequest:
		r := m.SIDRReq()
		k := cmKey{addr: from, id: r.RequestID(), sidr: true}
		if s = t.conns[k]; s == nil || s.ended {
			s = t.open(p, from, to, r.ServiceID(), true)
			t.conns[k] = s
		}
		text = fmt.Sprintf("SIDR_REQ: %v asks %v which UD QP serves %s", from, to, service(r.ServiceID()))
		if cma := describeCMA(r.ServiceID(), r.PrivateData()); cma != "" {
			text += "; " + cma
		}
	case mad.AttrSIDRReply:
		r := m.SIDRRep()
		s = t.conns[cmKey{addr: to, id: r.RequestID(), sidr: true}]
		if r.Status() == mad.SIDRSuccess {
			text = fmt.Sprintf("SIDR_REP: %v answers: UD QP %v with Q_Key %#08x", from, r.QPN(), uint32(r.QKey()))
		} else {
			kind = KindError
			text = fmt.Sprintf("SIDR_REP: %v answers %v: no UD QP for the service", from, r.Status())
		}
		if s != nil {
			s.ended = true
		}
	default:
		p.note(KindInfo, false, "%s: alternate paths, which RoCE does not use", h.AttributeName())
		return
	}
	if s == nil {
		p.note(kind, false, "%s", text)
		p.note(KindInfo, true, "of a connection whose REQ is not in the capture")
		return
	}
	s.c.Frames = append(s.c.Frames, p.frame())
	k := madKey{from: from, attr: attr, tid: tid}
	if m, ok := s.sent[k]; ok {
		gap := p.in.At.Sub(m.at)
		why := "its answer was lost or late"
		if !t.answered(s, k, m.at) {
			why = "no answer came in time"
		}
		p.note(KindRetransmit, true, "the same %s again (transaction ID %#x, first sent as #%d), %s after the last: %s; the receiver takes it as a duplicate",
			m.name, tid, m.frames[0], fmtDur(gap), why)
		m.frames = append(m.frames, p.frame())
		m.at = p.in.At
		return
	}
	name := text[:strings.IndexByte(text, ':')]
	s.sent[k] = &sentMAD{frames: []int{p.frame()}, at: p.in.At, name: name}
	s.order = append(s.order, k)
	p.note(kind, false, "%s", text)
	s.steps = append(s.steps, fmt.Sprintf("#%d %s.", p.frame(), text))
}

// answered reports whether the other side sent anything for the connection since at.
func (t *cmTracker) answered(s *cmState, k madKey, at time.Time) bool {
	for kk, o := range s.sent {
		if kk.from != k.from && o.at.After(at) {
			return true
		}
	}
	return false
}

// finish writes the connection's story: its steps, its resends, and how it ended.
func (s *cmState) finish(a *Analysis) {
	c := s.c
	c.Story = append(c.Story, s.steps...)
	var resent []string
	for _, k := range s.order {
		if m := s.sent[k]; len(m.frames) > 1 {
			refs := make([]string, len(m.frames))
			for i, f := range m.frames {
				refs[i] = fmt.Sprintf("#%d", f)
			}
			resent = append(resent, fmt.Sprintf("the %s %s (%s)", m.name, times(len(m.frames)), join(refs)))
		}
	}
	if len(resent) > 0 {
		c.Story = append(c.Story, "Sent more than once, as duplicates by transaction ID: "+join(resent)+".")
	}
	has := func(attr mad.AttributeID) bool {
		for k := range s.sent {
			if k.attr == attr {
				return true
			}
		}
		return false
	}
	switch {
	case c.SIDR:
		if !has(mad.AttrSIDRReply) {
			c.Story = append(c.Story, "No SIDR_REP in the capture: the service never answered.")
		}
	case has(mad.AttrConnectReject):
	case has(mad.AttrDisconnectReply):
		c.Story = append(c.Story, "The connection was set up and torn down in full.")
	case has(mad.AttrDisconnectRequest):
		c.Story = append(c.Story, "No DREP in the capture: the disconnection was not acknowledged (the peer gone, or the capture ended first).")
	case has(mad.AttrReadyToUse):
		c.Story = append(c.Story, "Still connected when the capture ends.")
	case s.hasREP:
		c.Story = append(c.Story, "No RTU in the capture: the passive side takes the first packet on its QP as the connection's start, or resends the REP.")
	default:
		c.Story = append(c.Story, "No answer to the REQ in the capture: nobody there, or every answer was lost.")
	}
	if s.hasREP {
		for _, pr := range a.Pairs {
			if pr.Transport == wire.TransportUD {
				continue
			}
			if matchEnds(pr.A, pr.B, c.Active, s.activeQPN, c.Passive, s.passiveQPN) || matchEnds(pr.B, pr.A, c.Active, s.activeQPN, c.Passive, s.passiveQPN) {
				c.Pair = pr
				c.Story = append(c.Story, fmt.Sprintf("Its queue pairs' traffic is pair %d.", pr.ID))
				break
			}
		}
	}
}

func matchEnds(x, y *Endpoint, a netip.Addr, aq wire.QPN, b netip.Addr, bq wire.QPN) bool {
	return x.Addr == a && y.Addr == b && (!x.Known || x.QPN == aq) && (!y.Known || y.QPN == bq) && (x.Known || y.Known)
}

// times returns "twice", "3 times".
func times(n int) string {
	if n == 2 {
		return "twice"
	}
	return fmt.Sprintf("%d times", n)
}

// rejectWhy says what a REJ's reason means.
func rejectWhy(r mad.REJ) string {
	why := r.Reason().String()
	switch r.Reason() {
	case mad.RejInvalidServiceID:
		why += ": nobody listens on the service (the RDMA counterpart of a TCP RST)"
	case mad.RejConsumerReject:
		why += ": the application refused (rdma_reject)"
		if pd := strings.TrimRight(string(r.PrivateData()), "\x00"); pd != "" && isText(pd) {
			why += fmt.Sprintf(", saying %q", pd)
		}
	case mad.RejTimeout:
		why += ": a CM gave up waiting"
		if ari := r.ARI(); len(ari) >= 8 {
			why += fmt.Sprintf(" (the CA GUID in the ARI, %#016x, names the side that timed out)", uint64(ari[0])<<56|uint64(ari[1])<<48|uint64(ari[2])<<40|uint64(ari[3])<<32|uint64(ari[4])<<24|uint64(ari[5])<<16|uint64(ari[6])<<8|uint64(ari[7]))
		}
	case mad.RejStaleConnection:
		why += ": the receiver still holds an older connection of that QP"
	case mad.RejNoResources:
		why += ": the receiver has no room for the connection"
	case mad.RejInvalidCommID:
		why += ": the receiver holds no connection of that communication ID"
	}
	return why
}

func isText(s string) bool {
	for _, r := range s {
		if r < ' ' || r > '~' {
			return false
		}
	}
	return true
}

// describeCMA decodes the CMA header of a REQ's or SIDR_REQ's private data, when the service is
// rdma_cm's: the IP addresses and the active side's port.
func describeCMA(sid uint64, p []byte) string {
	if ps, port, ok := mad.ParseServiceID(sid); ok && knownPortSpace(ps) {
		h, err := mad.ParseCMAHeader(p)
		if err != nil {
			return "no valid rdma_cm header in the private data (" + err.Error() + ")"
		}
		return fmt.Sprintf("rdma_cm header: from %v port %d to %v port %d", h.SrcAddr(), h.SrcPort(), h.DstAddr(), port)
	}
	return ""
}
