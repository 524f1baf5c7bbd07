package perftest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goroce/goroce"
)

// mb is perftest's MB: bandwidths are in 2^20 bytes per second.
const mb = 1 << 20

// gbit is perftest's Gbit/s unit under --report_gbits: 10^9 bits, 125000000 bytes per second.
const gbit = 125000000

// noPeakIters is where perftest stops measuring the peak bandwidth (it would take too long).
const noPeakIters = 20000

// moveOnGrace is how long a side that waits for the peer's messages keeps waiting once the peer has
// written its next step on the TCP connection (or closed it) without anything more arriving. A
// variable so that tests of a mismatch need not wait as long.
var moveOnGrace = 5 * time.Second

// silentPeerGrace is how long a bidirectional SEND side whose own messages have all arrived waits
// for the first of the peer's before it concludes that the peer sends none. A variable, as
// moveOnGrace.
var silentPeerGrace = 10 * time.Second

// bwReport turns a run into perftest's figures: the average over the whole run and the peak, both in
// bytes per second, in the unit of the report.
func (o *Options) bwReport(size, iters int, elapsed time.Duration, peak float64) BWReport {
	s := max(elapsed, time.Microsecond).Seconds()
	unit := float64(mb)
	if o.ReportGbits {
		unit = gbit
	}
	if o.NoPeak || o.Duration > 0 || o.RunInfinitely || (o.Iters > noPeakIters && !o.Test.Latency()) {
		peak = 0
	}
	return BWReport{Size: uint64(size), Iters: uint64(iters),
		BWPeak: peak / unit, BWAvg: float64(size) * float64(iters) / s / unit, MsgRate: float64(iters) / s / 1e6}
}

// waiter waits on the CQ in slices of pollInterval, so that a loop notices the end of a timed run
// and runs its checks while nothing completes. It reuses one context per slice: a CQ wait registers
// its context, which costs more than a wait.
type waiter struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
}

func newWaiter(ctx context.Context) *waiter { return &waiter{parent: ctx} }

// wait returns the completions Wait moved, or none when a slice ended with none.
func (w *waiter) wait(cq *goroce.CQ, wcs []goroce.Completion) (int, error) {
	if w.ctx == nil {
		w.ctx, w.cancel = context.WithTimeout(w.parent, pollInterval)
	}
	n, err := cq.Wait(w.ctx, wcs)
	if err == nil {
		return n, nil
	}
	w.stop()
	if w.parent.Err() != nil {
		return 0, w.parent.Err()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return 0, nil
	}
	return 0, err
}

func (w *waiter) stop() {
	if w.cancel != nil {
		w.cancel()
		w.ctx, w.cancel = nil, nil
	}
}

// span is a timed run's phases, perftest's DurationStates: the first margin is left out of the
// figures (START_STATE), the figures cover the time up to the last margin (SAMPLE_STATE), the rest is
// left out again (STOP_SAMPLE_STATE), and the run ends after total (END_STATE).
type span struct {
	start         time.Time
	margin, total time.Duration
}

func (s *span) sampling(t time.Time) bool {
	d := t.Sub(s.start)
	return d >= s.margin && d < s.total-s.margin
}

func (s *span) over(t time.Time) bool { return t.Sub(s.start) >= s.total }

// window returns the time the figures of a timed run cover.
func (s *span) window() time.Duration { return s.total - 2*s.margin }

// guard watches a wait for the peer's application (its SENDs, its WRITEs of a latency test): if the
// peer has moved on to the next step of the exchange, or closed it, while this side still waits, and
// nothing arrives for moveOnGrace, the peer will send nothing more: the settings differ.
type guard struct {
	pc    *Conn
	step  string
	since time.Time
}

// progress says that something arrived.
func (g *guard) progress() {
	if g != nil {
		g.since = time.Time{}
	}
}

// idle says that nothing arrived in a while; it fails when the peer has been gone for too long.
func (g *guard) idle(waiting string) error {
	if g == nil || g.pc == nil {
		return nil
	}
	wrote, closed := g.pc.poll()
	if !wrote && !closed {
		g.since = time.Time{}
		return nil
	}
	if g.since.IsZero() {
		g.since = time.Now()
		return nil
	}
	if time.Since(g.since) < moveOnGrace {
		return nil
	}
	what := "moved on to the next step of the exchange"
	if closed {
		what = "ended the exchange"
	}
	return &MismatchError{Step: g.step, Reason: fmt.Sprintf("the peer has %s while this side still waits for %s: -n, -D, -s, -a, -b or the test differ", what, waiting)}
}

// cqMod returns the CQ moderation of a run: every cqMod-th request asks for a completion. A post list
// sets it to its length; it is never more than the tx depth.
func (p *peer) cqMod() int {
	if p.o.PostList > 1 {
		return p.o.PostList
	}
	return min(p.o.CQMod, p.txDepth())
}

// txDepth returns the requests each QP keeps outstanding: -t, at most the iterations.
func (p *peer) txDepth() int {
	if p.o.Duration > 0 || p.o.RunInfinitely {
		return p.o.TxDepth
	}
	return min(p.o.TxDepth, p.o.Iters)
}

// sendWR returns QP i's work request for one message of size bytes: a WRITE into or a READ from the
// peer's remote slot, an atomic on its first 8 bytes, or a SEND; inline when the message fits -I.
func (p *peer) sendWR(i, size int) goroce.SendWR {
	mr, off := p.localSlot(i)
	wr := goroce.SendWR{SGL: []goroce.SGE{mr.SGE(off, size)}}
	if p.sh.verb != Send {
		wr.RemoteAddr, wr.RKey = p.rem[i].VAddr, p.rem[i].RKey
	}
	switch p.sh.verb {
	case Write:
		wr.Opcode = goroce.WRRDMAWrite
	case Read:
		wr.Opcode = goroce.WRRDMARead
	case Send:
		wr.Opcode = goroce.WRSend
	case Atomic:
		wr.SGL = []goroce.SGE{mr.SGE(off, atomicSize)}
		wr.Opcode, wr.CompareAdd = goroce.WRFetchAdd, 1
		if p.o.AtomicCAS {
			wr.Opcode, wr.CompareAdd, wr.Swap = goroce.WRCompareSwap, 0, 1
		}
	}
	if (p.sh.verb == Write || p.sh.verb == Send) && size <= p.o.InlineSize {
		wr.Flags, wr.SGL, wr.InlineData = goroce.Inline, nil, mr.Bytes()[off:off+size]
	}
	return wr
}

// sender posts a bandwidth run's requests, as run_iter_bw does: every QP keeps up to tx depth
// requests outstanding, posted in lists of -l, one in cqMod asking for a completion, and the last of a
// counted run too.
type sender struct {
	p              *peer
	timed          bool
	iters, txDepth int
	cqMod          int
	flags          []goroce.SendFlags
	wrs            [][]goroce.SendWR
	ptrs           []*goroce.SendWR
	posted, done   []int
	total          int // requests completed, all QPs
}

func (p *peer) newSender(size int) *sender {
	n := len(p.qps)
	s := &sender{p: p, timed: p.o.Duration > 0 || p.o.RunInfinitely, iters: p.o.Iters, txDepth: p.txDepth(),
		cqMod: p.cqMod(), flags: make([]goroce.SendFlags, n), wrs: make([][]goroce.SendWR, n),
		ptrs: make([]*goroce.SendWR, p.o.PostList), posted: make([]int, n), done: make([]int, n)}
	for i := range n {
		wr := p.sendWR(i, size)
		s.flags[i] = wr.Flags
		s.wrs[i] = make([]goroce.SendWR, p.o.PostList)
		for j := range s.wrs[i] {
			s.wrs[i][j] = wr
		}
	}
	return s
}

// post posts what there is room for.
func (s *sender) post() error {
	list := s.p.o.PostList
	for i, q := range s.p.qps {
		for {
			k := list
			if !s.timed {
				k = min(k, s.iters-s.posted[i])
			}
			if k <= 0 || s.txDepth-(s.posted[i]-s.done[i]) < k {
				break
			}
			for j := range k {
				seq := s.posted[i] + j
				wr := &s.wrs[i][j]
				wr.WRID, wr.Flags = sendWRID(i, seq), s.flags[i]
				if (seq+1)%s.cqMod == 0 || (list > 1 && j == k-1) || (!s.timed && seq == s.iters-1) {
					wr.Flags |= goroce.Signaled
				}
				s.ptrs[j] = wr
			}
			if err := q.PostSend(s.ptrs[:k]...); err != nil {
				return fmt.Errorf("couldn't post send: %w (%d posted)", err, s.posted[i])
			}
			s.posted[i] += k
		}
	}
	return nil
}

// complete counts a send completion: every request of its QP up to it is done (RC completes in
// order). It returns how many requests that completed.
func (s *sender) complete(wc *goroce.Completion) int {
	i, seq := splitWRID(wc.WRID)
	if i >= len(s.done) || seq+1 <= s.done[i] {
		return 0
	}
	d := seq + 1 - s.done[i]
	s.done[i] = seq + 1
	s.total += d
	return d
}

// finished reports whether a counted run has completed every request.
func (s *sender) finished() bool { return !s.timed && s.total == len(s.done)*s.iters }

// completionErr returns the error of a failed completion, perftest's "Completion with error". A
// request the peer refused is a mismatch: with the same settings, every request lies in the region
// the peer offers, with the rights its test grants. The peer answers with a remote access error
// when its region refuses the request, and with an invalid request error when its QP's access flags
// do, which it checks first (as rxe's check_op_valid does).
func (p *peer) completionErr(wc *goroce.Completion) error {
	side := "server"
	if p.client {
		side = "client"
	}
	err := &CompletionError{Side: side, Completion: *wc}
	if wc.Status == goroce.StatusRemAccessErr || wc.Status == goroce.StatusRemInvReqErr {
		return &MismatchError{Step: "traffic", Err: err, Reason: fmt.Sprintf("the peer refused the %v: its buffer is smaller than this side's messages (-s or -a differ), or it grants other access (it runs another test)", p.sh.verb)}
	}
	return err
}

// stream runs the requester side of a bandwidth test for one message size (run_iter_bw): WRITEs,
// READs, atomics or SENDs on every QP. A counted run measures from the first post to the last
// completion, and as peak the best rate between two waits that completed something; a timed run
// counts what completes within its window. With RunInfinitely it calls every with each period's
// figures until ctx ends.
func (p *peer) stream(ctx context.Context, size int, every func(BWReport)) (BWReport, error) {
	s := p.newSender(size)
	wcs := make([]goroce.Completion, 64)
	w := newWaiter(ctx)
	defer w.stop()
	var peak float64
	start := time.Now()
	last := start
	sp := span{start: start, margin: p.o.margin(), total: p.o.Duration}
	if p.o.RunInfinitely {
		sp = span{start: start, total: p.o.period()}
	}
	sampled := 0
	for {
		if err := s.post(); err != nil {
			return BWReport{}, err
		}
		if s.finished() {
			break
		}
		n, err := w.wait(p.cq, wcs)
		now := time.Now()
		if err != nil {
			if p.o.RunInfinitely && ctx.Err() != nil {
				return BWReport{}, nil
			}
			return BWReport{}, fmt.Errorf("poll CQ failed: %w (%d completed)", err, s.total)
		}
		before := s.total
		for k := range wcs[:n] {
			wc := &wcs[k]
			if wc.Status != goroce.StatusSuccess {
				return BWReport{}, p.completionErr(wc)
			}
			if wc.WRID&recvWRID == 0 {
				s.complete(wc)
			}
		}
		if d := s.total - before; d > 0 {
			if dt := now.Sub(last).Seconds(); dt > 0 {
				peak = max(peak, float64(d)*float64(size)/dt)
			}
			last = now
			if s.timed && sp.sampling(now) {
				sampled += d
			}
		}
		if !s.timed {
			continue
		}
		if sp.over(now) {
			if !p.o.RunInfinitely {
				return p.o.bwReport(size, sampled, sp.window(), 0), nil
			}
			every(p.o.bwReport(size, sampled, sp.total, 0))
			sp.start, sampled = now, 0
		}
	}
	return p.o.bwReport(size, len(p.qps)*p.o.Iters, last.Sub(start), peak), nil
}

// warmUp runs a tx depth of requests on every QP before a measurement (perform_warm_up).
func (p *peer) warmUp(ctx context.Context, size int) error {
	o := p.o
	p.o.Iters, p.o.Duration, p.o.RunInfinitely, p.o.PostList = max(p.o.TxDepth, 1), 0, false, 1
	defer func() { p.o = o }()
	_, err := p.stream(ctx, size, nil)
	return err
}

// receive is the server side of a SEND bandwidth test (run_iter_bw_server): it takes iters SENDs on
// every QP, keeping its receive queues topped up, and measures from the first receive to the last;
// like perftest's server it has no peak. A timed run counts the receives within its window.
func (p *peer) receive(ctx context.Context, size int, g *guard, every func(BWReport)) (BWReport, error) {
	o := &p.o
	timed := o.Duration > 0 || o.RunInfinitely
	n := len(p.qps)
	rcnt := make([]int, n)
	total := 0
	wcs := make([]goroce.Completion, 64)
	w := newWaiter(ctx)
	defer w.stop()
	var first, last time.Time
	sp := span{start: time.Now(), margin: o.margin(), total: o.Duration}
	if o.RunInfinitely {
		sp = span{start: sp.start, total: o.period()}
	}
	sampled := 0
	for timed || total < n*o.Iters {
		k, err := w.wait(p.cq, wcs)
		now := time.Now()
		if err != nil {
			if o.RunInfinitely && ctx.Err() != nil {
				return BWReport{}, nil
			}
			return BWReport{}, fmt.Errorf("poll CQ failed: %w (%d of %d received)", err, total, n*o.Iters)
		}
		if k == 0 && !timed {
			if err := g.idle("its SENDs"); err != nil {
				return BWReport{}, err
			}
		}
		for j := range wcs[:k] {
			wc := &wcs[j]
			if wc.Status != goroce.StatusSuccess {
				return BWReport{}, p.completionErr(wc)
			}
			if wc.WRID&recvWRID == 0 {
				continue
			}
			i := int(wc.WRID &^ recvWRID)
			if total == 0 {
				first = now
			}
			rcnt[i]++
			total++
			p.routs[i]--
			last = now
			if timed && sp.sampling(now) {
				sampled++
			}
			g.progress()
		}
		for i := range n {
			limit := o.RxDepth
			if !timed {
				limit = o.Iters - rcnt[i]
			}
			if err := p.postRecvs(i, limit); err != nil {
				return BWReport{}, err
			}
		}
		if timed && sp.over(now) {
			if !o.RunInfinitely {
				return o.bwReport(size, sampled, sp.window(), 0), nil
			}
			every(o.bwReport(size, sampled, sp.total, 0))
			sp.start, sampled = now, 0
		}
	}
	return o.bwReport(size, total, last.Sub(first), 0), nil
}

// bidirectional is both sides of a bidirectional SEND test (run_iter_bi): each sends iters messages on
// every QP and takes as many, and measures from its first post to the moment both are done.
func (p *peer) bidirectional(ctx context.Context, size int, g *guard) (BWReport, error) {
	o := &p.o
	s := p.newSender(size)
	n := len(p.qps)
	rcnt := make([]int, n)
	received := 0
	wcs := make([]goroce.Completion, 64)
	w := newWaiter(ctx)
	defer w.stop()
	var peak float64
	start := time.Now()
	last, end := start, start
	var sentAll time.Time
	sp := span{start: start, margin: o.margin(), total: o.Duration}
	sampled := 0
	for {
		if err := s.post(); err != nil {
			return BWReport{}, err
		}
		if s.finished() && received == n*o.Iters {
			break
		}
		k, err := w.wait(p.cq, wcs)
		now := time.Now()
		if err != nil {
			return BWReport{}, fmt.Errorf("poll CQ failed: %w (%d sent, %d received)", err, s.total, received)
		}
		before := s.total
		if k > 0 {
			end = now
		}
		for j := range wcs[:k] {
			wc := &wcs[j]
			if wc.Status != goroce.StatusSuccess {
				return BWReport{}, p.completionErr(wc)
			}
			if wc.WRID&recvWRID == 0 {
				s.complete(wc)
				continue
			}
			i := int(wc.WRID &^ recvWRID)
			rcnt[i]++
			received++
			p.routs[i]--
			g.progress()
		}
		for i := range n {
			limit := o.RxDepth
			if !s.timed {
				limit = o.Iters - rcnt[i]
			}
			if err := p.postRecvs(i, limit); err != nil {
				return BWReport{}, err
			}
		}
		if d := s.total - before; d > 0 {
			if dt := now.Sub(last).Seconds(); dt > 0 {
				peak = max(peak, float64(d)*float64(size)/dt)
			}
			last = now
			if s.timed && sp.sampling(now) {
				sampled += d
			}
		}
		if s.timed {
			if sp.over(now) {
				return o.bwReport(size, sampled, sp.window(), 0), nil
			}
			continue
		}
		if k == 0 {
			if err := g.idle("its SENDs"); err != nil {
				return BWReport{}, err
			}
		}
		if s.finished() && sentAll.IsZero() {
			sentAll = now
		}
		if !sentAll.IsZero() && received == 0 && now.Sub(sentAll) > silentPeerGrace {
			return BWReport{}, &MismatchError{Step: "bidirectional traffic", Reason: fmt.Sprintf(
				"all of this side's SENDs arrived and none of the peer's in %v: the peer does not run -b", silentPeerGrace)}
		}
	}
	return o.bwReport(size, n*o.Iters, end.Sub(start), peak), nil
}

// latency runs one size of a latency test on the first QP and returns its samples: one-way
// latencies (SEND and WRITE, half a round trip) or whole ones (READ and atomics). A timed run
// returns the round trips started within its window instead, as count.
func (p *peer) latency(ctx context.Context, size int, g *guard) (samples []time.Duration, count int, err error) {
	switch p.sh.verb {
	case Read, Atomic:
		return p.readLatency(ctx, size)
	case Write:
		return p.writeLatency(ctx, size, g)
	}
	return p.sendLatency(ctx, size, g)
}

// readLatency issues one READ or atomic at a time (run_iter_lat): each sample is a whole operation.
func (p *peer) readLatency(ctx context.Context, size int) ([]time.Duration, int, error) {
	o := &p.o
	timed := o.Duration > 0
	wcs := make([]goroce.Completion, 4)
	w := newWaiter(ctx)
	defer w.stop()
	wr := p.sendWR(0, size)
	wr.Flags |= goroce.Signaled
	sp := span{start: time.Now(), margin: o.margin(), total: o.Duration}
	var samples []time.Duration
	count := 0
	for i := 0; timed || i < o.Iters; i++ {
		wr.WRID = uint64(i)
		t0 := time.Now()
		if timed && sp.over(t0) {
			return nil, count, nil
		}
		if err := p.qps[0].PostSend(&wr); err != nil {
			return nil, 0, fmt.Errorf("couldn't post send: %w", err)
		}
		for {
			n, err := w.wait(p.cq, wcs[:1])
			if err != nil {
				return nil, 0, fmt.Errorf("poll CQ failed: %w (%d of %d completed)", err, i, o.Iters)
			}
			if n == 1 {
				break
			}
			if timed && sp.over(time.Now()) {
				return nil, count, nil
			}
		}
		if wcs[0].Status != goroce.StatusSuccess {
			return nil, 0, p.completionErr(&wcs[0])
		}
		if timed {
			if sp.sampling(t0) {
				count++
			}
			continue
		}
		samples = append(samples, time.Since(t0))
	}
	return samples, count, nil
}

// sendLatency is ib_send_lat's ping-pong: the client sends first, and each side sends when it has
// received; like perftest, each side's samples are the times between its consecutive sends, halved.
func (p *peer) sendLatency(ctx context.Context, size int, g *guard) ([]time.Duration, int, error) {
	o := &p.o
	timed := o.Duration > 0
	iters := o.Iters
	wcs := make([]goroce.Completion, 16)
	w := newWaiter(ctx)
	defer w.stop()
	wr := p.sendWR(0, size)
	wr.Flags |= goroce.Signaled
	sp := span{start: time.Now(), margin: o.margin(), total: o.Duration}
	var tstamp []time.Time
	scnt, rcnt, ccnt, count := 0, 0, 0, 0
	pending := 0 // receives completed and not yet consumed by the loop
	over := false
	wait := func() error {
		n, err := w.wait(p.cq, wcs)
		if err != nil {
			return fmt.Errorf("poll CQ failed: %w (%d sent, %d received)", err, scnt, rcnt)
		}
		if n == 0 {
			if timed && sp.over(time.Now()) {
				over = true
				return nil
			}
			return g.idle("its SEND")
		}
		for _, wc := range wcs[:n] {
			if wc.Status != goroce.StatusSuccess {
				return p.completionErr(&wc)
			}
			if wc.WRID&recvWRID != 0 {
				pending++
				p.routs[0]--
				g.progress()
			} else {
				ccnt++
			}
		}
		return nil
	}
	for !over && (timed || scnt < iters || rcnt < iters) {
		if (timed || rcnt < iters) && !(p.client && scnt < 1) {
			for pending == 0 && !over {
				if err := wait(); err != nil {
					return nil, 0, err
				}
			}
			if over {
				break
			}
			pending--
			rcnt++
			limit := iters - rcnt
			if timed {
				limit = o.RxDepth
			}
			if err := p.postRecvs(0, limit); err != nil {
				return nil, 0, err
			}
		}
		if timed || scnt < iters {
			// At most a few SENDs unacknowledged: the send queue is not the bottleneck of a ping-pong.
			for scnt-ccnt >= 8 && !over {
				if err := wait(); err != nil {
					return nil, 0, err
				}
			}
			now := time.Now()
			if timed {
				if over = over || sp.over(now); over {
					break
				}
				if sp.sampling(now) {
					count++
				}
			} else {
				tstamp = append(tstamp, now)
			}
			wr.WRID = uint64(scnt)
			if err := p.qps[0].PostSend(&wr); err != nil {
				return nil, 0, fmt.Errorf("couldn't post send: %w", err)
			}
			scnt++
		}
	}
	for !timed && ccnt < scnt {
		if err := wait(); err != nil {
			return nil, 0, err
		}
	}
	return halves(tstamp), count, nil
}

// halves returns the times between consecutive timestamps, halved: one-way latencies of a
// ping-pong.
func halves(tstamp []time.Time) []time.Duration {
	samples := make([]time.Duration, 0, len(tstamp))
	for i := 1; i < len(tstamp); i++ {
		samples = append(samples, tstamp[i].Sub(tstamp[i-1])/2)
	}
	return samples
}

// writeLatency is ib_write_lat's ping-pong: each side WRITEs size bytes into the peer's buffer, the
// last byte numbering the iteration, and waits until the peer's WRITE has put the next number into the
// last byte of its own buffer. There is no completion on the target side: like perftest, this side
// polls memory the device writes from its receive goroutine. In ib_write_lat 6.06 the server writes
// first (seen on the wire between two rxe guests), unlike send_lat, where the client does.
func (p *peer) writeLatency(ctx context.Context, size int, g *guard) ([]time.Duration, int, error) {
	o := &p.o
	timed := o.Duration > 0
	iters := o.Iters
	wcs := make([]goroce.Completion, 4)
	w := newWaiter(ctx)
	defer w.stop()
	wr := p.sendWR(0, size)
	wr.Flags |= goroce.Signaled
	lmr, loff := p.localSlot(0)
	rmr, roff := p.remoteSlot(0)
	// An inline request's data is the same bytes, copied when posted.
	postBuf := &lmr.Bytes()[loff+size-1]
	pollAt := roff + size - 1
	rbuf := rmr.Bytes()
	// The word holding the polled byte, read atomically so that the loop sees the device's write.
	word := (*uint32)(unsafe.Pointer(&rbuf[pollAt&^3]))
	shift := 8 * uint(pollAt&3) // little-endian hosts
	sp := span{start: time.Now(), margin: o.margin(), total: o.Duration}
	var tstamp []time.Time
	count := 0
	for scnt, rcnt := 0, 0; timed || scnt < iters || rcnt < iters; {
		if (timed || rcnt < iters) && !(!p.client && scnt < 1) {
			rcnt++
			for spins := 0; byte(atomic.LoadUint32(word)>>shift) != byte(rcnt); spins++ {
				if spins%1024 == 1023 {
					if err := ctx.Err(); err != nil {
						return nil, 0, fmt.Errorf("waiting for the peer's WRITE %d: %w", rcnt, err)
					}
					if timed && sp.over(time.Now()) {
						return nil, count, nil
					}
					if spins%(1024*256) == 1024*256-1 {
						if err := g.idle("its WRITE"); err != nil {
							return nil, 0, err
						}
					}
				}
				runtime.Gosched()
			}
			g.progress()
		}
		if timed || scnt < iters {
			now := time.Now()
			if timed {
				if sp.over(now) {
					return nil, count, nil
				}
				if sp.sampling(now) {
					count++
				}
			} else {
				tstamp = append(tstamp, now)
			}
			scnt++
			*postBuf = byte(scnt)
			wr.WRID = uint64(scnt)
			if err := p.qps[0].PostSend(&wr); err != nil {
				return nil, 0, fmt.Errorf("couldn't post send: %w", err)
			}
			for {
				n, err := w.wait(p.cq, wcs[:1])
				if err != nil {
					return nil, 0, fmt.Errorf("poll CQ failed: %w (%d sent)", err, scnt)
				}
				if n == 1 {
					break
				}
				if timed && sp.over(time.Now()) {
					return nil, count, nil
				}
			}
			if wcs[0].Status != goroce.StatusSuccess {
				if timed && sp.over(time.Now()) {
					// The peer's run ended first and closed its device: ib_write_lat has no last
					// barrier to wait for the other side.
					return nil, count, nil
				}
				return nil, 0, p.completionErr(&wcs[0])
			}
		}
	}
	return halves(tstamp), count, nil
}
