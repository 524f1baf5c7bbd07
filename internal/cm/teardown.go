package cm

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/goroce/goroce/wire/mad"
)

// How connections end: REJ at every stage of establishment, DREQ/DREP from either side, timewait, and
// the timers that run out. IBTA Vol 1 12.9.7 (disconnection), 12.6.7 (REJ); Linux ib_send_cm_rej,
// cm_rej_handler, ib_send_cm_dreq, cm_dreq_handler, cm_drep_handler, cm_enter_timewait,
// cm_process_send_error.

// Reject refuses a connection before it is established, with reason (mad.RejConsumerReject for an
// application's refusal, as rdma_reject sends) and private data p (at most mad.REJPrivateDataLen
// bytes): a request the owner will not accept (after EventRequest), or a reply it cannot use (after
// EventReply, when connecting the QP failed). The connection ends without further events.
func (e *Engine) Reject(now time.Time, id ConnID, reason mad.RejectReason, p []byte) error {
	c := e.conns[id]
	switch {
	case c == nil || c.abandoned:
		return ErrUnknownConn
	case c.sidr || !c.state.preEstablished():
		return ErrState
	case len(p) > mad.REJPrivateDataLen:
		return ErrBadParam
	}
	e.reject(now, c, reason, nil, p)
	c.abandoned = true
	return nil
}

// RejectBadCMAHeader rejects request id (RejConsumerReject) because its private data lacks the header
// the owner's convention requires (rdma_cm's CMA header), and counts it in Counters.BadCMAHeader.
func (e *Engine) RejectBadCMAHeader(now time.Time, id ConnID) error {
	err := e.Reject(now, id, mad.RejConsumerReject, nil)
	if err == nil {
		e.c.BadCMAHeader++
	}
	return err
}

// reject sends c's REJ and moves it on as Linux's ib_send_cm_rej does: to idle, or to timewait once
// the peer may have a connected QP (after our REP).
func (e *Engine) reject(now time.Time, c *conn, reason mad.RejectReason, ari, p []byte) {
	f := &mad.REJFields{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID, Reason: reason, ARI: ari,
		PrivateData: p}
	switch c.state {
	case StateReqRcvd:
		// Linux leaves the local ID out of a REJ of a REQ it never answered (cm_format_rej).
		f.LocalCommID, f.MessageRejected = 0, mad.MsgREQ
	case StateMRAReqSent:
		f.MessageRejected = mad.MsgREQ
	case StateRepRcvd, StateMRARepSent:
		f.MessageRejected = mad.MsgREP
	default:
		f.MessageRejected = mad.MsgOther
	}
	e.sendOnce(c.peer, c.tid, f)
	if c.state == StateRepSent || c.state == StateMRARepRcvd {
		e.enterTimewait(now, c)
		return
	}
	e.setState(c, StateIdle)
}

// Abort is the owner giving up a connection in any state, as ib_destroy_cm_id does: an attempt in
// progress is rejected (reason timeout while the REQ is unanswered, consumer reject after), an
// established connection gets one DREQ, and the connection goes to timewait or idle. No event follows.
func (e *Engine) Abort(now time.Time, id ConnID) error {
	c := e.conns[id]
	if c == nil || c.abandoned {
		return ErrUnknownConn
	}
	c.abandoned = true
	switch c.state {
	case StateReqSent, StateMRAReqRcvd:
		e.reject(now, c, mad.RejTimeout, e.guidARI(), nil)
	case StateReqRcvd, StateMRAReqSent, StateRepRcvd, StateMRARepSent, StateRepSent, StateMRARepRcvd:
		e.reject(now, c, mad.RejConsumerReject, nil, nil)
	case StateEstablished:
		e.sendDREQ(c, nil)
		e.enterTimewait(now, c)
	case StateDreqSent:
		e.enterTimewait(now, c)
	case StateSIDRReqRcvd:
		e.answerSIDR(now, c, &SIDRAnswer{Status: mad.SIDRReject})
	case StateSIDRReqSent:
		e.setState(c, StateIdle)
	}
	e.maybeFree(c)
	return nil
}

// Disconnect ends an established connection: it sends a DREQ with private data p (at most
// mad.DREQPrivateDataLen bytes), resent until a DREP comes; EventDisconnected follows, then
// EventTimewaitDone. Move the QP to the error state first, as rdma_disconnect does. A connection
// already disconnecting is left alone.
func (e *Engine) Disconnect(now time.Time, id ConnID, p []byte) error {
	c := e.conns[id]
	switch {
	case c == nil || c.abandoned:
		return ErrUnknownConn
	case len(p) > mad.DREQPrivateDataLen:
		return ErrBadParam
	case c.state == StateDreqSent || c.state == StateTimewait:
		return nil
	case c.state != StateEstablished:
		return ErrState
	}
	e.setState(c, StateDreqSent)
	e.sendDREQ(c, p)
	c.retries = e.cfg.MaxCMRetries
	c.arm(now)
	return nil
}

func (e *Engine) sendDREQ(c *conn, p []byte) {
	e.send(c, &c.msg, e.newTID(c), &mad.DREQFields{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID,
		RemoteQPN: c.qp.DestQPN, PrivateData: p})
}

// staleDisconnect ends connection o, which a new REQ or REP showed the peer has lost: an established
// one is sent a DREQ (Linux cm_match_req), one still being set up is forgotten into timewait.
func (e *Engine) staleDisconnect(now time.Time, o *conn) {
	switch {
	case o.state == StateEstablished:
		e.setState(o, StateDreqSent)
		e.sendDREQ(o, nil)
		o.retries = e.cfg.MaxCMRetries
		o.arm(now)
	case o.state.preEstablished():
		e.emit(o, Event{Kind: EventRejected, Reason: mad.RejStaleConnection}, nil)
		e.enterTimewait(now, o)
	}
}

// enterTimewait moves c to timewait, which ends Timeout(QP ACK timeout) later.
func (e *Engine) enterTimewait(now time.Time, c *conn) {
	e.setState(c, StateTimewait)
	c.deadline = now.Add(c.timewait())
}

// disconnected reports the end of c once.
func (e *Engine) disconnected(c *conn, ev Event, p []byte) {
	if c.reported {
		return
	}
	c.reported = true
	ev.Kind = EventDisconnected
	e.emit(c, ev, p)
}

// rcvREJ handles a ConnectReject, finding its connection the three ways Linux's
// cm_acquire_rejected_id does: a timeout by the rejecting CA's GUID in the ARI and its communication
// ID, a rejected REQ by our ID alone (the peer had none to give), anything else by both IDs.
func (e *Engine) rcvREJ(now time.Time, m mad.MAD) {
	r := m.REJ()
	var c *conn
	ari := r.ARI()
	if r.Reason() == mad.RejTimeout && len(ari) >= 8 {
		c = e.byRemote[remoteKey{r.LocalCommID(), binary.BigEndian.Uint64(ari)}]
	}
	if c == nil {
		c = e.conns[ConnID(r.RemoteCommID())]
		// A REJ of a REQ may come before the peer told us its ID (Linux looks the connection up with
		// remote ID 0 then); any other must name the peer's ID we know.
		if c != nil && c.remoteID != r.LocalCommID() && (r.MessageRejected() != mad.MsgREQ || c.remoteID != 0) {
			c = nil
		}
	}
	if c == nil || c.sidr {
		e.drop(&e.c.DropUnknownConn)
		return
	}
	e.c.RejectsRcvd[min(int(r.Reason()), len(e.c.RejectsRcvd)-1)]++
	ev := Event{Kind: EventRejected, Reason: r.Reason(), ARI: append([]byte(nil), ari...)}
	switch c.state {
	case StateReqSent, StateMRAReqRcvd, StateRepSent, StateMRARepRcvd, StateReqRcvd, StateMRAReqSent:
		e.emit(c, ev, r.PrivateData())
		if r.Reason() == mad.RejStaleConnection {
			e.enterTimewait(now, c)
		} else {
			e.setState(c, StateIdle)
		}
	case StateRepRcvd, StateMRARepSent:
		e.emit(c, ev, r.PrivateData())
		e.enterTimewait(now, c)
	case StateDreqSent, StateEstablished:
		ev.Remote = c.state == StateEstablished
		e.disconnected(c, ev, r.PrivateData())
		e.enterTimewait(now, c)
	default:
		e.c.Duplicates[attrIndex(mad.AttrConnectReject)]++
		e.drop(&e.c.DropState)
	}
}

// rcvDREQ handles a DisconnectRequest. The engine answers it at once with a DREP and enters timewait:
// its owner hears EventDisconnected and needs to do nothing but move its QP to the error state. A
// DREQ of no connection is answered too, since the peer may have lost our DREP after we forgot the
// connection (Linux cm_issue_drep).
func (e *Engine) rcvDREQ(now time.Time, from netip.Addr, m mad.MAD) {
	r := m.DREQ()
	c := e.conns[ConnID(r.RemoteCommID())]
	if c == nil || c.sidr || c.remoteID != r.LocalCommID() {
		e.c.UnknownAnswered++
		f := mad.DREPFields{LocalCommID: r.RemoteCommID(), RemoteCommID: r.LocalCommID()}
		b, err := f.Append(e.scratch[:0], m.Header().TransactionID())
		e.out(from, b, err)
		return
	}
	if r.RemoteQPN() != c.localQPN {
		e.drop(&e.c.DropQPN)
		return
	}
	switch c.state {
	case StateRepSent, StateMRARepRcvd, StateEstablished, StateDreqSent:
		// REP_SENT: the RTU was lost and the active side, established, already disconnects.
		// DREQ_SENT: both sides disconnect at once; each answers the other.
		c.tid = m.Header().TransactionID()
		e.send(c, &c.resp, c.tid, &mad.DREPFields{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID})
		c.hasResp = true
		e.disconnected(c, Event{Remote: true}, r.PrivateData())
		e.enterTimewait(now, c)
	case StateTimewait:
		e.c.Duplicates[attrIndex(mad.AttrDisconnectRequest)]++
		if c.hasResp && mad.MAD(c.resp[:]).Header().AttributeID() == mad.AttrDisconnectReply {
			e.resend(c, &c.resp)
		} else {
			e.sendOnce(c.peer, m.Header().TransactionID(), &mad.DREPFields{LocalCommID: uint32(c.id),
				RemoteCommID: c.remoteID})
		}
	default:
		e.drop(&e.c.DropState)
	}
}

// rcvDREP handles a DisconnectReply to our DREQ (cm_drep_handler).
func (e *Engine) rcvDREP(now time.Time, m mad.MAD) {
	r := m.DREP()
	c := e.conns[ConnID(r.RemoteCommID())]
	if c == nil || c.sidr || c.remoteID != r.LocalCommID() {
		e.drop(&e.c.DropUnknownConn)
		return
	}
	if c.state != StateDreqSent {
		e.c.Duplicates[attrIndex(mad.AttrDisconnectReply)]++
		e.drop(&e.c.DropState)
		return
	}
	e.disconnected(c, Event{}, r.PrivateData())
	e.enterTimewait(now, c)
}

// expire runs c's timer: a resend while retries last, then the end the state calls for.
func (e *Engine) expire(now time.Time, c *conn) {
	c.deadline = time.Time{}
	switch c.state {
	case StateReqSent, StateMRAReqRcvd, StateRepSent, StateMRARepRcvd, StateDreqSent, StateSIDRReqSent:
		if c.retries > 0 {
			c.retries--
			e.c.Retries[attrIndex(mad.AttributeID(binary.BigEndian.Uint16(c.msg[16:])))]++
			e.resend(c, &c.msg)
			c.arm(now)
			switch c.state {
			case StateMRAReqRcvd:
				e.setState(c, StateReqSent)
			case StateMRARepRcvd:
				e.setState(c, StateRepSent)
			}
			return
		}
		e.giveUp(now, c)
	case StateReqRcvd, StateMRAReqSent, StateRepRcvd, StateMRARepSent:
		// The owner did not answer in time: reject with reason timeout so that the peer stops waiting.
		e.c.Unreachable++
		e.emit(c, Event{Kind: EventUnreachable}, nil)
		e.reject(now, c, mad.RejTimeout, e.guidARI(), nil)
	case StateSIDRReqRcvd:
		e.c.Unreachable++
		e.emit(c, Event{Kind: EventUnreachable}, nil)
		e.answerSIDR(now, c, &SIDRAnswer{Status: mad.SIDRReject})
	case StateSIDRRepSent:
		e.setState(c, StateIdle)
	case StateTimewait:
		e.c.TimewaitExits++
		e.emit(c, Event{Kind: EventTimewaitDone}, nil)
		e.setState(c, StateIdle)
	}
}

// giveUp ends c when its request's retries ran out: the peer vanished.
func (e *Engine) giveUp(now time.Time, c *conn) {
	switch c.state {
	case StateDreqSent:
		// No DREP: the connection is over all the same (Linux's DREQ_ERROR enters timewait).
		e.disconnected(c, Event{}, nil)
		e.enterTimewait(now, c)
	case StateSIDRReqSent:
		e.c.Unreachable++
		e.emit(c, Event{Kind: EventUnreachable}, nil)
		e.setState(c, StateIdle)
	default:
		// REQ or REP unanswered: tell the peer, in case only its answers are lost, with a REJ
		// timeout naming this CA (IBTA Vol 1 12.6.7, Table 109), and the owner.
		e.c.Unreachable++
		e.emit(c, Event{Kind: EventUnreachable}, nil)
		e.sendOnce(c.peer, c.tid, &mad.REJFields{LocalCommID: uint32(c.id), RemoteCommID: c.remoteID,
			MessageRejected: mad.MsgOther, Reason: mad.RejTimeout, ARI: e.guidARI()})
		e.setState(c, StateIdle)
	}
}
