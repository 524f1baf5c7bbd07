package cm

import (
	"net/netip"
	"strconv"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// EventKind says what happened to a connection. The owner learns of every change it did not cause
// itself through an Event; the ones it causes (Accept, Confirm, Reject, Disconnect) return directly.
type EventKind uint8

// Event kinds, with what the owner does about each. rdma_cm's events are named in parentheses.
const (
	// EventRequest: a REQ arrived for a listener (RDMA_CM_EVENT_CONNECT_REQUEST). Answer with Accept
	// or Reject; Event.QP holds the parameters the REQ offers, Event.PrivateData the REQ's (the CMA
	// header first). Unanswered after Config.OwnerTimeout, the engine rejects it and reports
	// EventUnreachable.
	EventRequest EventKind = iota + 1
	// EventReply: the REP to Connect arrived. Connect the QP with Event.QP (RESET to RTS), then
	// Confirm, which sends the RTU (RDMA_CM_EVENT_ESTABLISHED follows on the active side), or Reject.
	EventReply
	// EventEstablished: the RTU to Accept's REP arrived, or Establish was called (passive side,
	// RDMA_CM_EVENT_ESTABLISHED). The QP may send.
	EventEstablished
	// EventRejected: the peer refused before the connection was established, with Event.Reason,
	// Event.ARI and Event.PrivateData (RDMA_CM_EVENT_REJECTED). Move the QP to the error state.
	EventRejected
	// EventUnreachable: the peer never answered: a REQ, REP or SIDR_REQ went unanswered through all its
	// retries, or the owner itself did not answer in time (RDMA_CM_EVENT_UNREACHABLE). The engine
	// sent a REJ with reason timeout where chapter 12 asks for one.
	EventUnreachable
	// EventDisconnected: an established connection (or one whose RTU was lost) ended: the peer's
	// DREQ (Event.Remote, Event.PrivateData), the DREP to Disconnect, Disconnect's DREQ unanswered,
	// or a REJ (Event.Reason) (RDMA_CM_EVENT_DISCONNECTED). Move the QP to the error state; the
	// connection is in timewait.
	EventDisconnected
	// EventTimewaitDone: timewait is over (RDMA_CM_EVENT_TIMEWAIT_EXIT): the QP may be destroyed or
	// reused. It is the connection's last event.
	EventTimewaitDone
	// EventSIDRRequest: a SIDR_REQ arrived for a listener (RDMA_CM_EVENT_CONNECT_REQUEST on a UD
	// id). Answer with AnswerSIDR.
	EventSIDRRequest
	// EventSIDRResolved: the SIDR_REP to Resolve arrived: Event.Status, and on success Event.QP.DestQPN
	// and Event.QKey (RDMA_CM_EVENT_ESTABLISHED on a UD id, or UNREACHABLE with the status).
	EventSIDRResolved
)

var eventNames = [...]string{"", "request", "reply", "established", "rejected", "unreachable", "disconnected",
	"timewait-done", "sidr-request", "sidr-resolved"}

func (k EventKind) String() string {
	if int(k) < len(eventNames) && k != 0 {
		return eventNames[k]
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// QPParams are the attributes the CM gives a connected QP: what goroce's qp.ConnectParams and
// ibv_modify_qp's INIT -> RTR -> RTS need (Linux ib_cm_init_qp_attr). The PSNs are from this side's
// point of view: each side announces the PSN it expects to receive in its REQ or REP (Linux gives the
// REQ's Starting PSN to the active QP's rq_psn and the passive QP's sq_psn; rping.pcap shows the passive
// side sending from it).
type QPParams struct {
	Transport    mad.TransportType // RC or UC
	Peer         netip.Addr        // the peer's GID: on RoCEv2 its IP address
	DestQPN      wire.QPN          // the peer's QP
	SQPSN        wire.PSN          // the first PSN this side sends: the peer's Starting PSN
	RQPSN        wire.PSN          // the first PSN this side expects: its own Starting PSN
	PathMTU      wire.MTU
	PKey         wire.PKey
	TrafficClass uint8
	HopLimit     uint8
	FlowLabel    uint32
	SL           uint8
	// Timeout is the local ACK timeout code: the peer's CA ACK delay plus twice the packet lifetime
	// (ACKTimeout) on the active side, the REQ's Local ACK Timeout on the passive side, as Linux sets
	// them.
	Timeout    uint8
	RetryCount uint8 // transport retries (the REQ's, for both sides)
	RNRRetry   uint8 // RNR retries: the REP's for the active side, the REQ's for the passive side
	// MaxRdAtomic is how many READs and atomics this side may have outstanding as requester: its
	// initiator depth, at most the peer's responder resources.
	MaxRdAtomic uint8
	// MaxDestRdAtomic is how many this side accepts outstanding as responder: its responder resources.
	MaxDestRdAtomic uint8
}

// Event is one thing the owner must know about a connection. See EventKind for which fields each kind
// sets.
type Event struct {
	Kind      EventKind
	ID        ConnID
	ServiceID uint64
	Peer      netip.Addr // the GID the connection's MADs come from and go to
	// QP holds the QP parameters: those the REQ offers (EventRequest), those the connection
	// agreed on (EventReply), the SIDR answer's QPN (EventSIDRResolved).
	QP         QPParams
	PeerCAGUID uint64
	// Remote is true when the peer started the disconnection (EventDisconnected).
	Remote bool
	// Reason and ARI are those of the REJ that ended the attempt (EventRejected, EventDisconnected).
	Reason mad.RejectReason
	ARI    []byte
	// Status, QKey and Info are the SIDR_REP's (EventSIDRResolved).
	Status mad.SIDRStatus
	QKey   wire.QKey
	Info   []byte
	// PrivateData is the private data of the message behind the event, all of its bytes (a REQ's 92,
	// a REP's 196, ...), copied: the event owns it.
	PrivateData []byte
}
