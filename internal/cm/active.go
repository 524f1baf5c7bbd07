package cm

import (
	"net/netip"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// The active side: Connect sends a REQ and retries it; a REP (or an MRA, a REJ) answers it; Confirm
// sends the RTU once the owner has connected its QP. IBTA Vol 1 12.9.5 (active state diagram); Linux
// ib_send_cm_req, cm_rep_handler, ib_send_cm_rtu.

// ConnectParams are what Connect puts in its REQ.
type ConnectParams struct {
	ServiceID uint64     // the listener's service ID: mad.ServiceID(mad.PortSpaceTCP, port) for rdma_cm
	Peer      netip.Addr // the passive side's GID (on RoCEv2 its IP address); the MADs go there
	Transport mad.TransportType
	QPN       wire.QPN // this side's QP, in RESET or INIT
	// StartingPSN is the first PSN this side expects: the PSN the peer's first packet will carry, and
	// the RQ PSN of this side's QP (see QPParams).
	StartingPSN        wire.PSN
	ResponderResources uint8 // READs and atomics this side accepts in flight
	InitiatorDepth     uint8 // READs and atomics this side issues in flight
	RetryCount         uint8 // transport retries for both QPs (0..7)
	RNRRetryCount      uint8 // RNR retries of the passive side's QP (0..7, 7 forever)
	PathMTU            wire.MTU
	PKey               wire.PKey // 0 means wire.DefaultPKey
	TrafficClass       uint8
	HopLimit           uint8 // 0 means DefaultHopLimit
	FlowLabel          uint32
	SL                 uint8
	SRQ                bool
	// PrivateData is the REQ's private data, at most mad.REQPrivateDataLen bytes. An rdma_cm peer
	// expects the CMA header first (mad.CMAHeaderFields.Append).
	PrivateData []byte
}

// Connect starts a connection: it queues a REQ to p.Peer, which is resent until a REP, an MRA or a REJ
// answers it. The answer comes as an event: EventReply, EventRejected or EventUnreachable.
func (e *Engine) Connect(now time.Time, p *ConnectParams) (ConnID, error) {
	switch {
	case p.Transport != mad.TransportRC && p.Transport != mad.TransportUC,
		!p.PathMTU.Valid(), !p.Peer.IsValid(), !p.QPN.Valid(), p.QPN <= wire.QPNGSI,
		!p.StartingPSN.Valid(), p.RetryCount > 7, p.RNRRetryCount > 7, p.FlowLabel >= 1<<20, p.SL > 15,
		len(p.PrivateData) > mad.REQPrivateDataLen:
		return 0, ErrBadParam
	case len(e.conns) >= e.cfg.MaxConns:
		return 0, ErrTooManyConns
	}
	pkey := p.PKey
	if pkey == 0 {
		pkey = wire.DefaultPKey
	}
	hop := p.HopLimit
	if hop == 0 {
		hop = DefaultHopLimit
	}
	c := e.newConn(p.Peer)
	c.active = true
	c.serviceID = p.ServiceID
	c.localQPN = p.QPN
	c.tid = e.newTID(c)
	c.qp = QPParams{Transport: p.Transport, Peer: p.Peer, RQPSN: p.StartingPSN, PathMTU: p.PathMTU, PKey: pkey,
		TrafficClass: p.TrafficClass, HopLimit: hop, FlowLabel: p.FlowLabel, SL: p.SL,
		Timeout: e.cfg.PacketLifeTime + 1, RetryCount: p.RetryCount, MaxRdAtomic: p.InitiatorDepth,
		MaxDestRdAtomic: p.ResponderResources}
	// The REQ's timer: twice the packet lifetime and the passive CM's response time (Linux
	// ib_send_cm_req).
	c.rto = 2*Timeout(e.cfg.PacketLifeTime) + Timeout(e.cfg.CMResponseTimeout)
	c.retries = e.cfg.MaxCMRetries
	local := e.cfg.LocalGID
	if !local.IsValid() {
		local = netip.IPv6Unspecified()
	}
	// Off the local subnet (hop limit above 1) Linux writes the permissive LID, as rping.pcap's REQ
	// shows (cm_format_req).
	var lid uint16
	if hop > 1 {
		lid = 0xFFFF
	}
	req := &mad.REQFields{
		LocalCommID:             uint32(c.id),
		ServiceID:               p.ServiceID,
		LocalCAGUID:             e.cfg.CAGUID,
		LocalQPN:                p.QPN,
		ResponderResources:      p.ResponderResources,
		InitiatorDepth:          p.InitiatorDepth,
		RemoteCMResponseTimeout: e.cfg.CMResponseTimeout,
		TransportServiceType:    p.Transport,
		StartingPSN:             p.StartingPSN,
		LocalCMResponseTimeout:  e.cfg.CMResponseTimeout,
		RetryCount:              p.RetryCount,
		PKey:                    pkey,
		PathMTU:                 p.PathMTU,
		RNRRetryCount:           p.RNRRetryCount,
		MaxCMRetries:            e.cfg.MaxCMRetries,
		SRQ:                     p.SRQ,
		Primary: mad.Path{LocalLID: lid, RemoteLID: lid, LocalGID: local, RemoteGID: p.Peer,
			FlowLabel: p.FlowLabel, TrafficClass: p.TrafficClass, HopLimit: hop, SL: p.SL, SubnetLocal: hop <= 1,
			LocalACKTimeout: ACKTimeout(e.cfg.ACKDelay, e.cfg.PacketLifeTime)},
		Alternate:   mad.Path{LocalGID: netip.IPv6Unspecified(), RemoteGID: netip.IPv6Unspecified()},
		PrivateData: p.PrivateData,
	}
	e.setState(c, StateReqSent)
	e.send(c, &c.msg, c.tid, req)
	c.arm(now)
	return c.id, nil
}

// rcvREP handles a ConnectReply: the answer to a REQ, or a duplicate of one (cm_rep_handler,
// cm_dup_rep_handler).
func (e *Engine) rcvREP(now time.Time, from netip.Addr, m mad.MAD) {
	r := m.REP()
	if r.LocalQPN() <= reservedQPNs {
		// As for a REQ (rcvREQ): QP0 and QP1 are no QPs to connect to, and chapter 12 has no reject
		// reason for naming one. The REQ's retries go on; a proper REP may still come.
		e.drop(&e.c.DropReservedQPN)
		return
	}
	c := e.conns[ConnID(r.RemoteCommID())]
	if c == nil || !c.active || c.sidr {
		// A REP for a REQ this engine never sent or has forgotten: tell the passive side, which would
		// otherwise resend it until its retries run out. IBTA Vol 1 12.6.7 (Table 109: invalid
		// communication ID).
		e.c.UnknownAnswered++
		e.issueREJ(from, m, mad.RejInvalidCommID, mad.MsgREP, nil)
		return
	}
	switch c.state {
	case StateReqSent, StateMRAReqRcvd:
	case StateRepRcvd, StateMRARepSent:
		// The owner has not confirmed yet and the passive side resends: ask it to wait (Linux answers a
		// duplicate REP in MRA_REP_SENT with an MRA; rdma_cm enters that state on every REP).
		if r.LocalCommID() != c.remoteID {
			e.drop(&e.c.DropState)
			return
		}
		e.c.Duplicates[attrIndex(mad.AttrConnectReply)]++
		e.sendMRA(c, mad.MsgREP)
		if c.state == StateRepRcvd {
			e.setState(c, StateMRARepSent)
		}
		return
	case StateEstablished:
		// The RTU was lost: send it again.
		if r.LocalCommID() != c.remoteID || !c.hasResp {
			e.drop(&e.c.DropState)
			return
		}
		e.c.Duplicates[attrIndex(mad.AttrConnectReply)]++
		e.resend(c, &c.resp)
		return
	default:
		e.c.Duplicates[attrIndex(mad.AttrConnectReply)]++
		e.drop(&e.c.DropState)
		return
	}
	c.remoteID, c.remoteGUID = r.LocalCommID(), r.LocalCAGUID()
	c.qp.DestQPN = r.LocalQPN()
	if !e.indexRemote(c) {
		// Another connection already holds this peer's communication ID: a duplicate REP.
		e.c.Duplicates[attrIndex(mad.AttrConnectReply)]++
		e.drop(&e.c.DropState)
		c.remoteID, c.remoteGUID, c.qp.DestQPN = 0, 0, 0
		return
	}
	if o := e.byRemoteQP[qpKey{c.qp.DestQPN, c.remoteGUID}]; o != nil && o != c {
		// The peer's QP is still connected to us through another connection: a stale connection.
		// Reject the REP and disconnect the other (Linux cm_rep_handler).
		e.unindexRemote(c)
		c.remoteID, c.remoteGUID, c.qp.DestQPN = 0, 0, 0
		e.c.StaleRejected++
		e.issueREJ(from, m, mad.RejStaleConnection, mad.MsgREP, nil)
		e.staleDisconnect(now, o)
		return
	}
	e.indexQP(c)
	c.qp.SQPSN = r.StartingPSN()
	c.qp.MaxRdAtomic = min(c.qp.MaxRdAtomic, r.ResponderResources())
	c.qp.RNRRetry = r.RNRRetryCount()
	c.qp.Timeout = ACKTimeout(r.TargetACKDelay(), e.cfg.PacketLifeTime)
	e.setState(c, StateRepRcvd)
	c.deadline = now.Add(e.cfg.OwnerTimeout)
	e.emit(c, Event{Kind: EventReply, QP: c.qp}, r.PrivateData())
}

// Confirm tells the engine the owner has connected its QP after EventReply: it sends the RTU with
// private data p (at most mad.RTUPrivateDataLen bytes) and the connection is established.
func (e *Engine) Confirm(now time.Time, id ConnID, p []byte) error {
	c := e.conns[id]
	switch {
	case c == nil || c.abandoned:
		return ErrUnknownConn
	case c.state != StateRepRcvd && c.state != StateMRARepSent:
		return ErrState
	case len(p) > mad.RTUPrivateDataLen:
		return ErrBadParam
	}
	e.setState(c, StateEstablished)
	c.deadline = time.Time{}
	e.send(c, &c.resp, c.tid, &mad.RTUFields{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID, PrivateData: p})
	c.hasResp = true
	e.c.Established++
	return nil
}

// rcvMRA handles a message receipt acknowledgement: the peer got our REQ or REP and asks for longer
// (cm_mra_handler).
func (e *Engine) rcvMRA(now time.Time, m mad.MAD) {
	r := m.MRA()
	c := e.conns[ConnID(r.RemoteCommID())]
	if c == nil || c.sidr {
		e.drop(&e.c.DropUnknownConn)
		return
	}
	if r.MessageMRAed() != mad.MsgREQ && r.LocalCommID() != c.remoteID {
		e.drop(&e.c.DropUnknownConn)
		return
	}
	wait := Timeout(r.ServiceTimeout()) + Timeout(c.qp.Timeout)
	switch {
	case r.MessageMRAed() == mad.MsgREQ && (c.state == StateReqSent || c.state == StateMRAReqRcvd):
		if c.state == StateMRAReqRcvd {
			e.c.Duplicates[attrIndex(mad.AttrMRA)]++
		} else {
			e.setState(c, StateMRAReqRcvd)
		}
	case r.MessageMRAed() == mad.MsgREP && (c.state == StateRepSent || c.state == StateMRARepRcvd):
		if c.state == StateMRARepRcvd {
			e.c.Duplicates[attrIndex(mad.AttrMRA)]++
		} else {
			e.setState(c, StateMRARepRcvd)
		}
	default:
		e.drop(&e.c.DropState)
		return
	}
	// The MRA'd message is not resent before the service timeout (plus the path's ACK timeout)
	// passes; a repeated MRA extends the wait again.
	c.mraWait = wait
	c.deadline = now.Add(wait)
}

// sendMRA sends (or resends) an MRA of msg asking the peer to wait Config.MRATimeout.
func (e *Engine) sendMRA(c *conn, msg mad.MessageType) {
	e.send(c, &c.resp, c.tid, &mad.MRAFields{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID,
		MessageMRAed: msg, ServiceTimeout: e.cfg.MRATimeout})
	c.hasResp = true
}

func attrIndex(a mad.AttributeID) int { return int(a - mad.AttrConnectRequest) }
