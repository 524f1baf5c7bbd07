package cm

import (
	"net/netip"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// The passive side: a REQ for a listener becomes EventRequest; Accept answers with a REP, resent until
// the RTU comes; Reject with a REJ. IBTA Vol 1 12.9.6 (passive state diagram); Linux cm_req_handler,
// cm_match_req, cm_dup_req_handler, ib_send_cm_rep, cm_rtu_handler.

// AcceptParams are what Accept puts in its REP.
type AcceptParams struct {
	QPN wire.QPN // this side's QP
	// StartingPSN is the first PSN this side expects: the PSN of the active side's first packet, and
	// the RQ PSN of this side's QP.
	StartingPSN        wire.PSN
	ResponderResources uint8 // READs and atomics this side accepts in flight
	InitiatorDepth     uint8 // READs and atomics this side issues in flight (at most the REQ's responder resources)
	RNRRetryCount      uint8 // RNR retries of the active side's QP (0..7, 7 forever)
	SRQ                bool
	PrivateData        []byte // at most mad.REPPrivateDataLen bytes
}

// reservedQPNs is the last reserved QP number: QP0 (SMI) and QP1 (GSI).
const reservedQPNs wire.QPN = 1

// rcvREQ handles a ConnectRequest, checked in Linux's order (cm_match_req, then the path): a duplicate
// of a known request, a stale connection, a service nobody listens on, a path or transport this side
// cannot take, and only then the listener's backlog and the connection table.
func (e *Engine) rcvREQ(now time.Time, from netip.Addr, m mad.MAD) {
	r := m.REQ()
	if r.LocalQPN() <= reservedQPNs {
		// QP0 and QP1 are the SMI's and the GSI's, UD QPs no CM connects (IBTA Vol 1 3.5.8, 12.6.5):
		// a REQ naming one is malformed. Chapter 12 has no reject reason for it and Linux's
		// cm_req_handler does not look, so it is dropped, counted, before any state or owner sees it.
		e.drop(&e.c.DropReservedQPN)
		return
	}
	if c := e.byRemote[remoteKey{r.LocalCommID(), r.LocalCAGUID()}]; c != nil {
		e.dupREQ(c)
		return
	}
	if o := e.byRemoteQP[qpKey{r.LocalQPN(), r.LocalCAGUID()}]; o != nil {
		// The requesting QP is still connected to us under another communication ID: the peer lost
		// the old connection. Reject the REQ as stale and disconnect the old one (IBTA Vol 1 12.4.2,
		// stale connections; Linux cm_match_req).
		e.c.StaleRejected++
		e.issueREJ(from, m, mad.RejStaleConnection, mad.MsgREQ, nil)
		e.staleDisconnect(now, o)
		return
	}
	l := e.listeners[r.ServiceID()]
	switch {
	case l == nil:
		e.issueREJ(from, m, mad.RejInvalidServiceID, mad.MsgREQ, nil)
		return
	case e.cfg.LocalGID.IsValid() && !gidEqual(r.RemoteGID(), e.cfg.LocalGID):
		// The REQ is for another GID: say which one this side has (Linux sends its port's GID as the
		// ARI of REJ invalid GID).
		g := e.cfg.LocalGID.As16()
		e.issueREJ(from, m, mad.RejInvalidGID, mad.MsgREQ, g[:])
		return
	case r.TransportServiceType() != mad.TransportRC && r.TransportServiceType() != mad.TransportUC:
		e.issueREJ(from, m, mad.RejInvalidTransportType, mad.MsgREQ, nil)
		return
	case !r.PathMTU().Valid():
		e.issueREJ(from, m, mad.RejInvalidMTU, mad.MsgREQ, nil)
		return
	case l.pending >= l.backlog:
		e.drop(&e.c.DropBacklog)
		return
	case len(e.conns) >= e.cfg.MaxConns:
		e.drop(&e.c.DropConnTable)
		return
	}
	p := r.PrimaryPath()
	c := e.newConn(from)
	c.serviceID = r.ServiceID()
	c.tid = m.Header().TransactionID()
	c.remoteID, c.remoteGUID = r.LocalCommID(), r.LocalCAGUID()
	ackTimeout := p.LocalACKTimeout
	if ackTimeout == 0 {
		ackTimeout = ACKTimeout(e.cfg.ACKDelay, e.cfg.PacketLifeTime)
	}
	c.qp = QPParams{Transport: r.TransportServiceType(), Peer: from, DestQPN: r.LocalQPN(), SQPSN: r.StartingPSN(),
		PathMTU: r.PathMTU(), PKey: r.PKey(), TrafficClass: p.TrafficClass, HopLimit: p.HopLimit,
		FlowLabel: p.FlowLabel, SL: p.SL, Timeout: ackTimeout, RetryCount: r.RetryCount(),
		RNRRetry: r.RNRRetryCount(), MaxRdAtomic: r.ResponderResources(), MaxDestRdAtomic: r.InitiatorDepth()}
	// The REP's timer: the active CM's response time and the packet lifetime both ways (its path's
	// lifetime is the REQ's ACK timeout less one, as Linux's cm_format_paths_from_req derives it).
	c.rto = 2*Timeout(max(ackTimeout, 1)-1) + Timeout(r.LocalCMResponseTimeout())
	c.retries = r.MaxCMRetries()
	c.listener = l
	l.pending++
	e.indexRemote(c)
	e.indexQP(c)
	e.setState(c, StateReqRcvd)
	c.deadline = now.Add(e.cfg.OwnerTimeout)
	e.emit(c, Event{Kind: EventRequest, QP: c.qp}, r.PrivateData())
}

// dupREQ answers a REQ the engine has seen before, by the connection's state (Linux
// cm_dup_req_handler, and the REP resent as chapter 12's passive side does when the REP was lost).
func (e *Engine) dupREQ(c *conn) {
	e.c.Duplicates[attrIndex(mad.AttrConnectRequest)]++
	switch c.state {
	case StateReqRcvd:
		// The owner is still deciding: ask the active side to wait instead of resending.
		e.sendMRA(c, mad.MsgREQ)
		e.setState(c, StateMRAReqSent)
	case StateMRAReqSent:
		e.resend(c, &c.resp)
	case StateRepSent, StateMRARepRcvd:
		e.resend(c, &c.msg)
	case StateTimewait:
		e.send(c, &c.resp, c.tid, &mad.REJFields{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID,
			MessageRejected: mad.MsgOther, Reason: mad.RejStaleConnection})
		c.hasResp = true
	default:
		e.drop(&e.c.DropState)
	}
}

// Accept answers EventRequest: it sends the REP, resent until the RTU arrives, and returns the QP
// parameters the connection agreed on. Connect the QP with them (RESET to RTS) before sending the
// queued REP, as rdma_accept does: the active side may send as soon as it has the REP.
func (e *Engine) Accept(now time.Time, id ConnID, p *AcceptParams) (QPParams, error) {
	c := e.conns[id]
	switch {
	case c == nil || c.abandoned:
		return QPParams{}, ErrUnknownConn
	case c.state != StateReqRcvd && c.state != StateMRAReqSent:
		return QPParams{}, ErrState
	case !p.QPN.Valid() || p.QPN <= wire.QPNGSI || !p.StartingPSN.Valid() || p.RNRRetryCount > 7,
		len(p.PrivateData) > mad.REPPrivateDataLen:
		return QPParams{}, ErrBadParam
	}
	e.release(c)
	c.localQPN = p.QPN
	c.qp.RQPSN = p.StartingPSN
	c.qp.MaxRdAtomic = min(p.InitiatorDepth, c.qp.MaxRdAtomic)
	c.qp.MaxDestRdAtomic = p.ResponderResources
	e.setState(c, StateRepSent)
	e.send(c, &c.msg, c.tid, &mad.REPFields{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID,
		LocalQPN: p.QPN, StartingPSN: p.StartingPSN, ResponderResources: p.ResponderResources,
		InitiatorDepth: p.InitiatorDepth, TargetACKDelay: e.cfg.ACKDelay, RNRRetryCount: p.RNRRetryCount,
		SRQ: p.SRQ, LocalCAGUID: e.cfg.CAGUID, PrivateData: p.PrivateData})
	c.arm(now)
	return c.qp, nil
}

// rcvRTU handles a ReadyToUse: the active side's QP is connected (cm_rtu_handler).
func (e *Engine) rcvRTU(_ time.Time, m mad.MAD) {
	r := m.RTU()
	c := e.conns[ConnID(r.RemoteCommID())]
	if c == nil || c.active || c.sidr || c.remoteID != r.LocalCommID() {
		e.drop(&e.c.DropUnknownConn)
		return
	}
	if c.state != StateRepSent && c.state != StateMRARepRcvd {
		e.c.Duplicates[attrIndex(mad.AttrReadyToUse)]++
		e.drop(&e.c.DropState)
		return
	}
	e.established(c, r.PrivateData())
}

// Establish tells the engine that the passive QP received a packet before the RTU came (the
// communication established event, IBV_EVENT_COMM_EST; Linux ib_cm_notify): the RTU was lost or is
// late, and the connection is established without it.
func (e *Engine) Establish(now time.Time, id ConnID) error {
	c := e.conns[id]
	switch {
	case c == nil || c.abandoned:
		return ErrUnknownConn
	case c.state == StateEstablished:
		return nil
	case c.state != StateRepSent && c.state != StateMRARepRcvd:
		return ErrState
	}
	e.established(c, nil)
	return nil
}

func (e *Engine) established(c *conn, p []byte) {
	e.setState(c, StateEstablished)
	c.deadline = time.Time{}
	e.c.Established++
	e.emit(c, Event{Kind: EventEstablished, QP: c.qp}, p)
}
