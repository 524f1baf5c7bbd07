package qp

import (
	"encoding/binary"
	"time"

	"github.com/goroce/goroce/wire"
)

// completer turns responses into completions: ACKs complete SEND and WRITE requests (an ACK's PSN
// acknowledges everything before it too), READ responses and atomic acknowledgements carry data back,
// NAKs and timeouts send the requester back to the oldest unacknowledged PSN (go-back-N), and RNR NAKs
// make it wait. IBTA Vol 1 9.7 (reliable service); rxe_comp.c.
type completer struct {
	psn       wire.PSN  // oldest unacknowledged PSN
	retryLeft uint8     // transport retries left for the current PSN
	rnrLeft   uint8     // RNR retries left
	timer     time.Time // local ACK timeout; zero when nothing is outstanding or the timer is disabled
	rnrUntil  time.Time // end of an RNR wait; zero when not waiting
	// retrying is set while a retry started by a NAK or an implied NAK has made no progress. Until it
	// clears, further NAKs and implied NAKs (typically the many duplicate ACKs a go-back-N resend
	// draws) start no new retry; only the timer does. rxe_comp.c comp.started_retry.
	retrying bool

	// The tail-loss probe (Config.TailProbe): probeAt is when it is due, zero when none is armed;
	// probeDue asks AppendPacket to send it. probes counts the probes of this episode; while it is not
	// 0 a probe is out, the latest a copy of probeHigh, the last packet sent. The episode ends when an
	// ACK covers probeHigh or a retry starts; until then only maxProbes go, each after twice the wait
	// of the one before, and then the local ACK timeout alone is left (RFC 8985 section 7.3 sends one
	// per episode; a second here costs one more duplicate and saves the ACK timeout when the first
	// probe is lost). The probe's answer needs no reading of its own: the ACK or PSN sequence NAK it
	// draws does what any ACK or NAK does.
	probeAt   time.Time
	probeDue  bool
	probes    uint8
	probeHigh wire.PSN
	// why is what started the resend under way: what the packets it sends again give as Tx.Resend.
	why Resend
	// The round-trip estimate the probe waits for: srtt is smoothed over samples, one at a time, each
	// the wait for the ACK of a packet with AckReq (rttPSN, sent at rttSent). A retry voids the sample
	// in flight (Karn's rule).
	srtt    time.Duration
	rttvar  time.Duration
	rttPSN  wire.PSN
	rttSent time.Time
	rttOn   bool
	// timedOut is set by a go-back-N that a timeout started and cleared by one a NAK started. After a
	// NAK the responder has discarded every copy from the NAKed PSN on, so the resent packets are the
	// ones it answers and may be timed; after a timeout nobody knows which copy an ACK answers.
	timedOut bool
}

func (c *completer) stopTimers() {
	c.timer, c.rnrUntil, c.probeAt = time.Time{}, time.Time{}, time.Time{}
	c.retrying, c.probeDue = false, false
}

// probeTimeout returns how long after the last packet the tail-loss probe waits: twice the smoothed
// round trip, or the smoothed round trip and four times its variation if that is longer (RFC 6298's
// retransmission timeout), at least MinProbe; 0 when the probe is off, the local ACK timer is off (timeout 0 waits
// forever), no round trip has been measured yet, or the probe would not come well before the timeout.
func (c *completer) probeTimeout(q *QP) time.Duration {
	if !q.cfg.TailProbe || q.typ != RC || q.attr.Timeout == 0 {
		return 0
	}
	if c.srtt == 0 {
		return 0 // no round trip measured yet: nothing tells a lost tail from a slow path
	}
	pto := max(2*c.srtt, c.srtt+4*c.rttvar, q.cfg.MinProbe)
	if pto >= ackTimeout(q.attr.Timeout)/2 {
		return 0
	}
	return pto
}

// armProbe (re)starts the probe timer after a packet left at now, unless a probe already went for
// this tail.
func (c *completer) armProbe(q *QP, now time.Time) {
	if c.probes >= maxProbes {
		return
	}
	if pto := c.probeTimeout(q); pto > 0 {
		c.probeAt = now.Add(pto << c.probes)
	}
}

// sampleRTT takes a round-trip sample when the packet being timed is acknowledged.
func (c *completer) sampleRTT(now time.Time) {
	if !c.rttOn || !c.psn.After(c.rttPSN) {
		return
	}
	c.rttOn = false
	rtt := now.Sub(c.rttSent)
	if c.srtt == 0 {
		c.srtt, c.rttvar = rtt, rtt/2
		return
	}
	// RFC 6298 section 2.3: beta 1/4, alpha 1/8.
	d := c.srtt - rtt
	if d < 0 {
		d = -d
	}
	c.rttvar += (d - c.rttvar) / 4
	c.srtt += (rtt - c.srtt) / 8
}

func (c *completer) waitingRNR() bool { return !c.rnrUntil.IsZero() }

// ackTimeout returns the local ACK timeout for the QP's timeout attribute: 4.096 us * 2^timeout.
// IBTA Vol 1 9.7.6.1.3 (transport timer).
func ackTimeout(code uint8) time.Duration {
	return time.Duration(4096<<code) * time.Nanosecond
}

// armTimer (re)starts the local ACK timeout, unless it is disabled (timeout 0).
func (c *completer) armTimer(q *QP, now time.Time) {
	if q.attr.Timeout == 0 || c.waitingRNR() {
		return
	}
	c.timer = now.Add(ackTimeout(q.attr.Timeout))
}

// progress records a valid response: the retry counters start over (IBA C9-139; rxe
// reset_retry_counters) and the timer restarts while requests remain outstanding.
func (c *completer) progress(q *QP, now time.Time) {
	if c.psn.After(q.req.psn) {
		// Responses to the first transmission acknowledged what a retry has not resent yet: skip it.
		q.rewind()
	}
	c.retrying = false
	c.retryLeft = q.attr.RetryCnt
	c.rnrLeft = q.attr.RNRRetry
	c.sampleRTT(now)
	if c.probes > 0 && c.psn.After(c.probeHigh) {
		c.probes = 0 // the probe's episode is over: the next tail may have its own
	}
	if c.psn == q.req.psn {
		c.timer, c.probeAt = time.Time{}, time.Time{}
		return
	}
	c.armTimer(q, now)
	c.armProbe(q, now)
}

// handle processes a response packet: ACK, NAK, READ response or atomic acknowledgement.
func (c *completer) handle(q *QP, now time.Time, p wire.Packet) {
	if q.typ != RC || (q.state != StateRTS && q.state != StateSQD) {
		q.counters.drop(&q.counters.DropState)
		return
	}
	psn := p.BTH().PSN()
	// A response can only be for a PSN already sent: one at or past the highest answers nothing. (After
	// a go-back-N rewind, responses to the first transmissions are still welcome.)
	if !psn.Before(q.req.max) {
		q.counters.drop(&q.counters.DropGhostResponse)
		return
	}
	switch p.Info().Op {
	case wire.OpAcknowledge:
		c.onAcknowledge(q, now, psn, p.AETH().Syndrome())
	case wire.OpReadResponse:
		c.onReadResponse(q, now, p, psn)
	case wire.OpAtomicAcknowledge:
		c.onAtomicAck(q, now, p, psn)
	}
}

// ackThrough completes the SEND and WRITE requests whose last PSN is at or before psn, and moves the
// oldest unacknowledged PSN past psn. It stops at a READ or atomic whose responses have not arrived and
// reports false if psn reaches into one: the responder skipped its responses, an implied NAK.
// IBTA Vol 1 9.7.5.1.4 (implied acknowledgement).
func (c *completer) ackThrough(q *QP, psn wire.PSN) bool {
	if psn.Before(c.psn) {
		return true // acknowledges nothing new
	}
	for q.sq.n > 0 {
		w := q.sq.front()
		if !w.assigned {
			break
		}
		if w.wr.Opcode.isReadAtomic() {
			if !w.firstPSN.After(psn) && !c.psn.After(psn) {
				c.catchUp(q)
				return false
			}
			break
		}
		if w.lastPSN.After(psn) {
			break
		}
		c.psn = w.lastPSN.Add(1)
		q.complete(w, StatusSuccess)
		if q.state == StateErr {
			return true
		}
	}
	if !c.psn.After(psn) {
		c.psn = psn.Add(1)
	}
	c.catchUp(q)
	return true
}

// catchUp moves a go-back-N resend that acknowledgements have overtaken on to the oldest
// unacknowledged PSN: the requests it was resending are retired, and the next must go out at its own
// first PSN, not where the resend had got to.
func (c *completer) catchUp(q *QP) {
	if c.psn.After(q.req.psn) {
		q.rewind()
	}
}

func (c *completer) onAcknowledge(q *QP, now time.Time, psn wire.PSN, s wire.Syndrome) {
	switch s.Kind() {
	case wire.KindACK:
		if psn.Before(c.psn) {
			q.counters.drop(&q.counters.DropStaleResponse)
			return
		}
		if !c.ackThrough(q, psn) {
			c.retry(q, now, ResendImpliedNAK) // implied NAK for a READ or atomic
			return
		}
		c.progress(q, now)
	case wire.KindRNRNAK:
		q.counters.RcvdRNRErr++
		if psn.Before(c.psn) {
			q.counters.drop(&q.counters.DropStaleResponse)
			return
		}
		if !c.ackThrough(q, psn.Sub(1)) || c.psn != psn {
			c.retry(q, now, ResendImpliedNAK)
			return
		}
		if q.attr.RNRRetry != MaxRNRRetry { // 7 retries forever. IBTA Vol 1 9.7.5.2.8
			if c.rnrLeft == 0 {
				q.counters.RetryRNRExceededErr++
				q.fail(StatusRNRRetryExcErr)
				return
			}
			c.rnrLeft--
		}
		c.timer, c.probeAt = time.Time{}, time.Time{} // the wait's end resends; no probe goes during it (advance)
		c.rnrUntil = now.Add(s.RNRTimer())
		// The wait ends in a resend from this PSN: until then a PSN sequence NAK for it (drawn by
		// requests pipelined behind the RNR-NAKed one) asks for nothing more and costs no retry.
		// CONFORMANCE N6.
		c.retrying = true
		q.rewind()
		c.why = ResendRNR
	case wire.KindNAK:
		if s.NAKCode() == wire.NAKPSNSequenceError {
			q.counters.RcvdSeqErr++
			if psn.Before(c.psn) {
				q.counters.drop(&q.counters.DropStaleResponse)
				return
			}
			// A NAK past the oldest unacknowledged PSN acknowledges everything before it: that is
			// progress, and the retry it asks for is a new one even if an earlier retry is under way.
			advanced := psn.After(c.psn)
			if !c.ackThrough(q, psn.Sub(1)) {
				c.retry(q, now, ResendImpliedNAK) // a READ or atomic before the gap lost its responses
				return
			}
			if q.state == StateErr {
				return
			}
			if advanced {
				c.progress(q, now)
			}
			why := ResendNAK
			if c.probes > 0 {
				q.counters.ProbeRetries++ // most likely the probe's answer: it found a gap
				why = ResendProbeNAK
			}
			c.retry(q, now, why)
			return
		}
		c.ackThrough(q, psn.Sub(1))
		if q.state == StateErr {
			return
		}
		q.fail(nakStatus(s.NAKCode()))
	default:
		q.counters.drop(&q.counters.DropBadResponse)
	}
}

// nakStatus maps a NAK code to the completion status libibverbs users know (rxe_comp.c check_ack).
func nakStatus(c wire.NAKCode) Status {
	switch c {
	case wire.NAKInvalidRequest:
		return StatusRemInvReqErr
	case wire.NAKRemoteAccessError:
		return StatusRemAccessErr
	}
	return StatusRemOpErr
}

// headReadAtomic prepares for a READ response or atomic ACK at psn: it completes the SEND and WRITE
// requests the response implicitly acknowledges and returns the READ or atomic the response must be
// for. It returns nil when the response is stale (dropped) or answers a later PSN than expected (a
// retry has been started).
func (c *completer) headReadAtomic(q *QP, now time.Time, psn wire.PSN, want WROpcode) *sendWQE {
	if psn.Before(c.psn) {
		q.counters.drop(&q.counters.DropStaleResponse)
		return nil
	}
	if psn.After(c.psn) && !c.ackThrough(q, psn.Sub(1)) {
		c.retry(q, now, ResendImpliedNAK) // responses were lost: an implied NAK
		return nil
	}
	if q.state == StateErr {
		return nil
	}
	w := q.sq.front()
	if psn != c.psn || w == nil || !w.assigned {
		c.retry(q, now, ResendImpliedNAK)
		return nil
	}
	if w.wr.Opcode != want && !(want == WRCompareSwap && w.wr.Opcode.isAtomic()) {
		q.counters.drop(&q.counters.DropBadResponse)
		q.fail(StatusBadRespErr)
		return nil
	}
	return w
}

func (c *completer) onReadResponse(q *QP, now time.Time, p wire.Packet, psn wire.PSN) {
	w := c.headReadAtomic(q, now, psn, WRRead)
	if w == nil {
		return
	}
	// The position must fit the PSN: the READ's last PSN comes as LAST or ONLY, every other as FIRST or
	// MIDDLE. FIRST may open at any PSN where some request for this READ started: after a retry, late
	// responses to the earlier request and responses to the new one carry the same data for a PSN, so
	// either is accepted. IBTA Vol 1 9.7.5.1.5; CONFORMANCE A8.
	pos := p.Info().Pos
	if (psn == w.lastPSN) != pos.EndsMessage() {
		q.fail(StatusBadRespErr)
		return
	}
	if a := p.AETH(); a != nil && !a.Syndrome().IsACK() {
		q.fail(StatusBadRespErr)
		return
	}
	off := uint32(psn.Diff(w.firstPSN)) * uint32(q.mtu)
	n := min(w.length-off, uint32(q.mtu))
	if w.length == 0 {
		n = 0
	}
	if uint32(p.PayloadLen()) != n {
		q.fail(StatusLocLenErr)
		return
	}
	if n > 0 {
		if err := q.cfg.Memory.Scatter(q.cfg.PD, w.wr.SGL, uint64(off), p.Payload()); err != nil {
			q.fail(localStatus(err))
			return
		}
	}
	c.psn = psn.Add(1)
	if psn == w.lastPSN {
		q.complete(w, StatusSuccess)
	}
	c.progress(q, now)
}

func (c *completer) onAtomicAck(q *QP, now time.Time, p wire.Packet, psn wire.PSN) {
	w := c.headReadAtomic(q, now, psn, WRCompareSwap)
	if w == nil {
		return
	}
	if !p.AETH().Syndrome().IsACK() {
		q.fail(StatusBadRespErr)
		return
	}
	// The original value lands in the local buffer in host byte order, as rxe stores it.
	var orig [8]byte
	binary.NativeEndian.PutUint64(orig[:], p.AtomicAckETH().OrigData())
	if err := q.cfg.Memory.Scatter(q.cfg.PD, w.wr.SGL, 0, orig[:]); err != nil {
		q.fail(localStatus(err))
		return
	}
	c.psn = psn.Add(1)
	q.complete(w, StatusSuccess)
	c.progress(q, now)
}

// retry starts a go-back-N retransmission from the oldest unacknowledged PSN, or fails the oldest
// request when the retry counter has run out. Unlike rxe, which never exhausts a retry count of 7,
// goroce follows IBTA Vol 1 9.7.6.1.3: retry_cnt 7 allows seven retries. Only rnr_retry 7 is infinite.
func (c *completer) retry(q *QP, now time.Time, why Resend) {
	if why == ResendImpliedNAK {
		q.counters.ImpliedNAKs++
	}
	if c.retrying {
		q.counters.RetryIgnored++
		return
	}
	c.timedOut = false
	c.startRetry(q, now, why)
	c.retrying = true
}

// startRetry counts a retry and rewinds the requester; the packets it sends again say why (Tx.Resend).
func (c *completer) startRetry(q *QP, now time.Time, why Resend) {
	q.counters.CompleterRetryErr++
	if c.retryLeft == 0 {
		q.counters.RetryExceededErr++
		q.fail(StatusRetryExcErr)
		return
	}
	c.retryLeft--
	q.rewind()
	c.why = why
	c.armTimer(q, now)
}

// advance fires the timers that are due.
func (c *completer) advance(q *QP, now time.Time) {
	if !c.probeAt.IsZero() && !now.Before(c.probeAt) {
		c.probeAt = time.Time{}
		if c.psn != q.req.psn && !c.waitingRNR() && c.probes < maxProbes && (q.state == StateRTS || q.state == StateSQD) {
			c.probeDue = true
		}
	}
	if !c.rnrUntil.IsZero() && !now.Before(c.rnrUntil) {
		c.rnrUntil = time.Time{}
		c.retrying = false
		c.armTimer(q, now)
	}
	if !c.timer.IsZero() && !now.Before(c.timer) {
		c.timer = time.Time{}
		if c.psn != q.req.psn && (q.state == StateRTS || q.state == StateSQD) {
			q.counters.Timeouts++
			c.timedOut = true
			c.startRetry(q, now, ResendTimeout)
		}
	}
}

// rewind sends the requester back to the oldest unacknowledged PSN: the head request resumes in the
// middle if its first packets were acknowledged (a WRITE resumes with MIDDLE packets and no RETH, a READ
// with a new request for the rest), and every later request is sent again from its start with the same
// PSNs. rxe_req.c req_retry.
func (q *QP) rewind() {
	r, c := &q.req, &q.cmp
	r.psn = c.psn
	c.rttOn = false // Karn: an ACK for a resent packet may answer the first copy
	c.probes = 0
	r.next = 0
	r.noAck = 0
	r.rdAtomic = 0
	for i := 0; i < q.sq.n; i++ {
		w := q.sq.at(i)
		if !w.assigned {
			break
		}
		w.sent = false
		if i == 0 && c.psn.After(w.firstPSN) && !c.psn.After(w.lastPSN) {
			w.started = true
			w.offset = uint32(c.psn.Diff(w.firstPSN)) * uint32(q.mtu)
			continue
		}
		w.started = false
		w.offset = 0
	}
}
