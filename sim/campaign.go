package sim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/wire"
)

// The fault campaign: each seed builds two hosts joined by one faulty cable, opens a few RC
// connections (both ways), posts a random mix of WRITEs, WRITEs with immediate, SENDs, SENDs with
// immediate, READs, fetch-and-adds and compare-and-swaps at random times, runs until the network is
// idle, and checks the invariants every reliable transport owes its user:
//
//   - every work request completes exactly once, in posting order, with the right status, opcode and
//     length; every receive likewise, with its immediate;
//   - the responder's memory equals a model that applied every WRITE and atomic in order;
//   - READs return the model's bytes, and every atomic executed exactly once (the values it returned and
//     the counters' final values both match the model);
//   - no corrupted byte completes successfully (the data checks above see every byte);
//   - when the cable dies for good, each requester fails cleanly: successes, then one
//     "transport retry counter exceeded", then flushes, and the QP in the error state.
//
// A profile picks the faults per seed: independent loss, Gilbert-Elliott bursts, reordering,
// duplication, bit corruption, a link flap, or a permanent cut, alone or mixed.

// CampaignResult describes one seed's run.
type CampaignResult struct {
	Seed     uint64
	Profile  string
	Requests int // work requests posted
	Packets  uint64
	Events   uint64
	End      Time
	ICRCDrop uint64 // packets the receivers' ICRC check dropped
	Lost     uint64 // packets the link lost
	Failed   int    // connections that ended in retry exhaustion: under a cut, or (rarely) heavy loss
	Cut      bool
}

// ReplayCommand is the command that replays a campaign seed with a packet trace.
func ReplayCommand(seed uint64) string {
	return fmt.Sprintf("go run ./cmd/goroce sim replay -seed %d -trace", seed)
}

// errStalePSN names an engine bug the campaign found: see TestKnownBugStaleRetransmitPSN.
const errStalePSN = "retransmission does not repeat the original packet"

// campaignLimit bounds a seed's virtual time; a run that is not idle by then has hung.
const campaignLimit = 10 * Second

type campaignProfile struct {
	faults    Faults
	flapAt    Time
	flapFor   Time
	cutAt     Time
	rate      int64
	delay     time.Duration
	mtu       wire.MTU
	timeout   uint8
	conns     int
	reverse   bool
	opsPerQP  int
	postSpan  Time
	bigChance float64
}

func (p *campaignProfile) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mtu=%d rate=%dG delay=%v timeout=%d conns=%d", p.mtu.Bytes(), p.rate/1e9, p.delay, p.timeout, p.conns)
	if p.reverse {
		b.WriteString("+rev")
	}
	f := &p.faults
	if f.Loss > 0 {
		fmt.Fprintf(&b, " loss=%.4f", f.Loss)
	}
	if g := f.Burst; g != nil {
		fmt.Fprintf(&b, " burst(p=%.4f r=%.2f h=%.2f)", g.PGoodBad, g.PBadGood, g.LossBad)
	}
	if f.Reorder > 0 {
		fmt.Fprintf(&b, " reorder=%.3f/%v", f.Reorder, f.ReorderDelay)
	}
	if f.Duplicate > 0 {
		fmt.Fprintf(&b, " dup=%.3f", f.Duplicate)
	}
	if f.Corrupt > 0 {
		fmt.Fprintf(&b, " corrupt=%.3f", f.Corrupt)
	}
	if p.flapFor > 0 {
		fmt.Fprintf(&b, " flap=%v+%v", p.flapAt, p.flapFor)
	}
	if p.cutAt > 0 {
		fmt.Fprintf(&b, " cut=%v", p.cutAt)
	}
	return b.String()
}

func newProfile(s *Sim) *campaignProfile {
	r := s.Rand()
	p := &campaignProfile{
		rate:     []int64{10e9, 25e9, 100e9}[r.IntN(3)],
		delay:    time.Duration(500+r.IntN(4500)) * time.Nanosecond,
		mtu:      []wire.MTU{wire.MTU256, wire.MTU512, wire.MTU1024, wire.MTU2048, wire.MTU4096}[r.IntN(5)],
		timeout:  uint8(6 + r.IntN(3)), // 262 us .. 1 ms
		conns:    1 + r.IntN(3),
		reverse:  r.IntN(3) == 0,
		opsPerQP: 10 + r.IntN(50),
		postSpan: Time(r.IntN(300)) * Microsecond,
	}
	p.bigChance = 0.05
	f := &p.faults
	// Each impairment is on for about half the seeds, so that seeds see them alone and mixed.
	if r.IntN(2) == 0 {
		f.Loss = r.Float64() * 0.1
	}
	if r.IntN(4) == 0 {
		// Bursts of 1.3 to 3 packets on average. The model's state advances per packet, so a long burst
		// on a direction that carries a few packets per retry round spans rounds and can exhaust
		// retry_cnt=7 legitimately; see check.
		f.Burst = &GilbertElliott{PGoodBad: r.Float64() * 0.02, PBadGood: 0.33 + r.Float64()*0.5, LossBad: 0.5 + r.Float64()*0.5}
	}
	if r.IntN(2) == 0 {
		f.Reorder = r.Float64() * 0.2
		f.ReorderDelay = time.Duration(1+r.IntN(30)) * time.Microsecond
	}
	if r.IntN(2) == 0 {
		f.Duplicate = r.Float64() * 0.05
	}
	if r.IntN(2) == 0 {
		f.Corrupt = r.Float64() * 0.05
	}
	switch x := r.IntN(20); {
	case x == 0: // the cable dies for good: every requester with work left must fail cleanly
		p.cutAt = Time(r.IntN(400)) * Microsecond
	case x <= 2: // a flap shorter than the retry budget: everything must still succeed
		p.flapAt = Time(r.IntN(300)) * Microsecond
		p.flapFor = Time(100+r.IntN(int(ackTimeoutUS(p.timeout)*3))) * Microsecond
	}
	return p
}

// ackTimeoutUS is the local ACK timeout of a timeout code, in microseconds.
func ackTimeoutUS(code uint8) int64 { return 4096 << code / 1000 }

// campaignConn is one RC connection of the campaign and its model.
type campaignConn struct {
	name              string
	req, resp         *Endpoint
	src, readBuf      *mr.Region
	remote, recvBuf   *mr.Region
	model             []byte // expected remote memory
	wantSend          []wantSend
	wantRecv          []wantRecv
	gotSend, gotRecv  []qp.Completion
	reads             []wantRead
	atomics           []wantAtomic
	writes            []wantWrite // for the cut profile: disjoint writes, checked one by one
	sendErr           string
	lossy             bool // the profile loses packets: a retry exhaustion may be legitimate
	recvOff, atomOff  int
	readOff, writeOff int
}

type wantSend struct {
	id     uint64
	op     qp.CompletionOpcode
	length uint32
}

type wantRecv struct {
	id     uint64
	data   []byte // nil for WRITE with immediate
	imm    bool
	immVal uint32
	length uint32
}

type wantRead struct {
	id   uint64
	off  int
	data []byte
}

type wantAtomic struct {
	id   uint64
	off  int // in readBuf, where the original value lands
	orig uint64
}

type wantWrite struct {
	id   uint64
	off  int
	data []byte
}

// Memory layout of a connection's remote region: writes in the first half, READ sources in the next
// quarter (never written, so a re-executed READ returns the same bytes), atomic counters at the end.
const (
	campRegion   = 1 << 18
	campReadBase = campRegion / 2
	campAtomBase = campRegion - 8*campCounters
	campCounters = 8
)

// RunCampaignSeed runs one seed of the fault campaign. It returns an error naming the first invariant
// that failed. With trace set, it writes the profile, every packet event and every completion there.
func RunCampaignSeed(seed uint64, trace io.Writer) (CampaignResult, error) {
	s := New(seed)
	s.VerifyRetransmits = true
	p := newProfile(s)
	res := CampaignResult{Seed: seed, Profile: p.String(), Cut: p.cutAt > 0}
	if trace != nil {
		fmt.Fprintf(trace, "seed %d: %s\n", seed, res.Profile)
		s.SetTracer(func(e *TraceEvent) { fmt.Fprintln(trace, e.String()) })
	}
	topo := BackToBack(s, LinkConfig{Rate: p.rate, Delay: p.delay, Faults: p.faults}, HostConfig{})
	a, b := topo.Hosts[0], topo.Hosts[1]
	link := s.Links[0]
	// Odd seeds run with the tail-loss probe, as goroce's device does; even ones without, as rxe.
	o := QPOptions{MTU: p.mtu, Timeout: p.timeout, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1, RdAtomic: 16, TailProbe: seed%2 == 1}

	var conns []*campaignConn
	for i := 0; i < p.conns+btoi(p.reverse); i++ {
		from, to := a, b
		if i == p.conns {
			from, to = b, a
		}
		c, err := newCampaignConn(s, fmt.Sprintf("c%d", i), from, to, o)
		if err != nil {
			return res, err
		}
		c.lossy = p.faults.Loss > 0 || p.faults.Burst != nil || p.faults.Corrupt > 0
		conns = append(conns, c)
		if trace != nil {
			c.trace(trace)
		}
	}
	for _, c := range conns {
		n, err := c.schedule(s, p)
		if err != nil {
			return res, err
		}
		res.Requests += n
	}
	if p.flapFor > 0 {
		s.At(p.flapAt, func() { link.SetDown(true) })
		s.At(p.flapAt+p.flapFor, func() { link.SetDown(false) })
	}
	if p.cutAt > 0 {
		s.At(p.cutAt, func() { link.SetDown(true) })
	}
	end := s.Run(campaignLimit)
	res.Events, res.End = s.Processed, end
	for _, pt := range s.Ports() {
		res.Packets += pt.Stats.TxPackets
		res.Lost += pt.Stats.Drops[DropLoss] + pt.Stats.Drops[DropLinkDown]
	}
	for _, h := range s.Hosts {
		res.ICRCDrop += h.Stats.Drops[DropICRC]
	}
	if len(s.events) > 0 {
		return res, fmt.Errorf("not idle after %v of virtual time: %d events pending", campaignLimit, len(s.events))
	}
	for _, c := range conns {
		failed, err := c.check(p.cutAt > 0)
		if err != nil {
			return res, fmt.Errorf("%s: %w", c.name, err)
		}
		res.Failed += btoi(failed)
	}
	if p.faults.Corrupt == 0 && res.ICRCDrop > 0 {
		return res, fmt.Errorf("%d ICRC drops without corruption", res.ICRCDrop)
	}
	return res, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func newCampaignConn(s *Sim, name string, from, to *Host, o QPOptions) (*campaignConn, error) {
	req, resp, err := s.ConnectRC(from, to, o)
	if err != nil {
		return nil, err
	}
	c := &campaignConn{name: name, req: req, resp: resp}
	all := mr.LocalWrite | mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic
	regs := []struct {
		h   *Host
		r   **mr.Region
		acc mr.Access
	}{{from, &c.src, mr.LocalWrite}, {from, &c.readBuf, mr.LocalWrite}, {to, &c.remote, all}, {to, &c.recvBuf, mr.LocalWrite}}
	for _, g := range regs {
		if *g.r, err = g.h.Register(campRegion, g.acc); err != nil {
			return nil, err
		}
	}
	rng := s.Rand()
	for _, r := range []*mr.Region{c.src, c.remote} {
		for i := range r.Bytes() {
			r.Bytes()[i] = byte(rng.Uint32())
		}
	}
	c.model = bytes.Clone(c.remote.Bytes())
	c.atomOff = campRegion - 8*256
	req.OnCompletion = func(_ *Endpoint, wc *qp.Completion) { c.gotSend = append(c.gotSend, *wc) }
	resp.OnCompletion = func(_ *Endpoint, wc *qp.Completion) { c.gotRecv = append(c.gotRecv, *wc) }
	return c, nil
}

func (c *campaignConn) trace(w io.Writer) {
	fmt.Fprintf(w, "%s: %s qpn %#x -> %s qpn %#x\n", c.name, c.req.Host.Name, uint32(c.req.QP.QPN()),
		c.resp.Host.Name, uint32(c.resp.QP.QPN()))
	prev := c.req.OnCompletion
	c.req.OnCompletion = func(ep *Endpoint, wc *qp.Completion) {
		fmt.Fprintf(w, "%12.3fus %s send completion wr=%d %v %v len=%d\n", float64(ep.Host.s.now)/float64(Microsecond),
			c.name, wc.WRID, wc.Opcode, wc.Status, wc.ByteLen)
		prev(ep, wc)
	}
	prevR := c.resp.OnCompletion
	c.resp.OnCompletion = func(ep *Endpoint, wc *qp.Completion) {
		fmt.Fprintf(w, "%12.3fus %s recv completion wr=%d %v %v len=%d\n", float64(ep.Host.s.now)/float64(Microsecond),
			c.name, wc.WRID, wc.Opcode, wc.Status, wc.ByteLen)
		prevR(ep, wc)
	}
}

// schedule builds the connection's random work requests and posts them at random times.
func (c *campaignConn) schedule(s *Sim, p *campaignProfile) (int, error) {
	r := s.Rand()
	mtu := p.mtu.Bytes()
	disjoint := p.cutAt > 0
	type post struct {
		at time.Duration
		wr qp.SendWR
	}
	var posts []post
	var at Time
	for i := 0; i < p.opsPerQP; i++ {
		n := r.IntN(3*mtu + 2)
		if r.Float64() < p.bigChance {
			n = 16<<10 + r.IntN(16<<10)
		}
		srcOff := r.IntN(campRegion - n)
		id := uint64(len(posts))
		wr := qp.SendWR{ID: id, Flags: qp.Signaled, SGL: sgl(c.src, srcOff, n)}
		data := c.src.Bytes()[srcOff : srcOff+n]
		ws := wantSend{id: id, length: uint32(n)}
		switch k := r.IntN(7); k {
		case 0, 1: // SEND, SEND with immediate
			if c.recvOff+n > campRegion {
				continue
			}
			wr.Opcode = qp.WRSend
			rv := wantRecv{id: uint64(len(c.wantRecv)), data: data, length: uint32(n)}
			if k == 1 {
				wr.Opcode, wr.Imm = qp.WRSendImm, r.Uint32()
				rv.imm, rv.immVal = true, wr.Imm
			}
			if err := c.resp.PostRecv(&qp.RecvWR{ID: rv.id, SGL: sgl(c.recvBuf, c.recvOff, n)}); err != nil {
				return 0, err
			}
			c.recvOff += n
			c.wantRecv = append(c.wantRecv, rv)
			ws.op = qp.CompSend
		case 2, 3: // WRITE, WRITE with immediate
			var dst int
			if disjoint {
				if c.writeOff+n > campReadBase {
					continue
				}
				dst = c.writeOff
				c.writeOff += n
				c.writes = append(c.writes, wantWrite{id: id, off: dst, data: data})
			} else {
				dst = r.IntN(campReadBase - n + 1)
			}
			wr.Opcode, wr.RemoteAddr, wr.RKey = qp.WRWrite, c.remote.IOVA()+uint64(dst), c.remote.RKey()
			copy(c.model[dst:], data)
			if k == 3 {
				wr.Opcode, wr.Imm = qp.WRWriteImm, r.Uint32()
				rv := wantRecv{id: uint64(len(c.wantRecv)), imm: true, immVal: wr.Imm, length: uint32(n)}
				if err := c.resp.PostRecv(&qp.RecvWR{ID: rv.id}); err != nil {
					return 0, err
				}
				c.wantRecv = append(c.wantRecv, rv)
			}
			ws.op = qp.CompRDMAWrite
		case 4: // READ
			if c.readOff+n > campRegion-8*256 {
				continue
			}
			from := campReadBase + r.IntN(campAtomBase-campReadBase-n+1)
			wr.Opcode, wr.SGL = qp.WRRead, sgl(c.readBuf, c.readOff, n)
			wr.RemoteAddr, wr.RKey = c.remote.IOVA()+uint64(from), c.remote.RKey()
			c.reads = append(c.reads, wantRead{id: id, off: c.readOff, data: c.model[from : from+n]})
			c.readOff += n
			ws.op = qp.CompRDMARead
		case 5, 6: // fetch-and-add, compare-and-swap
			if c.atomOff+8 > campRegion {
				continue
			}
			target := campAtomBase + 8*r.IntN(campCounters)
			cur := binary.NativeEndian.Uint64(c.model[target:])
			wr.SGL = sgl(c.readBuf, c.atomOff, 8)
			wr.RemoteAddr, wr.RKey = c.remote.IOVA()+uint64(target), c.remote.RKey()
			if k == 5 {
				wr.Opcode, wr.CompareAdd = qp.WRFetchAdd, uint64(r.IntN(1000)+1)
				binary.NativeEndian.PutUint64(c.model[target:], cur+wr.CompareAdd)
				ws.op = qp.CompFetchAdd
			} else {
				wr.Opcode, wr.Swap = qp.WRCompareSwap, r.Uint64()
				wr.CompareAdd = cur
				if r.IntN(3) == 0 {
					wr.CompareAdd = cur ^ 1 // fails to swap, still returns the value
				}
				if wr.CompareAdd == cur {
					binary.NativeEndian.PutUint64(c.model[target:], wr.Swap)
				}
				ws.op = qp.CompCompareSwap
			}
			c.atomics = append(c.atomics, wantAtomic{id: id, off: c.atomOff, orig: cur})
			c.atomOff += 8
			ws.length = 8
		}
		if ws.op == qp.CompCompareSwap || ws.op == qp.CompFetchAdd {
			ws.length = 8
		}
		c.wantSend = append(c.wantSend, ws)
		if p.postSpan > 0 {
			at += Time(r.Int64N(int64(p.postSpan)/int64(p.opsPerQP) + 1))
		}
		posts = append(posts, post{at: at.Duration(), wr: wr})
	}
	for i := range posts {
		wr := posts[i].wr
		s.At(FromDuration(posts[i].at), func() {
			if err := c.req.PostSend(&wr); err != nil && c.sendErr == "" {
				c.sendErr = fmt.Sprintf("PostSend wr %d: %v", wr.ID, err)
			}
		})
	}
	return len(posts), nil
}

func sgl(r *mr.Region, off, n int) []mr.SGE {
	return []mr.SGE{{Addr: r.IOVA() + uint64(off), Length: uint32(n), LKey: r.LKey()}}
}

// check verifies the connection's invariants after the run; cut says the cable died for good.
func (c *campaignConn) check(cut bool) (failed bool, err error) {
	if m := c.req.RetransmitMismatch; m != "" {
		return false, fmt.Errorf("%s: %s", errStalePSN, m)
	}
	if c.sendErr != "" {
		return false, fmt.Errorf("%s", c.sendErr)
	}
	if c.req.SendCQ.Overflowed() || c.resp.RecvCQ.Overflowed() {
		return false, fmt.Errorf("CQ overflow")
	}
	// Send completions: exactly once each, in order; successes, then (only under a cut) one retry
	// exhaustion and flushes.
	if len(c.gotSend) != len(c.wantSend) {
		return false, fmt.Errorf("%d send completions for %d requests (requester %v, responder %v)",
			len(c.gotSend), len(c.wantSend), c.req.QP.State(), c.resp.QP.State())
	}
	okUpTo := len(c.gotSend)
	for i, wc := range c.gotSend {
		w := c.wantSend[i]
		if wc.WRID != w.id {
			return false, fmt.Errorf("send completion %d has wr %d, want %d (out of order or repeated)", i, wc.WRID, w.id)
		}
		if okUpTo < len(c.gotSend) {
			if wc.Status != qp.StatusWRFlushErr {
				return true, fmt.Errorf("wr %d: %v after the QP failed, want %v", wc.WRID, wc.Status, qp.StatusWRFlushErr)
			}
			continue
		}
		switch {
		case wc.Status == qp.StatusSuccess:
			if wc.Opcode != w.op || wc.ByteLen != w.length {
				return false, fmt.Errorf("wr %d completed as %v len %d, want %v len %d", wc.WRID, wc.Opcode, wc.ByteLen, w.op, w.length)
			}
		case wc.Status == qp.StatusRetryExcErr && (cut || c.lossy):
			// A cut must end this way; heavy loss may, rarely (counted in CampaignResult.Failed).
			okUpTo = i
		default:
			return false, fmt.Errorf("wr %d (%v): %v", wc.WRID, w.op, wc.Status)
		}
	}
	failed = okUpTo < len(c.gotSend)
	if failed && c.req.QP.State() != qp.StateErr {
		return true, fmt.Errorf("requester in %v after retry exhaustion, want ERR", c.req.QP.State())
	}
	if !failed && c.req.QP.State() != qp.StateRTS {
		return false, fmt.Errorf("requester in %v, want RTS", c.req.QP.State())
	}
	if c.resp.QP.State() != qp.StateRTS {
		return failed, fmt.Errorf("responder in %v, want RTS", c.resp.QP.State())
	}
	succeeded := func(id uint64) bool { return int(id) < okUpTo }

	partial := cut || failed // not every request reached the responder
	// Receives: in order, exactly once, with the sender's bytes; all of them unless some requests failed.
	if len(c.gotRecv) > len(c.wantRecv) || !partial && len(c.gotRecv) != len(c.wantRecv) {
		return failed, fmt.Errorf("%d receive completions, want %d", len(c.gotRecv), len(c.wantRecv))
	}
	off := 0
	for i, wc := range c.gotRecv {
		w := c.wantRecv[i]
		if wc.WRID != w.id || wc.Status != qp.StatusSuccess {
			return failed, fmt.Errorf("receive completion %d: wr %d %v, want wr %d success", i, wc.WRID, wc.Status, w.id)
		}
		if wc.ByteLen != w.length || wc.Flags&qp.WithImm != 0 != w.imm || w.imm && wc.Imm != w.immVal {
			return failed, fmt.Errorf("receive %d: len %d imm %v %#x, want len %d imm %v %#x", i, wc.ByteLen,
				wc.Flags&qp.WithImm != 0, wc.Imm, w.length, w.imm, w.immVal)
		}
		if w.data != nil {
			if !bytes.Equal(c.recvBuf.Bytes()[off:off+len(w.data)], w.data) {
				return failed, fmt.Errorf("receive %d: data differs from what was sent", i)
			}
			off += len(w.data)
		}
	}
	for _, r := range c.reads {
		if succeeded(r.id) && !bytes.Equal(c.readBuf.Bytes()[r.off:r.off+len(r.data)], r.data) {
			return failed, fmt.Errorf("READ wr %d returned bytes that differ from the responder's memory", r.id)
		}
	}
	for _, a := range c.atomics {
		if !succeeded(a.id) {
			continue
		}
		if v := binary.NativeEndian.Uint64(c.readBuf.Bytes()[a.off:]); v != a.orig {
			return failed, fmt.Errorf("atomic wr %d returned %#x, want %#x (executed twice, or out of order)", a.id, v, a.orig)
		}
	}
	mem := c.remote.Bytes()
	if !partial {
		if !bytes.Equal(mem, c.model) {
			i := 0
			for mem[i] == c.model[i] {
				i++
			}
			return failed, fmt.Errorf("responder memory differs from the model at offset %d", i)
		}
		return false, nil
	}
	for _, w := range c.writes {
		if succeeded(w.id) && !bytes.Equal(mem[w.off:w.off+len(w.data)], w.data) {
			return failed, fmt.Errorf("WRITE wr %d completed but the responder's memory differs", w.id)
		}
	}
	return failed, nil
}
