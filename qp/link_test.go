package qp

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// This file is the test bench for the engines: two QPs joined by an in-memory link on a manual clock.
// Every packet is parsed with wire.Parse on its way across, can be dropped, duplicated, delayed or
// rewritten by a hook, and is recorded in a ladder the tests assert on.

var epoch = time.Unix(1_000_000, 0)

// host is one side: a memory table, a PD, CQs and a QP.
type host struct {
	name string
	mem  *mr.Table
	pd   *mr.PD
	scq  *CQ
	rcq  *CQ
	qp   *QP
}

func newHost(t testing.TB, name string, typ Type, qpn wire.QPN, srq bool) *host {
	h := &host{name: name, mem: mr.NewTable()}
	h.pd = h.mem.AllocPD()
	h.scq, h.rcq = NewCQ(4096), NewCQ(4096)
	cfg := Config{Type: typ, QPN: qpn, PD: h.pd, Memory: h.mem, SendCQ: h.scq, RecvCQ: h.rcq,
		MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 256}
	if srq {
		cfg.SRQ = NewSRQ(256, 4)
	}
	q, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.qp = q
	return h
}

// reg registers a buffer of n bytes with the given access and returns the region.
func (h *host) reg(t testing.TB, n int, acc mr.Access) *mr.Region {
	t.Helper()
	r, err := h.mem.Register(h.pd, make([]byte, n), acc)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func sge(r *mr.Region, off, n int) []mr.SGE {
	return []mr.SGE{{Addr: r.IOVA() + uint64(off), Length: uint32(n), LKey: r.LKey()}}
}

// poll returns every completion waiting on cq.
func poll(cq *CQ) []Completion {
	out := make([]Completion, cq.Len())
	return out[:cq.Poll(out)]
}

// frame is a packet in flight.
type frame struct {
	from, to *host
	b        []byte
	at       time.Time // delivery time
}

// link joins two hosts.
type link struct {
	t      testing.TB
	now    time.Time
	a, b   *host
	delay  time.Duration
	flight []frame
	ladder []string
	// hook sees every packet as it is sent; it may rewrite it (the returned slices are delivered, none
	// drops it, two duplicates it).
	hook func(l *link, from *host, p wire.Packet) [][]byte
	// jitter, if set, adds to each packet's delivery time, which reorders packets.
	jitter func() time.Duration
	// service, if set, makes B a slow responder: it takes a packet every service, in order, so the
	// rest wait in a queue (bFree is when B is next free).
	service time.Duration
	bFree   time.Time
	sent    int
	resends []Resend // Tx.Resend of each ladder line
	// byRef as in pairOpts; refPackets counts the packets built with payload pieces.
	byRef      bool
	refPackets int
}

type pairOpts struct {
	typ            Type
	mtu            wire.MTU
	psnA, psnB     wire.PSN
	access         mr.Access
	timeout        uint8
	retry, rnr     uint8
	minRNR         uint8
	rdAtomic       uint8
	srq            bool
	skipConnecting bool
	ackDelay       time.Duration
	tailProbe      bool
	// byRef builds packets with AppendPacketRefs, put back together as a datapath's socket does.
	byRef bool
}

func defaultOpts() pairOpts {
	return pairOpts{typ: RC, mtu: wire.MTU1024, psnA: 0x100, psnB: 0x200,
		access:  mr.LocalWrite | mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic,
		timeout: 14, retry: 7, rnr: 7, minRNR: 12, rdAtomic: 16}
}

func newLink(t testing.TB, o pairOpts) *link {
	l := &link{t: t, now: epoch, delay: time.Microsecond, byRef: o.byRef}
	l.a = newHost(t, "A", o.typ, 0x11, false)
	l.b = newHost(t, "B", o.typ, 0x22, o.srq)
	l.a.qp.cfg.AckDelay, l.b.qp.cfg.AckDelay = o.ackDelay, o.ackDelay
	l.a.qp.cfg.TailProbe, l.b.qp.cfg.TailProbe = o.tailProbe, o.tailProbe
	if !o.skipConnecting {
		connect(t, l.now, l.a.qp, 0x22, o, o.psnA, o.psnB)
		connect(t, l.now, l.b.qp, 0x11, o, o.psnB, o.psnA)
	}
	return l
}

// connect brings q to RTS the way ibv_rc_pingpong does.
func connect(t testing.TB, now time.Time, q *QP, dest wire.QPN, o pairOpts, sqPSN, rqPSN wire.PSN) {
	t.Helper()
	must(t, q.Connect(now, &ConnectParams{AccessFlags: o.access, QKey: 0x1111, PathMTU: o.mtu, DestQPN: dest,
		RQPSN: rqPSN, SQPSN: sqPSN, Timeout: o.timeout, RetryCnt: o.retry, RNRRetry: o.rnr,
		MinRNRTimer: o.minRNR, RdAtomic: o.rdAtomic}))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (l *link) other(h *host) *host {
	if h == l.a {
		return l.b
	}
	return l.a
}

// describe renders a packet for the ladder.
func describe(p wire.Packet) string {
	b := p.BTH()
	s := fmt.Sprintf("%s psn=%d", strings.TrimPrefix(p.Opcode().String(), "RC "), uint32(b.PSN()))
	if b.AckReq() {
		s += " A"
	}
	if r := p.RETH(); r != nil {
		s += fmt.Sprintf(" len=%d", r.DMALen())
	}
	if a := p.AETH(); a != nil {
		s += fmt.Sprintf(" [%v msn=%d]", a.Syndrome(), a.MSN())
	}
	if p.PayloadLen() > 0 {
		s += fmt.Sprintf(" +%d", p.PayloadLen())
	}
	return s
}

// pump pulls every packet each QP wants to send now and puts it on the wire.
func (l *link) pump() bool {
	any := false
	for _, h := range []*host{l.a, l.b} {
		for {
			var out []byte
			var tx Tx
			var ok bool
			may := h.qp.MaySend(l.now) // checked against what AppendPacket then does, in every test on a link
			if !l.byRef {
				out, tx, ok = h.qp.AppendPacket(l.now, make([]byte, 0, 4200))
			} else {
				var refs [][]byte
				out, refs, tx, ok = h.qp.AppendPacketRefs(l.now, make([]byte, 0, 4200), nil)
				if len(refs) > 0 {
					l.refPackets++
					whole := append(bytes.Clone(out[:tx.PayloadAt]), bytes.Join(refs, nil)...)
					out = append(whole, out[tx.PayloadAt:]...)
				}
				if ok && tx.PacketLen != len(out) {
					l.t.Fatalf("%s: PacketLen %d of a %d-byte packet", h.name, tx.PacketLen, len(out))
				}
			}
			if !ok {
				break
			}
			if !may {
				l.t.Fatalf("%s: MaySend said nothing to send, and AppendPacket built a packet", h.name)
			}
			any = true
			l.sent++
			p, err := wire.Parse(out)
			if err != nil {
				l.t.Fatalf("%s sent an invalid packet: %v: %x", h.name, err, out)
			}
			sends := [][]byte{out}
			if l.hook != nil {
				sends = l.hook(l, h, p)
			}
			arrow := "->"
			if h == l.b {
				arrow = "<-"
			}
			if len(sends) == 0 {
				l.ladder = append(l.ladder, fmt.Sprintf("%s %s (lost)", arrow, describe(p)))
			} else {
				l.ladder = append(l.ladder, fmt.Sprintf("%s %s", arrow, describe(p)))
			}
			l.resends = append(l.resends, tx.Resend)
			for _, b := range sends {
				at := l.now.Add(l.delay)
				if l.jitter != nil {
					at = at.Add(l.jitter())
				}
				if l.service > 0 && h == l.a {
					if l.bFree.After(at) {
						at = l.bFree
					}
					l.bFree = at.Add(l.service)
				}
				l.flight = append(l.flight, frame{from: h, to: l.other(h), b: bytes.Clone(b), at: at})
			}
		}
	}
	return any
}

// deliverDue hands over every packet whose delivery time has come, in order.
func (l *link) deliverDue() bool {
	any := false
	keep := l.flight[:0]
	var due []frame
	for _, f := range l.flight {
		if !f.at.After(l.now) {
			due = append(due, f)
		} else {
			keep = append(keep, f)
		}
	}
	l.flight = keep
	for _, f := range due {
		p, err := wire.Parse(f.b)
		if err != nil {
			continue
		}
		any = true
		f.to.qp.HandlePacket(l.now, p, nil)
	}
	return any
}

// run moves packets and time until nothing is left to do or limit passes.
func (l *link) run(limit time.Duration) {
	end := l.now.Add(limit)
	for steps := 0; steps < 1_000_000; steps++ {
		l.a.qp.Advance(l.now)
		l.b.qp.Advance(l.now)
		moved := l.pump()
		moved = l.deliverDue() || moved
		if moved {
			continue
		}
		next := earliest(l.a.qp.NextDeadline(), l.b.qp.NextDeadline())
		for _, f := range l.flight {
			next = earliest(next, f.at)
		}
		if next.IsZero() || next.After(end) {
			return
		}
		if next.After(l.now) {
			l.now = next
		}
	}
	l.t.Fatal("link did not settle")
}

func (l *link) ladderString() string { return strings.Join(l.ladder, "\n") }

// expectLadder compares the ladder with want, line by line.
func (l *link) expectLadder(want ...string) {
	l.t.Helper()
	if got := l.ladderString(); got != strings.Join(want, "\n") {
		l.t.Fatalf("ladder:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}
