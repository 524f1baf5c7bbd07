package cm

import (
	"net/netip"
	"reflect"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// conn is one connection or SIDR resolution, active or passive.
type conn struct {
	id        ConnID
	state     State
	active    bool
	sidr      bool
	abandoned bool // the owner called Abort: no more events
	peer      netip.Addr
	serviceID uint64

	tid        uint64 // the transaction of the REQ (or SIDR_REQ) that REP, RTU, MRA and REJ answer
	remoteID   uint32 // the peer's communication ID (a SIDR_REQ's request ID)
	remoteGUID uint64
	localQPN   wire.QPN // this side's QP: a DREQ must name it
	qp         QPParams
	listener   *listener // passive: the listener whose backlog place the request holds until answered

	retries   uint8         // resends of msg left
	rto       time.Duration // msg's retransmission timeout
	deadline  time.Time     // when expire runs; zero when no timer
	mraWait   time.Duration // how long an MRA'd message waits: service timeout plus the ACK timeout
	reported  bool          // EventDisconnected already emitted
	msg       [mad.Len]byte // the request being retried: REQ, REP, DREQ, SIDR_REQ
	resp      [mad.Len]byte // the last answer kept for a duplicate: MRA, RTU, DREP, SIDR_REP
	hasResp   bool
	pending   int // events queued and not polled
	indexedQP bool

	indexedRemote bool
	indexedSIDR   bool
}

// arm starts msg's retransmission timer.
func (c *conn) arm(now time.Time) { c.deadline = now.Add(c.rto) }

// timewait is how long a connection stays in timewait: its QP's local ACK timeout, as Linux's
// cm_enter_timewait waits (cm_convert_to_ms(av.timeout)).
func (c *conn) timewait() time.Duration { return Timeout(c.qp.Timeout) }

// Counters are an engine's statistics. Sent, Rcvd, Retries and Duplicates are indexed by CM attribute
// (0 REQ, 1 MRA, 2 REJ, 3 REP, 4 RTU, 5 DREQ, 6 DREP, 7 SIDR_REQ, 8 SIDR_REP, 9 LAP, 10 APR), as
// Linux's cm_tx_msgs, cm_rx_msgs, cm_tx_retries and cm_rx_duplicates are.
type Counters struct {
	Received    uint64     // MADs given to HandleMAD
	Sent        [11]uint64 // MADs queued, by attribute
	Rcvd        [11]uint64 // valid CM MADs received, by attribute
	Retries     [11]uint64 // requests resent after a timeout, by attribute
	Duplicates  [11]uint64 // duplicates received, by attribute (answered or not)
	RejectsSent [35]uint64 // REJs sent, by reason (34: reasons beyond 33)
	RejectsRcvd [35]uint64 // REJs received for a connection, by reason

	Established     uint64 // connections that reached ESTABLISHED
	Unreachable     uint64 // attempts given up: retries exhausted or the owner too slow
	StaleRejected   uint64 // REQs and REPs rejected as stale connections
	TimewaitExits   uint64 // connections that left timewait
	SIDRResolved    uint64 // SIDR_REPs received for a SIDR_REQ
	UnknownAnswered uint64 // MADs of no connection answered: a REP with REJ invalid comm ID, a DREQ with DREP

	Dropped              uint64 // every MAD dropped, whatever the reason below
	DropMalformed        uint64 // shorter than 256 bytes or a base version other than 1
	DropNotCM            uint64 // another management class, or not the Send method
	DropClassVersion     uint64 // a CM class version other than 2
	DropUnknownAttribute uint64 // an attribute chapter 12 does not define
	DropUnsupported      uint64 // LAP and APR: no alternate paths on RoCE
	DropUnknownConn      uint64 // a message for a connection the engine does not hold, with no answer due
	DropState            uint64 // a message the connection's state does not take
	DropQPN              uint64 // a DREQ naming another QP than the connection's
	DropReservedQPN      uint64 // a REQ or REP naming QP0 or QP1 (the SMI's and GSI's) as the QP to connect
	DropBacklog          uint64 // a REQ or SIDR_REQ beyond its listener's backlog (retried by the peer)
	DropConnTable        uint64 // a REQ or SIDR_REQ with Config.MaxConns connections held
	DropTxQueueFull      uint64 // an outgoing MAD with the queue full (the owner did not drain it)
	DropEventQueueFull   uint64 // an event with the queue full (cannot happen; counted if it does)
	TransitionErrors     uint64 // state changes the transition table refused: bugs, always 0
	BuildErrors          uint64 // MADs that would not build: bugs, always 0

	// BadCMAHeader counts REQs and SIDR_REQs refused for their private data (RejectBadCMAHeader,
	// RejectSIDRBadCMAHeader): without rdma_cm's header.
	BadCMAHeader uint64
}

// Each calls fn with the name and value of every counter, arrays expanded with their index's name.
func (c *Counters) Each(fn func(name string, v uint64)) {
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Type.Kind() != reflect.Array {
			fn(f.Name, v.Field(i).Uint())
			continue
		}
		for k := 0; k < f.Type.Len(); k++ {
			x := v.Field(i).Index(k).Uint()
			if x == 0 {
				continue
			}
			var n string
			if f.Name == "RejectsSent" || f.Name == "RejectsRcvd" {
				n = mad.RejectReason(k).String()
			} else {
				n = mad.ClassCM.AttributeName(mad.AttrConnectRequest + mad.AttributeID(k))
			}
			fn(f.Name+"["+n+"]", x)
		}
	}
}
