package qp

import (
	"errors"
	"fmt"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// Errors of posting work requests and of creating queue pairs. They match with errors.Is.
var (
	ErrInvalidState   = errors.New("qp: operation not allowed in the QP's state")
	ErrBadOpcode      = errors.New("qp: work request opcode not supported on this QP type")
	ErrMessageTooLong = errors.New("qp: message too long")
	ErrInlineTooLong  = errors.New("qp: inline data longer than max_inline_data")
	ErrNoAH           = errors.New("qp: UD send without an address handle")
	ErrBadAtomic      = errors.New("qp: atomic work request needs one 8-byte SGE")
	ErrSRQ            = errors.New("qp: QP uses a shared receive queue")
	ErrConfig         = errors.New("qp: invalid QP configuration")
)

// Protocol constants goroce shares with rxe (rxe_param.h), so that a goroce requester never pushes an
// rxe responder harder than an rxe requester would.
const (
	// maxUnackedPSNs bounds the PSNs in flight: the requester stops when this many are unacknowledged.
	maxUnackedPSNs = 128
	// maxPktsPerAck is how many packets go without AckReq before one asks for an ACK.
	maxPktsPerAck = 64
	// maxProbes is how many tail-loss probes go for one tail before the local ACK timeout alone is left.
	maxProbes = 2
	// maxMessagePkts bounds one message's packets so that every PSN in flight stays within the 2^23
	// half-space serial comparison works in (IBTA Vol 1 9.7.1); with MTU 256 it allows 1 GiB messages.
	maxMessagePkts = 1 << 22
)

// Config is what a queue pair is created with. It mirrors struct ibv_qp_init_attr.
type Config struct {
	Type          Type
	QPN           wire.QPN  // chosen by the device
	PD            *mr.PD    // the protection domain every memory access is checked against
	Memory        *mr.Table // the device's memory regions
	SendCQ        *CQ
	RecvCQ        *CQ
	SRQ           *SRQ // if set, receives come from it instead of the QP's own queue
	MaxSendWR     int  // send queue depth
	MaxRecvWR     int  // receive queue depth (ignored with an SRQ)
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
	SigAll        bool  // every send work request completes, signaled or not (sq_sig_all)
	Pacer         Pacer // optional rate control of the requester; nil sends as fast as the window allows
	// PortMTU is the largest payload of a UD datagram: the port's MTU, as rxe uses its port's MTU for
	// UD QPs, which have no path MTU. MTU4096 unless set.
	PortMTU wire.MTU
	// AckDelay lets a plain ACK wait up to this long for company: it leaves at once when another
	// response or a request of this QP is to be sent, else when the delay ends. The peer then gets the
	// ACK and, say, the reply to its SEND in one go. An ACK that waited in vain makes the next ones
	// leave at once, until the QP sends a request again: a SEND stream's receiver, which answers
	// nothing, does not hold every ACK back. Zero sends ACKs at once, as rxe does. IBTA Vol 1
	// 9.7.5.1.1 lets a responder coalesce acknowledgements.
	AckDelay time.Duration
	// OnEvent, if set, is told of the QP's asynchronous events, on the goroutine that runs the engine:
	// it must not block or call back into the QP.
	OnEvent func(e Event, cq *CQ)
	// TailProbe turns on the RC requester's tail-loss probe: when requests are outstanding and no
	// response has come for twice the smoothed round-trip time (at least MinProbe) since the last
	// packet left, the last packet goes again, with AckReq. The responder answers it, and the answer
	// tells the requester what happened to the tail: an ACK if only the last packet or the ACK was
	// lost, a PSN sequence NAK (and go-back-N) if more was, a duplicate's ACK if nothing was. So a lost
	// tail costs a round trip or two instead of the local ACK timeout (67 ms at the usual timeout 14),
	// which alone counts against retry_cnt, as IBTA Vol 1 9.7.6.1.3 says. A requester may send a
	// request again at any time; the responder treats it as any duplicate (9.7.5.1.2). The idea is
	// TCP's tail loss probe (RFC 8985 section 7). Only a SEND or WRITE tail is probed; a READ's or an
	// atomic's waits for the timeout. The probe waits for the Pacer and is charged to it, as every
	// packet is.
	TailProbe bool
	// MinProbe is the shortest probe timeout: 1 ms unless set.
	MinProbe time.Duration
}

// Event is an asynchronous event of a QP, as ibv_get_async_event reports them.
type Event uint8

// Events. IBTA Vol 1 11.6.3 (asynchronous events).
const (
	// EventFatal: the QP entered ERR because of an error (IBV_EVENT_QP_FATAL), a failed request, a
	// fatal NAK or a CQ overflow; its outstanding work requests were flushed.
	EventFatal Event = iota + 1
	// EventCQError: a completion did not fit cq (IBV_EVENT_CQ_ERR); the completion is lost and the QP
	// enters ERR (EventFatal follows).
	EventCQError
	// EventLastWQE: a QP on an SRQ entered ERR: it takes no more receives from the SRQ
	// (IBV_EVENT_QP_LAST_WQE_REACHED).
	EventLastWQE
)

func (e Event) String() string {
	switch e {
	case EventFatal:
		return "QP fatal"
	case EventCQError:
		return "CQ error"
	case EventLastWQE:
		return "last WQE reached"
	}
	return fmt.Sprintf("Event(%d)", uint8(e))
}

// event reports e to the owner.
func (q *QP) event(e Event, cq *CQ) {
	if q.cfg.OnEvent != nil {
		q.cfg.OnEvent(e, cq)
	}
}

// QP is a queue pair engine: the requester, completer and responder of one queue pair, sans I/O. It never
// reads a clock, starts a goroutine or touches a socket: the owner hands it packets (HandlePacket), work
// requests (PostSend, PostRecv) and the time (Advance), pulls the packets it wants sent (AppendPacket),
// and asks when it next needs to run (NextDeadline). Completions go to its CQs.
//
// A QP is owned by one goroutine: none of its methods may be called concurrently. Its CQs and SRQ are
// the shared, locked hand-off points.
type QP struct {
	cfg   Config
	typ   Type
	qpn   wire.QPN
	state State
	attr  Attr
	mtu   int

	sq  sendRing
	rq  recvRing
	req requester
	cmp completer
	rsp responder

	counters Counters
	// companyAt is the time of the AppendPacket round that built a request: a delayed ACK goes after
	// the requests built in the same round (same now), as their company.
	companyAt time.Time

	// byRef is set while AppendPacketRefs runs: a payload of RefMin bytes or more is then taken by
	// reference, refs collecting its pieces, refAt where in the packet they go and refLen their
	// bytes.
	byRef  bool
	refs   [][]byte
	refAt  int
	refLen int
}

// New creates a queue pair in the RESET state.
func New(cfg Config) (*QP, error) {
	switch {
	case !cfg.Type.valid(), cfg.PD == nil, cfg.Memory == nil, cfg.SendCQ == nil, cfg.RecvCQ == nil,
		!cfg.QPN.Valid(), cfg.QPN == wire.QPNSMI, cfg.MaxSendWR < 0, cfg.MaxRecvWR < 0,
		cfg.MaxSendSGE < 0, cfg.MaxRecvSGE < 0, cfg.MaxInlineData < 0:
		return nil, ErrConfig
	}
	q := &QP{
		cfg:  cfg,
		typ:  cfg.Type,
		qpn:  cfg.QPN,
		attr: Attr{PKey: wire.DefaultPKey, PathMTU: wire.MTU256},
		mtu:  wire.MTU256.Bytes(), // rxe starts every QP at 256 until modify sets the path MTU
		sq:   newSendRing(cfg.MaxSendWR, cfg.MaxSendSGE, cfg.MaxInlineData),
	}
	if cfg.SRQ == nil {
		q.rq = newRecvRing(cfg.MaxRecvWR, cfg.MaxRecvSGE)
	}
	if q.cfg.MinProbe <= 0 {
		q.cfg.MinProbe = time.Millisecond
	}
	if !q.cfg.PortMTU.Valid() {
		q.cfg.PortMTU = wire.MTU4096
	}
	if q.typ == UD {
		q.mtu = q.cfg.PortMTU.Bytes()
	}
	q.rsp.init(q)
	return q, nil
}

// QPN returns the queue pair number.
func (q *QP) QPN() wire.QPN { return q.qpn }

// Type returns the queue pair type.
func (q *QP) Type() Type { return q.typ }

// State returns the current state.
func (q *QP) State() State { return q.state }

// Query returns the queue pair's attributes, as ibv_query_qp does.
func (q *QP) Query() Attr {
	a := q.attr
	a.State = q.state
	return a
}

// Counters returns a snapshot of the queue pair's counters.
func (q *QP) Counters() Counters { return q.counters }

// Modify changes attributes and state as ibv_modify_qp does: the mask names the fields of a to apply,
// and must include every attribute the transition requires and nothing it does not allow. On error
// nothing changes. Entering ERR flushes every outstanding work request; entering RESET empties the
// queues without completions.
func (q *QP) Modify(now time.Time, a *Attr, mask AttrMask) error {
	to, err := checkTransition(q.typ, q.state, a, mask)
	if err != nil {
		return err
	}
	if mask&AttrAccessFlags != 0 {
		q.attr.AccessFlags = a.AccessFlags
	}
	if mask&AttrPKey != 0 {
		q.attr.PKey = a.PKey
	}
	if mask&AttrQKey != 0 {
		q.attr.QKey = a.QKey
	}
	if mask&AttrAV != 0 {
		q.attr.AV = a.AV
	}
	if mask&AttrPathMTU != 0 {
		q.attr.PathMTU = a.PathMTU
		q.mtu = a.PathMTU.Bytes()
	}
	if mask&AttrTimeout != 0 {
		q.attr.Timeout = a.Timeout
	}
	if mask&AttrRetryCnt != 0 {
		q.attr.RetryCnt = a.RetryCnt
		q.cmp.retryLeft = a.RetryCnt
	}
	if mask&AttrRNRRetry != 0 {
		q.attr.RNRRetry = a.RNRRetry
		q.cmp.rnrLeft = a.RNRRetry
	}
	if mask&AttrRQPSN != 0 {
		q.attr.RQPSN = a.RQPSN
		q.rsp.psn, q.rsp.ackPSN = a.RQPSN, a.RQPSN
	}
	if mask&AttrSQPSN != 0 {
		q.attr.SQPSN = a.SQPSN
		q.req.psn, q.req.max = a.SQPSN, a.SQPSN
		q.cmp.psn = a.SQPSN
	}
	if mask&AttrMaxQPRdAtomic != 0 {
		q.attr.MaxRdAtomic = roundRdAtomic(a.MaxRdAtomic)
	}
	if mask&AttrMaxDestRdAtomic != 0 {
		q.attr.MaxDestRdAtomic = roundRdAtomic(a.MaxDestRdAtomic)
		q.rsp.resizeResources(int(q.attr.MaxDestRdAtomic))
	}
	if mask&AttrMinRNRTimer != 0 {
		q.attr.MinRNRTimer = a.MinRNRTimer
	}
	if mask&AttrDestQPN != 0 {
		q.attr.DestQPN = a.DestQPN
	}
	from := q.state
	q.state = to
	switch {
	case to == StateReset && from != StateReset:
		q.reset()
	case to == StateErr && from != StateErr:
		q.flush()
		if q.cfg.SRQ != nil {
			q.event(EventLastWQE, nil)
		}
	}
	return nil
}

// reset empties every queue without completions and clears the transport state. IBTA Vol 1 10.3.1.
func (q *QP) reset() {
	q.sq.clear()
	q.rq.clear()
	q.req = requester{}
	q.cmp = completer{}
	q.rsp.reset()
	q.attr = Attr{PKey: wire.DefaultPKey, PathMTU: wire.MTU256}
	q.mtu = wire.MTU256.Bytes()
	if q.typ == UD {
		q.mtu = q.cfg.PortMTU.Bytes()
	}
}

// enterError moves the QP to ERR and flushes it: the error path of every engine. The owner hears of it
// (EventFatal, and EventLastWQE for a QP on an SRQ).
func (q *QP) enterError() {
	if q.state == StateErr {
		return
	}
	q.state = StateErr
	q.flush()
	q.event(EventFatal, nil)
	if q.cfg.SRQ != nil {
		q.event(EventLastWQE, nil)
	}
}

// flush completes every outstanding send and receive work request with WR_FLUSH_ERR, in posting order.
// Flush completions are generated for unsignaled requests too: every error completes. IBTA Vol 1 10.3.1
// (error state); rxe flush_send_queue and flush_recv_queue.
func (q *QP) flush() {
	for q.sq.n > 0 {
		w := q.sq.front()
		q.complete(w, StatusWRFlushErr)
	}
	q.req.reset()
	q.cmp.stopTimers()
	q.rsp.flush(q) // the receive bound to an open message was posted before those still queued
	if q.cfg.SRQ == nil {
		for q.rq.n > 0 {
			w := q.rq.front()
			wc := Completion{WRID: w.id, Status: StatusWRFlushErr, Opcode: CompRecv, QPN: q.qpn}
			q.rq.pop()
			q.pushRecv(&wc, false)
		}
	}
}

// PostSend queues a send work request, as ibv_post_send does. The request is validated now: an error
// here means nothing was queued. A QP in ERR accepts the request and completes it with WR_FLUSH_ERR.
// Posting needs RTS (or SQD, SQE, ERR); IBTA Vol 1 C10-96 calls for an immediate error before RTS and
// goroce gives one.
func (q *QP) PostSend(now time.Time, wr *SendWR) error {
	switch q.state {
	case StateRTS, StateSQD, StateSQE, StateErr:
	default:
		return ErrInvalidState
	}
	if !wr.Opcode.allowedOn(q.typ) {
		return ErrBadOpcode
	}
	if wr.Opcode.isReadAtomic() && q.attr.MaxRdAtomic == 0 {
		return ErrNoRdAtomic
	}
	w, err := q.sq.push(wr, q.typ)
	if err != nil {
		return err
	}
	if w.length > 0 && q.mtu > 0 && (int64(w.length)+int64(q.mtu)-1)/int64(q.mtu) > maxMessagePkts {
		q.sq.unpush()
		return ErrMessageTooLong
	}
	if q.typ == UD && int(w.length) > q.mtu {
		// rxe completes such a send successfully without sending it (C10-93.1.1); an immediate error
		// serves the application better.
		q.sq.unpush()
		return ErrMessageTooLong
	}
	if q.state == StateErr || q.state == StateSQE {
		q.complete(w, StatusWRFlushErr)
	}
	return nil
}

// PostRecv queues a receive work request, as ibv_post_recv does. Receives may be posted from INIT on;
// in ERR they complete at once with WR_FLUSH_ERR.
func (q *QP) PostRecv(wr *RecvWR) error {
	if q.cfg.SRQ != nil {
		return ErrSRQ
	}
	if q.state == StateReset {
		return ErrInvalidState
	}
	if err := q.rq.push(wr); err != nil {
		return err
	}
	if q.state == StateErr {
		w := q.rq.front()
		wc := Completion{WRID: w.id, Status: StatusWRFlushErr, Opcode: CompRecv, QPN: q.qpn}
		q.rq.pop()
		q.pushRecv(&wc, false)
	}
	return nil
}

// HandlePacket processes one received packet addressed to this QP. The datapath has already parsed it,
// checked its ICRC and matched its destination QPN; info may be nil when nothing more is known. Packets
// the QP cannot take in its state, or that fail a check the spec answers with a silent drop, are counted
// and dropped.
func (q *QP) HandlePacket(now time.Time, p wire.Packet, info *RxInfo) {
	q.counters.RcvdPkts++
	if info != nil && info.CE {
		q.counters.RcvdCE++
	}
	i := p.Info()
	if i.Op == wire.OpCNP {
		q.counters.RcvdCNP++
		if cn, ok := q.cfg.Pacer.(CNPReceiver); ok && q.cfg.Pacer != nil {
			cn.OnCNP(now)
		}
		return
	}
	if i.Transport != q.typ.transport() {
		q.counters.drop(&q.counters.DropWrongTransport)
		return
	}
	if p.BTH().PKey() != q.attr.PKey && q.typ != UD {
		q.counters.drop(&q.counters.DropPKey)
		return
	}
	if i.Response {
		q.cmp.handle(q, now, p)
		return
	}
	q.rsp.handle(q, now, p, info)
}

// Advance runs the QP's timers up to now: the retransmit timeout and the end of an RNR wait.
func (q *QP) Advance(now time.Time) {
	q.cmp.advance(q, now)
}

// NextDeadline returns when the QP next needs Advance or AppendPacket to run, or the zero time if only a
// packet or a work request can make it do anything.
func (q *QP) NextDeadline() time.Time {
	at, _ := q.Deadline()
	return at
}

// Deadline returns NextDeadline, and whether it is a loss timer's alone: the local ACK timeout (IBTA
// Vol 1 9.7.6.1.3) or a tail-loss probe (Config.TailProbe), with nothing else due by then (the end of
// an RNR wait, a packet the pacer holds, an ACK held for company). A loss timer only guards against a
// loss, and the response it waits for usually moves it out before it comes: an owner that wakes for
// it in vain again and again may run it late, at the price of recovering that much later from a
// loss. The other deadlines are due when they say.
func (q *QP) Deadline() (at time.Time, lossTimer bool) {
	loss := earliest(q.cmp.timer, q.cmp.probeAt)
	other := earliest(earliest(q.cmp.rnrUntil, q.req.blockedUntil), q.rsp.deadline())
	if !loss.IsZero() && (other.IsZero() || loss.Before(other)) {
		return loss, true
	}
	return other, false
}

// AppendPacket appends the next packet the QP wants to send to dst and reports where it goes. Responses
// (ACKs, NAKs, READ responses, atomic acknowledgements) come before new requests, except an ACK held
// back for company (Config.AckDelay): it goes right after the requests a round of calls with the same
// now builds, the last packet of that round. The owner then sends the two together, and a datapath
// that cuts its packets into GSO runs can end the requests' run with the small ACK. The packet ends
// with a zero ICRC for the datapath to fill in, since the ICRC covers IP and UDP headers only the
// datapath knows. It returns false when there is nothing to send now: check NextDeadline.
func (q *QP) AppendPacket(now time.Time, dst []byte) ([]byte, Tx, bool) {
	company := q.inRound(now)
	if !company {
		if out, tx, ok := q.rsp.appendPacket(q, now, dst, false); ok {
			q.counters.SentPkts++
			return out, tx, true
		}
	}
	if q.cmp.probeDue {
		q.cmp.probeDue = false
		if out, tx, ok := q.req.appendProbe(q, now, dst); ok {
			q.counters.SentPkts++
			q.counters.TailProbes++
			return out, tx, true
		}
	}
	if out, tx, ok := q.req.appendPacket(q, now, dst); ok {
		q.counters.SentPkts++
		q.companyAt = now
		q.rsp.alone = false // requests go out: a reply may carry the next ACK
		return out, tx, true
	}
	if company {
		if out, tx, ok := q.rsp.appendPacket(q, now, dst, true); ok {
			q.counters.SentPkts++
			return out, tx, true
		}
	}
	return dst, Tx{}, false
}

// MaySend reports whether AppendPacket may have a packet at now. False means it has none: no response
// is queued but an ACK held for company that is not due, no probe is due and no request is left to
// send. True may still find nothing (a window, a pacer or an RNR wait holds the next request back).
// An owner that has just handed the QP a packet can skip asking when it is false.
func (q *QP) MaySend(now time.Time) bool {
	if q.cmp.probeDue || q.req.next < q.sq.n {
		return true
	}
	if q.rsp.jobs.front() == nil || q.typ != RC {
		return false
	}
	return !now.Before(q.rsp.heldUntil()) || q.inRound(now)
}

// inRound reports whether now is the time of the AppendPacket round that built a request, so that an
// ACK held for company goes out in it.
func (q *QP) inRound(now time.Time) bool { return !now.IsZero() && q.companyAt.Equal(now) }

// RefMin is the smallest payload AppendPacketRefs takes by reference: below it the copy costs less
// than another piece for the socket to walk.
const RefMin = 512

// RefMaxPieces bounds the pieces of one packet's payload AppendPacketRefs appends: a request whose
// gather list has more elements is copied.
const RefMaxPieces = 8

// AppendPacketRefs is AppendPacket, except that a payload of RefMin bytes or more that comes from
// registered memory (a request's gather list, a READ response's region) is not copied into dst: its
// pieces, slices of the regions' own memory (mr.Table.GatherRefs), are appended to refs, and dst gets
// the headers and, right after them, the pad and the zero ICRC. The packet is out[:tx.PayloadAt], the
// pieces, then out[tx.PayloadAt:]; with no piece appended it is out, as AppendPacket gives it.
//
// The pieces are read when the owner sends them, as a NIC's DMA reads memory when it sends, so a
// program must not change a buffer before its work request completes. One case is the transport's
// own: a resend built just before an ACK completes its request may leave after the program has
// reused the buffer. Its ICRC, sealed over the bytes as they were, then fails at the receiver, which
// drops it as corrupt; it was a duplicate anyway.
func (q *QP) AppendPacketRefs(now time.Time, dst []byte, refs [][]byte) ([]byte, [][]byte, Tx, bool) {
	q.byRef, q.refs, q.refAt, q.refLen = true, refs, 0, 0
	out, tx, ok := q.AppendPacket(now, dst)
	refs = q.refs
	q.byRef, q.refs = false, nil
	if ok {
		tx.PayloadAt = q.refAt
	}
	return out, refs, tx, ok
}

// packetLen is the length of the packet just appended from dst to out: out's new bytes and the
// payload taken by reference.
func (q *QP) packetLen(dst, out []byte) int {
	n := len(out) - len(dst)
	if q.byRef {
		n += q.refLen
	}
	return n
}

// ReleaseAcks lets every ACK waiting under AckDelay go with the next AppendPacket: for an owner about
// to close the QP, so that the peer's last requests are acknowledged before the QP disappears.
func (q *QP) ReleaseAcks() {
	for k := 0; k < q.rsp.jobs.n; k++ {
		q.rsp.jobs.slots[(q.rsp.jobs.head+k)%len(q.rsp.jobs.slots)].due = time.Time{}
	}
}

// Tx says where a packet AppendPacket produced goes.
type Tx struct {
	AH        AddressHandle
	DestQPN   wire.QPN
	SrcQPN    wire.QPN
	PacketLen int // bytes of the packet: appended to dst, and taken by reference (AppendPacketRefs)
	// PayloadAt is where in the packet the pieces AppendPacketRefs appended go: after the headers,
	// before the pad and the ICRC. Zero when the packet has none.
	PayloadAt int
	// Resend, for an RC request packet sent again, says what set the resend off; ResendNone for a
	// packet sent for the first time and for every response.
	Resend Resend
}

// Resend is why an RC requester sends a packet again (Tx.Resend), for traces and captures.
type Resend uint8

// Causes of a resend.
const (
	ResendNone       Resend = iota
	ResendNAK               // go-back-N from the PSN a PSN sequence NAK names (IBTA Vol 1 9.7.5.2.5)
	ResendProbeNAK          // the same, the NAK drawn by a tail-loss probe (Config.TailProbe)
	ResendTimeout           // the local ACK timer expired (9.7.6.1.3)
	ResendRNR               // the wait an RNR NAK asked for is over (9.7.5.2.8)
	ResendImpliedNAK        // a response past a READ or atomic whose response is missing (9.7.5.1.3)
	ResendProbe             // the tail-loss probe itself: the last packet again, with AckReq
)

var resendNames = [...]string{"", "NAK", "NAK to a tail-loss probe", "timeout", "RNR NAK", "implied NAK", "tail-loss probe"}

// String names the cause as a capture's comment does ("resent: timeout"); "" for ResendNone.
func (r Resend) String() string {
	if int(r) < len(resendNames) {
		return resendNames[r]
	}
	return "unknown"
}

// RxInfo is what the datapath knows about a received packet beyond its transport headers.
type RxInfo struct {
	// GRH is what a UD receive buffer starts with (IBTA Annex A17.4.5.2): the IPv6 header, or 20 zero
	// bytes followed by the IPv4 header.
	GRH [40]byte
	// CE reports an IP header marked Congestion Experienced.
	CE bool
}

// pushSend delivers a send completion; overflow puts the QP in error.
func (q *QP) pushSend(wc *Completion) {
	if err := q.cfg.SendCQ.push(wc, false); err != nil {
		q.counters.CQOverflow++
		q.event(EventCQError, q.cfg.SendCQ)
		q.enterError()
	}
}

// pushRecv delivers a receive completion; overflow puts the QP in error (class G).
func (q *QP) pushRecv(wc *Completion, solicited bool) {
	if err := q.cfg.RecvCQ.push(wc, solicited); err != nil {
		q.counters.CQOverflow++
		q.event(EventCQError, q.cfg.RecvCQ)
		q.enterError()
	}
}

// complete retires the oldest send WQE, which must be w, with status s: a completion goes to the send
// CQ if the request was signaled or failed.
func (q *QP) complete(w *sendWQE, s Status) {
	wc := Completion{WRID: w.wr.ID, Status: s, Opcode: w.wr.Opcode.completionOpcode(), QPN: q.qpn}
	if s == StatusSuccess {
		wc.ByteLen = w.length
	}
	signaled := s != StatusSuccess || w.wr.Flags&Signaled != 0 || q.cfg.SigAll
	if w.wr.Opcode.isReadAtomic() && w.sent {
		q.req.rdAtomic--
	}
	q.sq.pop()
	if q.req.next > 0 {
		q.req.next--
	}
	if signaled {
		q.pushSend(&wc)
	}
}

// fail completes the oldest send WQE with an error and moves the QP to ERR, flushing the rest.
func (q *QP) fail(s Status) {
	if w := q.sq.front(); w != nil {
		q.complete(w, s)
	}
	q.enterError()
}

func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// Drained reports whether a QP in SQD has nothing outstanding: every request that started before the
// drain has been acknowledged. It is the condition of the IBV_EVENT_SQ_DRAINED event, which the
// QP's owner raises. IBTA Vol 1 10.3.1 (SQD).
func (q *QP) Drained() bool {
	if q.state != StateSQD {
		return false
	}
	w := q.sq.front()
	return w == nil || !w.assigned
}
