package cm

import (
	"net/netip"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// Service ID resolution for UD: a client asks which QP and Q_Key serve a service ID, the server answers.
// IBTA Vol 1 12.11; Linux ib_send_cm_sidr_req, cm_sidr_req_handler, ib_send_cm_sidr_rep,
// cm_sidr_rep_handler. rdma_cm resolves RDMA_PS_UDP services this way (udaddy), with the CMA header in
// the SIDR_REQ's private data and Q_Key 0x01234567 (RDMA_UDP_QKEY) in the answer.

// SIDRParams are what Resolve puts in its SIDR_REQ.
type SIDRParams struct {
	ServiceID uint64     // mad.ServiceID(mad.PortSpaceUDP, port) for rdma_cm
	Peer      netip.Addr // the server's GID
	PKey      wire.PKey  // 0 means wire.DefaultPKey
	// PrivateData is the SIDR_REQ's private data, at most mad.SIDRReqPrivateDataLen bytes; rdma_cm
	// peers expect the CMA header first.
	PrivateData []byte
}

// SIDRAnswer is what AnswerSIDR puts in its SIDR_REP.
type SIDRAnswer struct {
	Status      mad.SIDRStatus // mad.SIDRSuccess, or why not (mad.SIDRReject for an application's refusal)
	QPN         wire.QPN       // the UD QP serving the service (success only)
	QKey        wire.QKey      // its Q_Key (success only)
	PrivateData []byte         // at most mad.SIDRRepPrivateDataLen bytes
}

// Resolve asks p.Peer which UD QP serves p.ServiceID: it sends a SIDR_REQ, resent every
// Timeout(Config.CMResponseTimeout) up to Config.MaxCMRetries times (as rdma_cm's cma_resolve_ib_udp).
// EventSIDRResolved or EventUnreachable follows.
func (e *Engine) Resolve(now time.Time, p *SIDRParams) (ConnID, error) {
	switch {
	case !p.Peer.IsValid() || len(p.PrivateData) > mad.SIDRReqPrivateDataLen:
		return 0, ErrBadParam
	case len(e.conns) >= e.cfg.MaxConns:
		return 0, ErrTooManyConns
	}
	pkey := p.PKey
	if pkey == 0 {
		pkey = wire.DefaultPKey
	}
	c := e.newConn(p.Peer)
	c.active, c.sidr = true, true
	c.serviceID = p.ServiceID
	c.tid = e.newTID(c)
	c.rto = Timeout(e.cfg.CMResponseTimeout)
	c.retries = e.cfg.MaxCMRetries
	e.setState(c, StateSIDRReqSent)
	e.send(c, &c.msg, c.tid, &mad.SIDRReqFields{RequestID: uint32(c.id), PKey: pkey, ServiceID: p.ServiceID,
		PrivateData: p.PrivateData})
	c.arm(now)
	return c.id, nil
}

// rcvSIDRRep handles the answer to Resolve.
func (e *Engine) rcvSIDRRep(_ time.Time, m mad.MAD) {
	r := m.SIDRRep()
	c := e.conns[ConnID(r.RequestID())]
	if c == nil || !c.sidr || !c.active {
		e.drop(&e.c.DropUnknownConn)
		return
	}
	if c.state != StateSIDRReqSent {
		e.c.Duplicates[attrIndex(mad.AttrSIDRReply)]++
		e.drop(&e.c.DropState)
		return
	}
	e.c.SIDRResolved++
	ev := Event{Kind: EventSIDRResolved, Status: r.Status(), QKey: r.QKey(),
		Info: append([]byte(nil), r.AdditionalInfo()...)}
	ev.QP.DestQPN = r.QPN()
	e.emit(c, ev, r.PrivateData())
	e.setState(c, StateIdle)
}

// rcvSIDRReq handles a SIDR_REQ: a duplicate of one being answered is dropped, one already answered is
// answered again; a service nobody listens on gets SIDR_REP unsupported (Linux cm_sidr_req_handler).
func (e *Engine) rcvSIDRReq(now time.Time, from netip.Addr, m mad.MAD) {
	r := m.SIDRReq()
	if c := e.sidrByPeer[sidrKey{r.RequestID(), from.As16()}]; c != nil {
		e.c.Duplicates[attrIndex(mad.AttrSIDRRequest)]++
		if c.state == StateSIDRRepSent && c.hasResp {
			e.resend(c, &c.resp)
		} else {
			e.drop(&e.c.DropState)
		}
		return
	}
	l := e.listeners[r.ServiceID()]
	switch {
	case l == nil:
		e.sendOnce(from, m.Header().TransactionID(), &mad.SIDRRepFields{RequestID: r.RequestID(),
			Status: mad.SIDRUnsupported, ServiceID: r.ServiceID()})
		return
	case l.pending >= l.backlog:
		e.drop(&e.c.DropBacklog)
		return
	case len(e.conns) >= e.cfg.MaxConns:
		e.drop(&e.c.DropConnTable)
		return
	}
	c := e.newConn(from)
	c.sidr = true
	c.serviceID = r.ServiceID()
	c.tid = m.Header().TransactionID()
	c.remoteID = r.RequestID()
	c.qp.PKey = r.PKey()
	c.listener = l
	l.pending++
	e.sidrByPeer[sidrKey{c.remoteID, from.As16()}] = c
	c.indexedSIDR = true
	e.setState(c, StateSIDRReqRcvd)
	c.deadline = now.Add(e.cfg.OwnerTimeout)
	ev := Event{Kind: EventSIDRRequest}
	ev.QP.PKey = r.PKey()
	e.emit(c, ev, r.PrivateData())
}

// AnswerSIDR answers EventSIDRRequest with a SIDR_REP. The engine keeps the answer a while (twice the
// client's SIDR_REQ timeout) to send it again if the client asks again.
func (e *Engine) AnswerSIDR(now time.Time, id ConnID, a *SIDRAnswer) error {
	c := e.conns[id]
	switch {
	case c == nil || c.abandoned:
		return ErrUnknownConn
	case c.state != StateSIDRReqRcvd:
		return ErrState
	case len(a.PrivateData) > mad.SIDRRepPrivateDataLen:
		return ErrBadParam
	}
	e.answerSIDR(now, c, a)
	return nil
}

// RejectSIDRBadCMAHeader refuses SIDR request id (SIDRReject) because its private data lacks the
// header the owner's convention requires (rdma_cm's CMA header), and counts it in
// Counters.BadCMAHeader.
func (e *Engine) RejectSIDRBadCMAHeader(now time.Time, id ConnID) error {
	err := e.AnswerSIDR(now, id, &SIDRAnswer{Status: mad.SIDRReject})
	if err == nil {
		e.c.BadCMAHeader++
	}
	return err
}

func (e *Engine) answerSIDR(now time.Time, c *conn, a *SIDRAnswer) {
	e.release(c)
	f := &mad.SIDRRepFields{RequestID: c.remoteID, Status: a.Status, ServiceID: c.serviceID,
		PrivateData: a.PrivateData}
	if a.Status == mad.SIDRSuccess {
		f.QPN, f.QKey = a.QPN, a.QKey
	}
	e.setState(c, StateSIDRRepSent)
	e.send(c, &c.resp, c.tid, f)
	c.hasResp = true
	c.deadline = now.Add(2 * Timeout(e.cfg.CMResponseTimeout))
}
