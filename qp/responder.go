package qp

import (
	"errors"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// responder executes request packets: it checks them in the order IBTA Vol 1 9.7.5 (and rxe_resp.c)
// does (PSN, opcode sequence, QP access, resources, length, memory key), places data, consumes receive
// work requests, and queues what goes back (ACKs, NAKs, READ responses, atomic acknowledgements) in PSN
// order for appendPacket to send.
type responder struct {
	psn     wire.PSN // next expected PSN (e)
	msn     wire.MSN
	now     time.Time // the time of the packet being handled
	nakSent bool      // a PSN sequence error NAK was sent for the current gap
	// nakUnacked says a PSN sequence error NAK has gone out and no ACK since. rxe's requester ignores a
	// NAK that comes while a retry it started is under way, until an ACK shows progress (rxe_comp.c:
	// comp.started_retry, cleared only by an ACK), and then waits for its timeout; so before NAKing a
	// new gap in that state the responder acknowledges what it has. The NAK implies that ACK (IBTA
	// Vol 1 9.7.5.1.2), so the extra packet tells a conforming requester nothing new.
	nakUnacked bool
	// ackPSN is the PSN after the last SEND or WRITE packet executed: an ACK that answers a duplicate,
	// or that goes ahead of a NAK, carries the one before it, never a READ's or atomic's PSN. A
	// requester may take a plain ACK with a READ's last PSN for the READ's completion: rxe's completer
	// (rxe_comp.c check_psn, check_ack) completes the READ, with none of its data placed, as it would
	// a WRITE. rxe's own responder keeps resp.ack_psn for this (rxe_resp.c duplicate_request), and it
	// does not move on a READ. CONFORMANCE P5.
	ackPSN wire.PSN
	// alone says the last ACK held for company (Config.AckDelay) found none and left when its delay
	// ended: the program answers nothing here, as a SEND stream's receiver does not, and the ACKs
	// that follow leave at once rather than each wait the delay out. The next request this QP sends
	// clears it.
	alone bool

	msg  message    // the SEND or WRITE in progress
	sgl  []mr.SGE   // storage for the bound receive's SGL
	jobs jobRing    // responses waiting to be sent, in PSN order
	res  []resource // responder resources: recent READs and atomics, for duplicates
	next int        // next resource slot to reuse
}

// message is the state of a multi-packet SEND or WRITE between its first and last packet.
type message struct {
	op        wire.Operation // OpSend or OpWrite while a message is open; OpInvalid between messages
	hasRecv   bool           // recv holds a receive work request taken for this or the next message
	recv      recvWQE
	offset    uint64    // SEND: bytes placed in the receive buffer
	va        uint64    // WRITE: where the next packet's payload goes
	rkey      wire.RKey // WRITE: its key
	remaining uint32    // WRITE: bytes the RETH announced that have not arrived
	total     uint32    // WRITE: the RETH's DMA length
}

// resource remembers an executed READ or atomic so that a duplicate is answered again without executing
// twice. IBTA Vol 1 9.7.5.1.6 (responder resources); rxe_resp.c rxe_prepare_res, find_resource.
type resource struct {
	valid       bool
	atomic      bool
	first, last wire.PSN
	va          uint64
	rkey        wire.RKey
	length      uint32
	orig        uint64 // an atomic's original value
}

type jobKind uint8

const (
	jobAck    jobKind = iota // ACK, NAK or RNR NAK
	jobRead                  // READ response packets
	jobAtomic                // ATOMIC ACKNOWLEDGE
)

// job is a response waiting to be sent.
type job struct {
	kind      jobKind
	final     bool // a NAK after which the QP is in error: the one packet an ERR QP still sends
	started   bool // a READ job sent its first packet
	psn       wire.PSN
	syndrome  wire.Syndrome
	msn       wire.MSN
	va        uint64
	rkey      wire.RKey
	remaining uint32
	orig      uint64
	due       time.Time // a delayed ACK waits until then unless something else is to be sent
}

// jobRing is a bounded FIFO of jobs. Its size bounds what a peer can make the responder queue.
type jobRing struct {
	slots   []job
	head, n int
}

func (r *jobRing) front() *job {
	if r.n == 0 {
		return nil
	}
	return &r.slots[r.head]
}

func (r *jobRing) tail() *job {
	if r.n == 0 {
		return nil
	}
	return &r.slots[(r.head+r.n-1)%len(r.slots)]
}

func (r *jobRing) full() bool { return r.n == len(r.slots) }

func (r *jobRing) push(j job) {
	r.slots[(r.head+r.n)%len(r.slots)] = j
	r.n++
}

func (r *jobRing) pop() {
	r.head = (r.head + 1) % len(r.slots)
	r.n--
}

// extraJobs is how many jobs beyond the responder resources the ring holds: room for an ACK or NAK
// behind a full set of READs and atomics.
const extraJobs = 4

func (r *responder) init(q *QP) {
	n := q.cfg.MaxRecvSGE
	if q.cfg.SRQ != nil {
		n = q.cfg.SRQ.maxSGE()
	}
	r.sgl = make([]mr.SGE, max(n, 1))
	r.jobs = jobRing{slots: make([]job, extraJobs)}
}

// resizeResources sizes the resources and the job ring for max_dest_rd_atomic n.
func (r *responder) resizeResources(n int) {
	if len(r.res) != max(n, 1) {
		r.res = make([]resource, max(n, 1))
		r.next = 0
	}
	if len(r.jobs.slots) != n+extraJobs {
		nr := jobRing{slots: make([]job, n+extraJobs)}
		for r.jobs.n > 0 && !nr.full() {
			nr.push(*r.jobs.front())
			r.jobs.pop()
		}
		r.jobs = nr
	}
}

func (r *responder) reset() {
	r.psn, r.ackPSN, r.msn, r.nakSent, r.nakUnacked = 0, 0, 0, false, false
	r.msg = message{}
	r.jobs.head, r.jobs.n = 0, 0
	clear(r.res)
	r.next = 0
}

// flush completes the receive bound to an unfinished message and drops every queued response, unless
// a final NAK is queued: then the responses before it and the NAK itself still go out.
func (r *responder) flush(q *QP) {
	if r.msg.hasRecv {
		wc := Completion{WRID: r.msg.recv.id, Status: StatusWRFlushErr, Opcode: CompRecv, QPN: q.qpn}
		r.msg = message{}
		q.pushRecv(&wc, false)
	}
	r.msg = message{}
	if !r.hasFinal() {
		r.jobs.head, r.jobs.n = 0, 0
	}
	clear(r.res)
}

// deadline returns when a delayed ACK at the head of the queue is due, or the zero time.
func (r *responder) deadline() time.Time {
	if j := r.jobs.front(); j != nil && r.jobs.n == 1 {
		return j.due
	}
	return time.Time{}
}

// hasFinal reports whether a connection-ending NAK waits in the job queue.
func (r *responder) hasFinal() bool {
	for k := 0; k < r.jobs.n; k++ {
		if r.jobs.slots[(r.jobs.head+k)%len(r.jobs.slots)].final {
			return true
		}
	}
	return false
}

// canAck reports whether an ACK or NAK can be queued: there is room, or the last queued job is an ACK
// it can replace.
func (r *responder) canAck() bool {
	if !r.jobs.full() {
		return true
	}
	t := r.jobs.tail()
	return t.kind == jobAck && !t.final && t.syndrome.IsACK()
}

// queueAck queues an ACK, NAK or RNR NAK. An ACK still waiting at the tail is replaced rather than
// followed: a later ACK or NAK acknowledges everything the earlier ACK did (IBTA Vol 1 9.7.5.1.4), which is
// how goroce coalesces ACKs.
func (r *responder) queueAck(psn wire.PSN, s wire.Syndrome, final bool) {
	r.queueAckDue(psn, s, final, time.Time{})
}

// queueAckDue queues an ACK that may wait until due (zero: no wait) for company: see Config.AckDelay.
func (r *responder) queueAckDue(psn wire.PSN, s wire.Syndrome, final bool, due time.Time) {
	if s.IsACK() {
		r.nakUnacked = false
	}
	j := job{kind: jobAck, psn: psn, syndrome: s, msn: r.msn, final: final, due: due}
	if t := r.jobs.tail(); t != nil && t.kind == jobAck && !t.final && t.syndrome.IsACK() {
		if !t.due.IsZero() && (due.IsZero() || t.due.Before(due)) {
			j.due = t.due // coalescing never postpones an ACK already waiting
		}
		*t = j
		return
	}
	if !r.jobs.full() {
		r.jobs.push(j)
	}
}

// handle processes a request packet.
func (r *responder) handle(q *QP, now time.Time, p wire.Packet, info *RxInfo) {
	r.now = now
	switch q.state {
	case StateRTR, StateRTS, StateSQD, StateSQE:
	default:
		// IBTA Vol 1 10.3.1: RESET and INIT ignore packets, ERR drops them. CONFORMANCE Q5.
		q.counters.drop(&q.counters.DropState)
		return
	}
	switch q.typ {
	case RC:
		r.handleRC(q, p)
	case UC:
		r.handleUC(q, p)
	case UD:
		r.handleUD(q, p, info)
	}
}

// needsRecv reports whether a request packet consumes a receive work request: the first packet of a
// SEND, and the last packet of a WRITE with immediate.
func needsRecv(i *wire.OpInfo) bool {
	return (i.Op == wire.OpSend && i.Pos.StartsMessage()) || (i.Op == wire.OpWrite && i.Imm)
}

// completesRecv reports whether a packet with opcode info i ends a message that completes a receive:
// a SEND's last (or only) packet, or a WRITE with immediate, which carries the immediate in its last.
func completesRecv(i *wire.OpInfo) bool {
	return (i.Op == wire.OpSend || (i.Op == wire.OpWrite && i.Imm)) && i.Pos.EndsMessage()
}

func (r *responder) handleRC(q *QP, p wire.Packet) {
	bth := p.BTH()
	psn := bth.PSN()
	i := p.Info()

	// PSN: a gap is NAKed once, a duplicate answered again without executing. IBTA Vol 1 9.7.5.1.2.
	switch d := psn.Diff(r.psn); {
	case d > 0:
		q.counters.OutOfSeqRequest++
		if !r.nakSent && r.canAck() {
			r.nakSent = true
			// The ACK ahead of the NAK only when it acknowledges everything before the gap: after a
			// READ or atomic it would carry their PSN (see ackPSN), and their response shows progress.
			if r.nakUnacked && r.ackPSN == r.psn && !r.jobs.full() {
				r.queueAck(r.psn.Sub(1), wire.SyndromeACK(wire.CreditInvalid), false)
				// The NAK must not replace the ACK at the tail, as queueAck would.
				if !r.jobs.full() {
					r.jobs.push(job{kind: jobAck, psn: r.psn, syndrome: wire.SyndromeNAK(wire.NAKPSNSequenceError), msn: r.msn})
				}
			} else {
				r.queueAck(r.psn, wire.SyndromeNAK(wire.NAKPSNSequenceError), false)
			}
			r.nakUnacked = true
		}
		return
	case d < 0:
		q.counters.DuplicateRequest++
		r.duplicate(q, p, psn)
		return
	}

	// A reserved opcode (wire.ParseReserved) is an invalid request. CONFORMANCE L5.
	if !i.Valid() {
		r.fatal(q, psn, wire.NAKInvalidRequest)
		return
	}
	// Opcode sequence: a FIRST or ONLY between messages, MIDDLE and LAST of the open one. IBTA Vol 1
	// 9.7.5.1.3; CONFORMANCE L3, L4.
	if !r.sequenceOK(i) {
		r.fatal(q, psn, wire.NAKInvalidRequest)
		return
	}
	// The QP must allow the operation. CONFORMANCE X4, M3 (NAK invalid request, not access error).
	if !opAllowed(q.attr.AccessFlags, i.Op) {
		r.fatal(q, psn, wire.NAKInvalidRequest)
		return
	}
	readAtomic := i.Op == wire.OpReadRequest || i.Op == wire.OpCompareSwap || i.Op == wire.OpFetchAdd
	if readAtomic && q.attr.MaxDestRdAtomic == 0 {
		r.fatal(q, psn, wire.NAKInvalidRequest) // CONFORMANCE D3
		return
	}
	// Room for what this packet will make the responder send. A peer that floods READs past its
	// max_rd_atomic finds the queue full: the packet is dropped unexecuted and retransmitted later.
	if (readAtomic && r.jobs.full()) || (bth.AckReq() && !r.canAck()) {
		q.counters.drop(&q.counters.DropResponseQueueFull)
		return
	}
	if !r.lengthOK(q, p) {
		r.fatal(q, psn, wire.NAKInvalidRequest) // CONFORMANCE L1, L2
		return
	}
	// A receive work request for SENDs and WRITE with immediate; none posted is an RNR NAK, and the
	// PSN stays so the retry is accepted. IBTA Vol 1 9.7.5.2.8; CONFORMANCE N1, N4.
	if needsRecv(i) && !r.bindRecv(q) {
		if r.canAck() {
			q.counters.SendRNRErr++
			r.queueAck(psn, wire.SyndromeRNR(q.attr.MinRNRTimer), false)
		}
		return
	}

	switch i.Op {
	case wire.OpSend:
		if !r.executeSend(q, p, psn, true) {
			return
		}
	case wire.OpWrite:
		if !r.executeWrite(q, p, psn, true) {
			return
		}
	case wire.OpReadRequest:
		r.executeRead(q, p, psn)
		return
	case wire.OpCompareSwap, wire.OpFetchAdd:
		r.executeAtomic(q, p, psn)
		return
	}
	r.psn = psn.Add(1)
	r.ackPSN = r.psn
	r.nakSent = false
	if bth.AckReq() {
		// Only an ACK for a message that completed a receive here waits for company: the application
		// may answer it, and the answer carries the ACK. Nothing answers a WRITE: its ACK leaves now,
		// coalesced with those of the rest of the batch the datapath is handling.
		var due time.Time
		if d := q.cfg.AckDelay; d > 0 && completesRecv(i) && !r.alone {
			due = r.now.Add(d)
		}
		r.queueAckDue(psn, wire.SyndromeACK(wire.CreditInvalid), false, due)
	} else {
		q.counters.AckDeferred++
	}
}

// sequenceOK checks the opcode sequence of a connected-service request.
func (r *responder) sequenceOK(i *wire.OpInfo) bool {
	if r.msg.op == wire.OpInvalid {
		return i.Pos.StartsMessage()
	}
	return i.Op == r.msg.op && !i.Pos.StartsMessage()
}

// opAllowed reports whether a QP with access flags a lets a peer perform op.
func opAllowed(a mr.Access, op wire.Operation) bool {
	switch op {
	case wire.OpSend:
		return true
	case wire.OpWrite:
		return a&mr.RemoteWrite != 0
	case wire.OpReadRequest:
		return a&mr.RemoteRead != 0
	case wire.OpCompareSwap, wire.OpFetchAdd:
		return a&mr.RemoteAtomic != 0
	}
	// FLUSH and ATOMIC_WRITE are not supported: IBTA answers an unsupported opcode with NAK invalid
	// request. CONFORMANCE L5.
	return false
}

// lengthOK checks a request's payload against the path MTU and, for WRITEs, against the RETH.
// IBTA Vol 1 9.7.5.1.3 (C9-87); rxe_resp.c check_length.
func (r *responder) lengthOK(q *QP, p wire.Packet) bool {
	i := p.Info()
	n := p.PayloadLen()
	switch i.Op {
	case wire.OpSend, wire.OpWrite:
		switch i.Pos {
		case wire.PosFirst, wire.PosMiddle:
			if n != q.mtu {
				return false
			}
		case wire.PosLast:
			if n == 0 || n > q.mtu {
				return false
			}
		case wire.PosOnly:
			if n > q.mtu {
				return false
			}
		}
		if i.Op != wire.OpWrite {
			return true
		}
		if i.Pos.StartsMessage() {
			l := p.RETH().DMALen()
			if l > mr.MaxMessage {
				return false
			}
			if i.Pos == wire.PosOnly {
				return uint32(n) == l
			}
			return l > uint32(n)
		}
		if uint32(n) > r.msg.remaining {
			return false
		}
		return i.Pos != wire.PosLast || uint32(n) == r.msg.remaining
	case wire.OpReadRequest:
		return p.RETH().DMALen() <= mr.MaxMessage
	}
	return true
}

// bindRecv takes a receive work request for the message, from the SRQ or the QP's receive queue,
// unless one is already bound.
func (r *responder) bindRecv(q *QP) bool {
	if r.msg.hasRecv {
		return true
	}
	if srq := q.cfg.SRQ; srq != nil {
		w, ok := srq.take(r.sgl)
		if !ok {
			return false
		}
		r.msg.recv, r.msg.hasRecv = w, true
		return true
	}
	w := q.rq.front()
	if w == nil {
		return false
	}
	r.msg.recv = recvWQE{id: w.id, len: w.len, sgl: r.sgl[:copy(r.sgl, w.sgl)]}
	r.msg.hasRecv = true
	q.rq.pop()
	return true
}

// completeRecv completes the bound receive work request and releases it.
func (r *responder) completeRecv(q *QP, wc *Completion, solicited bool) {
	wc.WRID, wc.QPN = r.msg.recv.id, q.qpn
	r.msg.hasRecv = false
	q.pushRecv(wc, solicited)
}

// fatal answers a request with a NAK that ends the connection: class C errors (invalid request, remote
// access, remote operational) NAK and move the responder to ERR. IBTA Vol 1 9.9.3.1. A bound receive
// completes with recvStatus if it is set, else it is flushed.
func (r *responder) fatal(q *QP, psn wire.PSN, code wire.NAKCode) {
	r.fatalRecv(q, psn, code, 0)
}

func (r *responder) fatalRecv(q *QP, psn wire.PSN, code wire.NAKCode, recvStatus Status) {
	// Responses already queued answer earlier, valid requests: they go out first, then the NAK. An
	// ACK waiting at the tail is replaced, since the NAK acknowledges all it did.
	nak := job{kind: jobAck, final: true, psn: psn, syndrome: wire.SyndromeNAK(code), msn: r.msn}
	switch t := r.jobs.tail(); {
	case t != nil && t.kind == jobAck && !t.final:
		*t = nak
	case r.jobs.full():
		*t = nak // the ring is bounded; the NAK matters more than the last response
	default:
		r.jobs.push(nak)
	}
	if recvStatus != 0 && r.msg.hasRecv {
		wc := Completion{Status: recvStatus, Opcode: CompRecv}
		r.completeRecv(q, &wc, false)
	}
	q.enterError()
}

// nakFor maps a memory error to the NAK code the spec gives it.
func nakFor(err error) wire.NAKCode {
	if errors.Is(err, mr.ErrInvalidRequest) {
		return wire.NAKInvalidRequest
	}
	return wire.NAKRemoteAccessError
}

// executeSend places a SEND packet's payload and completes the receive at the message's end. reliable
// selects RC's error handling (NAK and ERR) over UC's (drop the message). It reports whether the packet
// was accepted.
func (r *responder) executeSend(q *QP, p wire.Packet, psn wire.PSN, reliable bool) bool {
	i := p.Info()
	if i.Pos.StartsMessage() {
		r.msg.op, r.msg.offset = wire.OpSend, 0
	}
	if n := p.PayloadLen(); n > 0 {
		if err := q.cfg.Memory.Scatter(q.cfg.PD, r.msg.recv.sgl, r.msg.offset, p.Payload()); err != nil {
			if !reliable {
				r.msg.op = wire.OpInvalid // UC: drop the message, keep the receive for the next one
				q.counters.drop(&q.counters.DropUCMessage)
				return false
			}
			// A receive buffer too small is an invalid request (CONFORMANCE M5); a bad receive buffer a
			// remote operational error (M4).
			if errors.Is(err, mr.ErrLength) {
				r.fatalRecv(q, psn, wire.NAKInvalidRequest, StatusLocLenErr)
			} else {
				r.fatalRecv(q, psn, wire.NAKRemoteOperationalError, StatusLocProtErr)
			}
			return false
		}
		r.msg.offset += uint64(n)
	}
	if !i.Pos.EndsMessage() {
		return true
	}
	wc := Completion{Opcode: CompRecv, ByteLen: uint32(r.msg.offset)}
	if i.Imm {
		wc.Imm, wc.Flags = p.ImmDt().Imm(), wc.Flags|WithImm
	}
	if i.Invalidate {
		k := p.IETH().RKey()
		wc.InvalidatedRKey, wc.Flags = k, wc.Flags|WithInv
		if err := q.cfg.Memory.RemoteInvalidate(q.cfg.PD, k); err != nil {
			// rxe completes the receive with an error and ends the connection, but the request is
			// still acknowledged: IBTA class J sends no NAK. CONFORMANCE M8.
			wc.Status = StatusRemInvReqErr
			q.counters.InvalidateErr++
		}
	}
	r.msg.op = wire.OpInvalid
	r.msn = r.msn.Add(1)
	r.completeRecv(q, &wc, p.BTH().SolicitedEvent())
	if wc.Status != StatusSuccess {
		r.psn = psn.Add(1)
		r.ackPSN = r.psn
		r.queueAck(psn, wire.SyndromeACK(wire.CreditInvalid), true)
		q.enterError()
		return false
	}
	return true
}

// executeWrite writes a WRITE packet's payload and, for WRITE with immediate, completes the receive at
// the message's end.
func (r *responder) executeWrite(q *QP, p wire.Packet, psn wire.PSN, reliable bool) bool {
	i := p.Info()
	fail := func(err error) bool {
		if !reliable {
			r.msg.op = wire.OpInvalid
			q.counters.drop(&q.counters.DropUCMessage)
			return false
		}
		r.fatal(q, psn, nakFor(err))
		return false
	}
	if i.Pos.StartsMessage() {
		reth := p.RETH()
		r.msg.op, r.msg.va, r.msg.rkey = wire.OpWrite, reth.VA(), reth.RKey()
		r.msg.remaining, r.msg.total = reth.DMALen(), reth.DMALen()
		// The whole range is checked at the first packet; a zero-length WRITE checks nothing (C9-88).
		if r.msg.total > 0 {
			if err := q.cfg.Memory.CheckRemote(q.cfg.PD, r.msg.rkey, r.msg.va, r.msg.total, mr.RemoteWrite); err != nil {
				return fail(err)
			}
		}
	}
	if n := p.PayloadLen(); n > 0 {
		if err := q.cfg.Memory.WriteRemote(q.cfg.PD, r.msg.rkey, r.msg.va, p.Payload()); err != nil {
			return fail(err)
		}
		r.msg.va += uint64(n)
		r.msg.remaining -= uint32(n)
	}
	if !i.Pos.EndsMessage() {
		return true
	}
	r.msg.op = wire.OpInvalid
	r.msn = r.msn.Add(1)
	if i.Imm {
		wc := Completion{Opcode: CompRecvRDMAWithImm, ByteLen: r.msg.total, Imm: p.ImmDt().Imm(), Flags: WithImm}
		r.completeRecv(q, &wc, p.BTH().SolicitedEvent())
	}
	return true
}

// newResource returns the next responder resource slot, reusing the oldest: rxe recycles resources
// round robin and leaves policing max_dest_rd_atomic to the requester. CONFORMANCE D4.
func (r *responder) newResource() *resource {
	res := &r.res[r.next]
	r.next = (r.next + 1) % len(r.res)
	return res
}

func (r *responder) executeRead(q *QP, p wire.Packet, psn wire.PSN) {
	reth := p.RETH()
	l := reth.DMALen()
	if l > 0 {
		if err := q.cfg.Memory.CheckRemote(q.cfg.PD, reth.RKey(), reth.VA(), l, mr.RemoteRead); err != nil {
			r.fatal(q, psn, nakFor(err))
			return
		}
	}
	n := packets(l, q.mtu)
	*r.newResource() = resource{valid: true, first: psn, last: psn.Add(n - 1), va: reth.VA(), rkey: reth.RKey(), length: l}
	r.msn = r.msn.Add(1) // a READ counts as a message when it arrives. IBTA Vol 1 C9-148
	r.jobs.push(job{kind: jobRead, psn: psn, msn: r.msn, va: reth.VA(), rkey: reth.RKey(), remaining: l})
	r.psn = psn.Add(n)
	r.nakSent = false
}

func (r *responder) executeAtomic(q *QP, p wire.Packet, psn wire.PSN) {
	a := p.AtomicETH()
	var orig uint64
	var err error
	if p.Info().Op == wire.OpCompareSwap {
		orig, err = q.cfg.Memory.CompareSwap(q.cfg.PD, a.RKey(), a.VA(), a.Compare(), a.SwapAdd())
	} else {
		orig, err = q.cfg.Memory.FetchAdd(q.cfg.PD, a.RKey(), a.VA(), a.SwapAdd())
	}
	if err != nil {
		r.fatal(q, psn, nakFor(err)) // CONFORMANCE X3, X4
		return
	}
	*r.newResource() = resource{valid: true, atomic: true, first: psn, last: psn, va: a.VA(), rkey: a.RKey(), orig: orig, length: 8}
	r.msn = r.msn.Add(1)
	r.jobs.push(job{kind: jobAtomic, psn: psn, msn: r.msn, orig: orig})
	r.psn = psn.Add(1)
	r.nakSent = false
}

// duplicate answers a request whose PSN is behind the expected one, without executing it again.
// IBTA Vol 1 9.7.5.1.2 (C9-105 for SEND and WRITE); rxe_resp.c duplicate_request. CONFORMANCE P5-P8.
func (r *responder) duplicate(q *QP, p wire.Packet, psn wire.PSN) {
	i := p.Info()
	switch i.Op {
	case wire.OpSend, wire.OpWrite:
		if r.canAck() {
			r.queueAck(r.ackPSN.Sub(1), wire.SyndromeACK(wire.CreditInvalid), false)
		}
	case wire.OpReadRequest:
		res := r.findResource(psn, false)
		if res == nil || r.jobs.full() {
			q.counters.drop(&q.counters.DropDuplicate)
			return
		}
		reth := p.RETH()
		off := uint64(psn.Diff(res.first)) * uint64(q.mtu)
		// A retried READ must ask for the rest of the original from the matching offset. IBTA Vol 1
		// 9.7.5.1.2; CONFORMANCE P6, P7.
		if reth.RKey() != res.rkey || reth.VA() != res.va+off || uint64(reth.DMALen())+off != uint64(res.length) {
			q.counters.drop(&q.counters.DropDuplicate)
			return
		}
		r.jobs.push(job{kind: jobRead, psn: psn, msn: r.msn, va: reth.VA(), rkey: res.rkey, remaining: reth.DMALen()})
	case wire.OpCompareSwap, wire.OpFetchAdd:
		res := r.findResource(psn, true)
		if res == nil || res.first != psn || r.jobs.full() {
			q.counters.drop(&q.counters.DropDuplicate)
			return
		}
		r.jobs.push(job{kind: jobAtomic, psn: psn, msn: r.msn, orig: res.orig})
	default:
		q.counters.drop(&q.counters.DropDuplicate)
	}
}

func (r *responder) findResource(psn wire.PSN, atomic bool) *resource {
	for k := range r.res {
		res := &r.res[k]
		if res.valid && res.atomic == atomic && psn.InWindow(res.first, uint32(res.last.Diff(res.first))+1) {
			return res
		}
	}
	return nil
}

// handleUC processes a UC request: in order or not at all, never acknowledged. A gap drops the message
// in progress; its receive is kept for the next one. IBTA Vol 1 9.8.3; CONFORMANCE U8, U9.
func (r *responder) handleUC(q *QP, p wire.Packet) {
	psn := p.BTH().PSN()
	i := p.Info()
	if psn != r.psn {
		q.counters.OutOfSeqRequest++
		r.msg.op = wire.OpInvalid
	}
	r.psn = psn.Add(1)
	if i.Pos.StartsMessage() {
		r.msg.op = wire.OpInvalid // a FIRST while a message is open replaces it
	} else if r.msg.op != i.Op {
		q.counters.drop(&q.counters.DropUCMessage)
		r.msg.op = wire.OpInvalid
		return
	}
	if !opAllowed(q.attr.AccessFlags, i.Op) || !r.lengthOK(q, p) {
		q.counters.drop(&q.counters.DropUCMessage)
		r.msg.op = wire.OpInvalid
		return
	}
	if needsRecv(i) && !r.bindRecv(q) {
		q.counters.drop(&q.counters.DropNoRecv) // no RNR on UC: the message is lost
		r.msg.op = wire.OpInvalid
		return
	}
	switch i.Op {
	case wire.OpSend:
		r.executeSend(q, p, psn, false)
	case wire.OpWrite:
		r.executeWrite(q, p, psn, false)
	}
}

// grhLen is the room a UD receive buffer keeps for the GRH. IBTA Annex A17.4.5.2.
const grhLen = 40

// handleUD processes a UD datagram: Q_Key checked, PSN ignored, delivered whole behind its GRH or
// dropped. IBTA Vol 1 9.8.4; CONFORMANCE U1, U2, U4.
func (r *responder) handleUD(q *QP, p wire.Packet, info *RxInfo) {
	d := p.DETH()
	want := q.attr.QKey
	if q.qpn == wire.QPNGSI {
		want = wire.GSIQKey
	}
	if d.QKey() != want {
		q.counters.drop(&q.counters.DropQKey)
		return
	}
	if !r.bindRecv(q) {
		q.counters.drop(&q.counters.DropNoRecv)
		return
	}
	n := p.PayloadLen()
	if r.msg.recv.len < uint64(grhLen+n) {
		q.counters.drop(&q.counters.DropRecvTooSmall) // the receive stays for the next datagram
		return
	}
	var grh [grhLen]byte
	if info != nil {
		grh = info.GRH
	}
	mem := q.cfg.Memory
	if err := mem.Scatter(q.cfg.PD, r.msg.recv.sgl, 0, grh[:]); err == nil {
		err = mem.Scatter(q.cfg.PD, r.msg.recv.sgl, grhLen, p.Payload())
		if err == nil {
			wc := Completion{Opcode: CompRecv, ByteLen: uint32(grhLen + n), SrcQP: d.SrcQP(), Flags: WithGRH}
			if p.Info().Imm {
				wc.Imm, wc.Flags = p.ImmDt().Imm(), wc.Flags|WithImm
			}
			r.completeRecv(q, &wc, p.BTH().SolicitedEvent())
			return
		}
	}
	wc := Completion{Status: StatusLocProtErr, Opcode: CompRecv}
	r.completeRecv(q, &wc, false)
	q.enterError()
}

// heldUntil returns when the ACK held back for company (Config.AckDelay) is due, if the only job
// queued is one, else the zero time. AppendPacket leaves it for the round that builds a request, or
// until then; MaySend reads the same.
func (r *responder) heldUntil() time.Time {
	if j := r.jobs.front(); j != nil && !j.due.IsZero() && r.jobs.n == 1 {
		return j.due
	}
	return time.Time{}
}

// appendPacket builds the next response packet.
func (r *responder) appendPacket(q *QP, now time.Time, dst []byte, force bool) ([]byte, Tx, bool) {
	j := r.jobs.front()
	if j == nil || q.typ != RC {
		return dst, Tx{}, false
	}
	if due := r.heldUntil(); !due.IsZero() && !force {
		if now.Before(due) {
			return dst, Tx{}, false // a delayed ACK waiting for company
		}
		r.alone = true // it waited in vain
	}
	switch q.state {
	case StateRTR, StateRTS, StateSQD:
	case StateErr:
		if !r.hasFinal() {
			r.jobs.head, r.jobs.n = 0, 0
			return dst, Tx{}, false
		}
	default:
		return dst, Tx{}, false
	}
	f := wire.Fields{BTH: wire.BTHFields{PKey: q.attr.PKey, DestQP: q.attr.DestQPN, PSN: j.psn}}
	var out []byte
	fatal := j.final && j.syndrome.Kind() == wire.KindNAK
	switch j.kind {
	case jobAck:
		f.BTH.Opcode = wire.RCAcknowledge
		f.AETH = wire.AETHFields{Syndrome: j.syndrome, MSN: j.msn}
		out, _ = wire.Append(dst, &f, nil)
		if j.syndrome.Kind() == wire.KindNAK {
			q.counters.NAKsSent[j.syndrome.NAKCode()&7]++
		}
		r.jobs.pop()
	case jobAtomic:
		f.BTH.Opcode = wire.RCAtomicAcknowledge
		f.AETH = wire.AETHFields{Syndrome: wire.SyndromeACK(wire.CreditInvalid), MSN: j.msn}
		f.AtomicAck = j.orig
		out, _ = wire.Append(dst, &f, nil)
		r.jobs.pop()
	case jobRead:
		n := min(j.remaining, uint32(q.mtu))
		first, last := !j.started, j.remaining == n
		switch {
		case first && last:
			f.BTH.Opcode = wire.RCReadResponseOnly
		case first:
			f.BTH.Opcode = wire.RCReadResponseFirst
		case last:
			f.BTH.Opcode = wire.RCReadResponseLast
		default:
			f.BTH.Opcode = wire.RCReadResponseMiddle
		}
		f.AETH = wire.AETHFields{Syndrome: wire.SyndromeACK(wire.CreditInvalid), MSN: j.msn}
		out, _ = wire.AppendHeaders(dst, &f, int(n))
		if n > 0 {
			// The region is checked as the packet is built: a region invalidated since the request
			// turns into NAK remote access error. CONFORMANCE D5.
			var err error
			if q.byRef && n >= RefMin {
				var pl []byte
				if pl, err = q.cfg.Memory.ReadRemoteRef(q.cfg.PD, j.rkey, j.va, int(n)); err == nil {
					q.refs, q.refAt, q.refLen = append(q.refs, pl), len(out)-len(dst), int(n)
				}
			} else {
				var pl []byte
				out, pl = extend(out, int(n))
				err = q.cfg.Memory.ReadRemote(q.cfg.PD, j.rkey, j.va, pl)
			}
			if err != nil {
				// The NAK takes the READ's place at the head of the queue, and what was queued
				// behind it answers later requests the NAK ends: it goes too.
				r.jobs.n = 1
				*j = job{kind: jobAck, final: true, psn: j.psn, syndrome: wire.SyndromeNAK(nakFor(err)), msn: r.msn}
				q.enterError()
				return r.appendPacket(q, now, dst, force)
			}
		}
		out = wire.AppendTrailer(out, int(n))
		j.started = true
		j.psn = j.psn.Add(1)
		j.va += uint64(n)
		j.remaining -= n
		if last {
			r.jobs.pop()
		}
	}
	if fatal {
		q.counters.FatalNAKs++
	}
	return out, Tx{AH: q.attr.AV, DestQPN: q.attr.DestQPN, SrcQPN: q.qpn, PacketLen: q.packetLen(dst, out)}, true
}
