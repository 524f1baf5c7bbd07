package qp

import (
	"errors"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// requester turns send work requests into request packets: it picks opcodes, segments by path MTU,
// assigns PSNs, sets AckReq, and respects the PSN window, the initiator depth, fences and the pacer.
// IBTA Vol 1 9.4 (packet sequences); rxe_req.c.
type requester struct {
	psn          wire.PSN  // PSN of the next packet
	max          wire.PSN  // the PSN after the highest ever sent: responses at or past it answer nothing
	next         int       // WQEs from the send queue's head that are wholly sent
	noAck        int       // packets sent since the last one with AckReq
	rdAtomic     int       // READs and atomics sent and not yet completed
	blockedUntil time.Time // the pacer holds the next packet until then
}

func (r *requester) reset() {
	r.next, r.noAck, r.rdAtomic = 0, 0, 0
	r.blockedUntil = time.Time{}
}

// appendPacket builds the next request packet, if the QP may send one now.
func (r *requester) appendPacket(q *QP, now time.Time, dst []byte) ([]byte, Tx, bool) {
	if q.state != StateRTS && q.state != StateSQD {
		return dst, Tx{}, false
	}
	if q.cmp.waitingRNR() {
		return dst, Tx{}, false
	}
	if r.next >= q.sq.n {
		return dst, Tx{}, false
	}
	w := q.sq.at(r.next)
	if !w.started {
		// Draining: no new request starts, but one sent before and rewound by a retry goes again.
		// IBTA Vol 1 10.3.1 (SQD).
		if q.state == StateSQD && !w.assigned {
			return dst, Tx{}, false
		}
		if w.wr.Flags&Fence != 0 && r.rdAtomic > 0 {
			return dst, Tx{}, false // IBTA Vol 1 10.8.3.3: a fenced request waits for earlier READs and atomics
		}
		if w.wr.Opcode.isReadAtomic() && r.rdAtomic >= int(q.attr.MaxRdAtomic) {
			return dst, Tx{}, false // initiator depth: IBTA Vol 1 9.5 (max_rd_atomic)
		}
	}
	if q.typ == RC && r.psn.Diff(q.cmp.psn) >= maxUnackedPSNs {
		return dst, Tx{}, false
	}
	payload := 0
	if !w.wr.Opcode.isReadAtomic() {
		payload = min(int(w.length-w.offset), q.mtu)
	}
	if p := q.cfg.Pacer; p != nil {
		if t := p.NextSend(now, payload); t.After(now) {
			r.blockedUntil = t
			return dst, Tx{}, false
		}
		r.blockedUntil = time.Time{}
	}
	fresh := !r.psn.Before(r.max)
	out, err := r.build(q, w, dst, payload)
	if err != nil {
		q.counters.SendErr++
		q.fail(localStatus(err))
		return dst, Tx{}, false
	}
	if p := q.cfg.Pacer; p != nil {
		p.OnSent(now, q.packetLen(dst, out))
	}
	tx := Tx{AH: q.attr.AV, DestQPN: q.attr.DestQPN, SrcQPN: q.qpn, PacketLen: q.packetLen(dst, out)}
	if !fresh && q.typ == RC {
		tx.Resend = q.cmp.why
	}
	if q.typ == UD {
		tx.AH, tx.DestQPN = w.ah, w.wr.RemoteQPN
	}
	switch {
	case q.typ == RC:
		// The local ACK timer runs whenever a packet is unacknowledged: armed by the first packet sent
		// while it is idle, restarted by progress (rxe_req.c: "armed if not pending"). Arming it only at
		// the end of a message would leave a long WRITE whose window of packets all got lost without
		// any timer at all. The tail-loss probe counts from the last packet.
		c := &q.cmp
		if c.timer.IsZero() {
			c.armTimer(q, now)
		}
		c.armProbe(q, now)
		if wire.BTH(out[len(dst):]).AckReq() && !c.rttOn && (fresh || !c.timedOut) {
			c.rttPSN, c.rttSent, c.rttOn = r.psn.Sub(1), now, true
		}
	case w.sent:
		// UC and UD requests complete once sent: nothing acknowledges them. IBTA Vol 1 9.8.
		q.complete(w, StatusSuccess)
	}
	return out, tx, true
}

// localStatus maps a memory error of the send path to its completion status.
func localStatus(err error) Status {
	if errors.Is(err, mr.ErrLength) {
		return StatusLocLenErr
	}
	return StatusLocProtErr
}

// appendProbe builds the tail-loss probe (Config.TailProbe): the last packet sent, again, with
// AckReq, leaving the requester where it was. A responder that has everything before it answers with
// an ACK through it (taking it if the first copy was lost, acknowledging a duplicate otherwise), one
// that misses earlier packets with a PSN sequence NAK for the first it misses, which starts go-back-N
// from there. Because the probe follows the packets before it, a slow responder answers it only after
// working through them: unlike a copy of the oldest unacknowledged packet, whose answer cannot be
// told apart from the ACKs of that backlog, it asks for no resend of what is merely queued. RFC 8985
// section 7.3. While a resend that a NAK started has drawn no response, the probe is instead the
// oldest unacknowledged packet: the responder NAKs a gap only once (IBTA Vol 1 9.7.5.1.2), so a lost
// resend of the missing packet leaves it silent to anything later. It declines when the packet
// belongs to a READ or an atomic, whose replay the timeout handles.
func (r *requester) appendProbe(q *QP, now time.Time, dst []byte) ([]byte, Tx, bool) {
	psn := r.max.Sub(1)
	if q.cmp.retrying {
		psn = q.cmp.psn
	}
	for i := 0; i < q.sq.n; i++ {
		w := q.sq.at(i)
		if !w.assigned || psn.Before(w.firstPSN) {
			break
		}
		if psn.After(w.lastPSN) {
			continue
		}
		if w.wr.Opcode.isReadAtomic() {
			return dst, Tx{}, false
		}
		probeOffset := uint32(psn.Diff(w.firstPSN)) * uint32(q.mtu)
		payload := min(int(w.length-probeOffset), q.mtu)
		// The probe is a packet like any other to the rate limiter (DCQCN's reaction point paces
		// the QP, not its first transmissions only): it waits for the pacer, and is charged to it.
		// Held, it is due again when the pacer lets it go, if the tail is still unanswered then.
		if p := q.cfg.Pacer; p != nil {
			if t := p.NextSend(now, payload); t.After(now) {
				q.cmp.probeAt = t
				return dst, Tx{}, false
			}
		}
		saved, offset, sent, started := *r, w.offset, w.sent, w.started
		r.psn, r.noAck = psn, maxPktsPerAck // AckReq
		w.offset, w.started = probeOffset, true
		out, err := r.build(q, w, dst, payload)
		*r, w.offset, w.sent, w.started = saved, offset, sent, started
		if err != nil {
			return dst, Tx{}, false
		}
		if p := q.cfg.Pacer; p != nil {
			p.OnSent(now, q.packetLen(dst, out))
		}
		q.cmp.probes++
		q.cmp.probeHigh = psn
		q.cmp.armProbe(q, now) // the next, if the episode allows one
		return out, Tx{AH: q.attr.AV, DestQPN: q.attr.DestQPN, SrcQPN: q.qpn, PacketLen: q.packetLen(dst, out), Resend: ResendProbe}, true
	}
	return dst, Tx{}, false
}

// build appends the next packet of w to dst and advances the requester past it.
func (r *requester) build(q *QP, w *sendWQE, dst []byte, payload int) ([]byte, error) {
	if !w.started {
		w.started, w.assigned = true, true
		w.firstPSN = r.psn
		w.lastPSN = r.psn.Add(packets(w.length, q.mtu) - 1)
		w.offset = 0
		if w.wr.Opcode.isAtomic() {
			w.lastPSN = r.psn
		}
	}
	op := w.wr.Opcode
	first := w.offset == 0
	last := op.isReadAtomic() || w.offset+uint32(payload) == w.length
	var f wire.Fields
	f.BTH = wire.BTHFields{
		Opcode:         opcodeFor(q.typ, op, first, last),
		SolicitedEvent: last && w.wr.Flags&Solicited != 0,
		PKey:           q.attr.PKey,
		DestQP:         q.attr.DestQPN,
		PSN:            r.psn,
	}
	switch {
	case q.typ == UD:
		f.BTH.DestQP = w.wr.RemoteQPN
		f.DETH = wire.DETHFields{QKey: w.wr.RemoteQKey, SrcQP: q.qpn}
		if f.DETH.QKey&0x80000000 != 0 {
			f.DETH.QKey = q.attr.QKey // IBTA Vol 1 10.2: a Q_Key with the top bit set means the QP's own
		}
		if q.qpn == wire.QPNGSI {
			f.DETH.QKey = wire.GSIQKey
		}
	case op.isWrite() && first:
		f.RETH = wire.RETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, DMALen: w.length}
	case op == WRRead:
		f.RETH = wire.RETHFields{VA: w.wr.RemoteAddr + uint64(w.offset), RKey: w.wr.RKey, DMALen: w.length - w.offset}
	case op == WRCompareSwap:
		f.AtomicETH = wire.AtomicETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, SwapAdd: w.wr.Swap, Compare: w.wr.CompareAdd}
	case op == WRFetchAdd:
		f.AtomicETH = wire.AtomicETHFields{VA: w.wr.RemoteAddr, RKey: w.wr.RKey, SwapAdd: w.wr.CompareAdd}
	}
	if last {
		f.Imm = w.wr.Imm
		f.IETH = w.wr.InvalidateRKey
	}
	if q.typ == RC {
		// AckReq on the last packet of a message, and on one of every maxPktsPerAck+1 packets of a long
		// one, as rxe's requester does (rxe_req.c init_req_packet). READs and atomics are always
		// answered; rxe sets AckReq on them too.
		if last || r.noAck >= maxPktsPerAck {
			f.BTH.AckReq = true
			r.noAck = 0
		} else {
			r.noAck++
		}
	}
	out, err := wire.AppendHeaders(dst, &f, payload)
	if err != nil {
		return dst, err
	}
	switch {
	case payload >= RefMin && q.byRef && w.inline == nil && len(w.wr.SGL) <= RefMaxPieces:
		refs, err := q.cfg.Memory.GatherRefs(q.cfg.PD, w.wr.SGL, uint64(w.offset), payload, q.refs)
		if err != nil {
			return dst, err
		}
		q.refs, q.refAt, q.refLen = refs, len(out)-len(dst), payload
	case payload > 0:
		var p []byte
		out, p = extend(out, payload)
		if w.inline != nil {
			copy(p, w.inline[w.offset:])
		} else if err := q.cfg.Memory.Gather(q.cfg.PD, w.wr.SGL, uint64(w.offset), p); err != nil {
			return dst, err
		}
	}
	out = wire.AppendTrailer(out, payload)

	switch {
	case op == WRRead:
		r.psn = r.psn.Add(packets(w.length-w.offset, q.mtu))
		r.rdAtomic++
	case op.isAtomic():
		r.psn = r.psn.Add(1)
		r.rdAtomic++
	default:
		r.psn = r.psn.Add(1)
		w.offset += uint32(payload)
	}
	if last {
		w.sent = true
		r.next++
	}
	if r.psn.After(r.max) {
		r.max = r.psn
	}
	return out, nil
}

// opcodeFor picks the BTH opcode of a packet of a request: its operation and its place in the message.
// IBTA Vol 1 9.4.
func opcodeFor(t Type, op WROpcode, first, last bool) wire.Opcode {
	var o wire.Opcode
	switch op {
	case WRRead:
		return wire.RCReadRequest
	case WRCompareSwap:
		return wire.RCCompareSwap
	case WRFetchAdd:
		return wire.RCFetchAdd
	case WRWrite, WRWriteImm:
		switch {
		case first && last:
			o = wire.RCWriteOnly
			if op == WRWriteImm {
				o = wire.RCWriteOnlyImm
			}
		case first:
			o = wire.RCWriteFirst
		case last:
			o = wire.RCWriteLast
			if op == WRWriteImm {
				o = wire.RCWriteLastImm
			}
		default:
			o = wire.RCWriteMiddle
		}
	default:
		switch {
		case first && last:
			o = wire.RCSendOnly
			switch op {
			case WRSendImm:
				o = wire.RCSendOnlyImm
			case WRSendInv:
				o = wire.RCSendOnlyInvalidate
			}
		case first:
			o = wire.RCSendFirst
		case last:
			o = wire.RCSendLast
			switch op {
			case WRSendImm:
				o = wire.RCSendLastImm
			case WRSendInv:
				o = wire.RCSendLastInvalidate
			}
		default:
			o = wire.RCSendMiddle
		}
	}
	switch t {
	case UC:
		o |= wire.Opcode(wire.TransportUC)
	case UD:
		o = wire.UDSendOnly
		if op == WRSendImm {
			o = wire.UDSendOnlyImm
		}
	}
	return o
}

// extend grows b by n bytes and returns it with the new bytes.
func extend(b []byte, n int) ([]byte, []byte) {
	l := len(b)
	if cap(b)-l < n {
		nb := make([]byte, l, l+n+wire.ICRCLen+4)
		copy(nb, b)
		b = nb
	}
	b = b[:l+n]
	return b, b[l:]
}
