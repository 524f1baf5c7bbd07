package qp

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// The tail-loss probe (Config.TailProbe), packet by packet: what the probe draws from the responder in
// each case of a lost tail, and that a slow path draws no probe at all.

// probeOpts are the defaults with the probe on and the usual timeout 14 (67 ms).
func probeOpts() pairOpts {
	o := defaultOpts()
	o.tailProbe = true
	return o
}

// warmUp runs one SEND across l so that A has a round-trip sample, without which no probe goes: the
// probe then waits 2 SRTT (here the 1 ms floor).
func warmUp(t *testing.T, l *link) {
	t.Helper()
	src := l.a.reg(t, 8, mr.LocalWrite)
	dst := l.b.reg(t, 8, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 100, SGL: sge(dst, 0, 8)}))
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 100, Opcode: WRSend, SGL: sge(src, 0, 8)}))
	l.run(time.Second)
	poll(l.b.rcq)
	l.ladder, l.resends = nil, nil
	if l.a.qp.cmp.srtt == 0 {
		t.Fatal("no round-trip sample")
	}
}

// The last packet of a WRITE is lost: the probe is that packet again, B takes it and acknowledges the
// WRITE, which completes a millisecond or two later instead of 67.
func TestTailProbeLastPacketLost(t *testing.T) {
	l := newLink(t, probeOpts())
	warmUp(t, l)
	src := l.a.reg(t, 3000, mr.LocalWrite)
	fill(src.Bytes(), 7)
	remote := l.b.reg(t, 3000, mr.LocalWrite|mr.RemoteWrite)
	l.hook = dropNth("A", wire.RCWriteLast, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 3000),
		RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	start := l.now
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_FIRST psn=257 len=3000 +1024",
		"-> RDMA_WRITE_MIDDLE psn=258 +1024",
		"-> RDMA_WRITE_LAST psn=259 A +952 (lost)",
		"-> RDMA_WRITE_LAST psn=259 A +952", // the probe: the last packet sent, again
		"<- ACKNOWLEDGE psn=259 [ACK msn=2]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 3000})
	if d := l.now.Sub(start); d > 2*time.Millisecond {
		t.Fatalf("recovered after %v", d)
	}
	if !bytes.Equal(src.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
	if c := l.a.qp.Counters(); c.TailProbes != 1 || c.ProbeRetries != 0 || c.Timeouts != 0 {
		t.Fatalf("counters %+v", c)
	}
	expectResends(t, l, ResendNone, ResendNone, ResendNone, ResendProbe, ResendNone)
}

// holdPacer lets packets go from until on and records the bytes of each packet charged to it.
type holdPacer struct {
	until time.Time
	sent  []int
}

func (p *holdPacer) NextSend(now time.Time, n int) time.Time {
	if p.until.After(now) {
		return p.until
	}
	return now
}

func (p *holdPacer) OnSent(now time.Time, n int) { p.sent = append(p.sent, n) }

// The rate limiter holds the QP when its tail is lost: the probe, due a millisecond after the last
// packet, waits for the pacer as every packet does, and is charged to it.
func TestTailProbePaced(t *testing.T) {
	l := newLink(t, probeOpts())
	warmUp(t, l)
	p := &holdPacer{}
	l.a.qp.cfg.Pacer = p
	src := l.a.reg(t, 3000, mr.LocalWrite)
	fill(src.Bytes(), 7)
	remote := l.b.reg(t, 3000, mr.LocalWrite|mr.RemoteWrite)
	start := l.now
	hold := start.Add(3 * time.Millisecond)
	drop := dropNth("A", wire.RCWriteLast, 1)
	var probeAt time.Time
	l.hook = func(l *link, h *host, pkt wire.Packet) [][]byte {
		if h == l.a && pkt.Opcode() == wire.RCWriteLast {
			if p.until.IsZero() {
				p.until = hold // the pacer holds the QP from the lost packet on
			} else {
				probeAt = l.now
			}
		}
		return drop(l, h, pkt)
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 3000),
		RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_FIRST psn=257 len=3000 +1024",
		"-> RDMA_WRITE_MIDDLE psn=258 +1024",
		"-> RDMA_WRITE_LAST psn=259 A +952 (lost)",
		"-> RDMA_WRITE_LAST psn=259 A +952",
		"<- ACKNOWLEDGE psn=259 [ACK msn=2]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 1, Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 3000})
	if probeAt.Before(hold) || probeAt.After(hold.Add(time.Millisecond)) {
		t.Errorf("the probe left %v after the WRITE, want at the pacer's release, %v", probeAt.Sub(start), hold.Sub(start))
	}
	if len(p.sent) != 4 || p.sent[3] != p.sent[2] {
		t.Errorf("the pacer was charged %v bytes, want the three packets and the probe, a copy of the third", p.sent)
	}
	if c := l.a.qp.Counters(); c.TailProbes != 1 || c.Timeouts != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// expectResends compares the Tx.Resend of each packet on the ladder with want.
func expectResends(t *testing.T, l *link, want ...Resend) {
	t.Helper()
	if !slices.Equal(l.resends, want) {
		t.Fatalf("resend causes %v, want %v", l.resends, want)
	}
}

// The last packet and the probe are both lost: a second probe goes after twice the wait, and the
// WRITE still completes in milliseconds, not after the 67 ms timeout.
func TestTailProbeProbeLost(t *testing.T) {
	l := newLink(t, probeOpts())
	warmUp(t, l)
	src := l.a.reg(t, 10, mr.LocalWrite)
	remote := l.b.reg(t, 10, mr.LocalWrite|mr.RemoteWrite)
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if h == l.a && p.Opcode() == wire.RCWriteOnly && l.sent <= 4 { // warmUp sent 2
			return nil
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 10),
		RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	start := l.now
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_ONLY psn=257 A len=10 +10 (lost)",
		"-> RDMA_WRITE_ONLY psn=257 A len=10 +10 (lost)", // the first probe
		"-> RDMA_WRITE_ONLY psn=257 A len=10 +10",        // the second, 2 ms later
		"<- ACKNOWLEDGE psn=257 [ACK msn=2]",
	)
	if d := l.now.Sub(start); d > 4*time.Millisecond {
		t.Fatalf("recovered after %v", d)
	}
	if c := l.a.qp.Counters(); c.TailProbes != 2 || c.Timeouts != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// The ACK is lost: the probe is a duplicate, which the responder acknowledges again without
// delivering it twice.
func TestTailProbeAckLost(t *testing.T) {
	l := newLink(t, probeOpts())
	warmUp(t, l)
	src := l.a.reg(t, 10, mr.LocalWrite)
	dst := l.b.reg(t, 64, mr.LocalWrite)
	must(t, l.b.qp.PostRecv(&RecvWR{ID: 1, SGL: sge(dst, 0, 32)}))
	l.hook = dropNth("B", wire.RCAcknowledge, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 9, Opcode: WRSend, Flags: Signaled, SGL: sge(src, 0, 10)}))
	l.run(time.Second)
	l.expectLadder(
		"-> SEND_ONLY psn=257 A +10",
		"<- ACKNOWLEDGE psn=257 [ACK msn=2] (lost)",
		"-> SEND_ONLY psn=257 A +10",
		"<- ACKNOWLEDGE psn=257 [ACK msn=2]",
	)
	expectCompletions(t, l.a.scq, Completion{WRID: 9, Opcode: CompSend, QPN: 0x11, ByteLen: 10})
	expectCompletions(t, l.b.rcq, Completion{WRID: 1, Opcode: CompRecv, QPN: 0x22, ByteLen: 10})
	if c := l.b.qp.Counters(); c.DuplicateRequest != 1 {
		t.Fatalf("duplicate_request %d", c.DuplicateRequest)
	}
	if c := l.a.qp.Counters(); c.Timeouts != 0 || c.TailProbes != 1 {
		t.Fatalf("counters %+v", c)
	}
}

// Two packets of the tail are lost: the probe (the last packet) finds a gap before it, B NAKs the
// first packet it misses, and go-back-N resends from there.
func TestTailProbeTwoLost(t *testing.T) {
	l := newLink(t, probeOpts())
	warmUp(t, l)
	src := l.a.reg(t, 4096, mr.LocalWrite)
	fill(src.Bytes(), 9)
	remote := l.b.reg(t, 4096, mr.LocalWrite|mr.RemoteWrite)
	drops := 0
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if h == l.a && drops < 2 && (p.Opcode() == wire.RCWriteMiddle && p.BTH().PSN() == 259 || p.Opcode() == wire.RCWriteLast) {
			drops++
			return nil
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 4096),
		RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_FIRST psn=257 len=4096 +1024",
		"-> RDMA_WRITE_MIDDLE psn=258 +1024",
		"-> RDMA_WRITE_MIDDLE psn=259 +1024 (lost)",
		"-> RDMA_WRITE_LAST psn=260 A +1024 (lost)",
		"-> RDMA_WRITE_LAST psn=260 A +1024", // the probe
		"<- ACKNOWLEDGE psn=259 [NAK psn-sequence-error msn=1]",
		"-> RDMA_WRITE_MIDDLE psn=259 +1024",
		"-> RDMA_WRITE_LAST psn=260 A +1024",
		"<- ACKNOWLEDGE psn=260 [ACK msn=2]",
	)
	if !bytes.Equal(src.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
	if c := l.a.qp.Counters(); c.Timeouts != 0 || c.TailProbes != 1 || c.ProbeRetries != 1 {
		t.Fatalf("counters %+v", c)
	}
	expectResends(t, l, ResendNone, ResendNone, ResendNone, ResendNone, ResendProbe, ResendNone, ResendProbeNAK, ResendProbeNAK, ResendNone)
}

// B NAKs a gap, and the resent packet for it is lost too: B NAKs a gap only once (IBTA Vol 1
// 9.7.5.1.2), so the rest of the resend draws nothing. While that resend has no answer, the probe is
// the missing packet itself: B takes it and acknowledges it; a second probe, the last packet, then
// draws a NAK for the packets B dropped after the gap, and they go again.
func TestTailProbeResentGapLost(t *testing.T) {
	l := newLink(t, probeOpts())
	warmUp(t, l)
	src := l.a.reg(t, 4096, mr.LocalWrite)
	fill(src.Bytes(), 11)
	remote := l.b.reg(t, 4096, mr.LocalWrite|mr.RemoteWrite)
	drops := 0
	l.hook = func(l *link, h *host, p wire.Packet) [][]byte {
		if h == l.a && p.BTH().PSN() == 258 && drops < 2 {
			drops++
			return nil
		}
		return [][]byte{p.Bytes()}
	}
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 4096),
		RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	start := l.now
	l.run(time.Second)
	l.expectLadder(
		"-> RDMA_WRITE_FIRST psn=257 len=4096 +1024",
		"-> RDMA_WRITE_MIDDLE psn=258 +1024 (lost)",
		"-> RDMA_WRITE_MIDDLE psn=259 +1024",
		"-> RDMA_WRITE_LAST psn=260 A +1024",
		"<- ACKNOWLEDGE psn=258 [NAK psn-sequence-error msn=1]",
		"-> RDMA_WRITE_MIDDLE psn=258 +1024 (lost)",
		"-> RDMA_WRITE_MIDDLE psn=259 +1024",
		"-> RDMA_WRITE_LAST psn=260 A +1024",
		"-> RDMA_WRITE_MIDDLE psn=258 A +1024", // the probe: the oldest unacknowledged packet
		"<- ACKNOWLEDGE psn=258 [ACK msn=1]",
		"-> RDMA_WRITE_LAST psn=260 A +1024", // the next probe: the last packet
		"<- ACKNOWLEDGE psn=259 [NAK psn-sequence-error msn=1]",
		"-> RDMA_WRITE_MIDDLE psn=259 +1024",
		"-> RDMA_WRITE_LAST psn=260 A +1024",
		"<- ACKNOWLEDGE psn=260 [ACK msn=2]",
	)
	if !bytes.Equal(src.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
	if d := l.now.Sub(start); d > 5*time.Millisecond {
		t.Fatalf("recovered after %v", d)
	}
	if c := l.a.qp.Counters(); c.Timeouts != 0 || c.TailProbes != 2 || c.ProbeRetries != 1 {
		t.Fatalf("counters %+v", c)
	}
}

// A slow path is not a lost tail: with a 10 ms one-way delay, the first exchange (no sample yet) draws
// no probe, and later ones wait twice the measured round trip, so no probe goes and the responder sees
// no duplicate.
func TestTailProbeSlowPath(t *testing.T) {
	l := newLink(t, probeOpts())
	l.delay = 10 * time.Millisecond
	src := l.a.reg(t, 64<<10, mr.LocalWrite)
	remote := l.b.reg(t, 64<<10, mr.LocalWrite|mr.RemoteWrite)
	for i := range 5 {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(i), Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 64<<10),
			RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
		l.run(time.Second)
	}
	if c := l.a.qp.Counters(); c.TailProbes != 0 || c.Timeouts != 0 {
		t.Fatalf("requester %+v", c)
	}
	if c := l.b.qp.Counters(); c.DuplicateRequest != 0 {
		t.Fatalf("responder saw %d duplicates", c.DuplicateRequest)
	}
	if srtt := l.a.qp.cmp.srtt; srtt < 20*time.Millisecond || srtt > 21*time.Millisecond {
		t.Fatalf("srtt %v over a 20 ms round trip", srtt)
	}
}

// A slow responder is not a lost tail either: B takes a packet every 100 us, so a 64 KiB WRITE sits
// in its queue for 6.4 ms while A, which measured a round trip of microseconds, probes after 1 ms. The
// probe is the last packet, queued behind the rest: B answers it with an ACK after working through
// them, and nothing is sent again but the probe itself. (A copy of the oldest unacknowledged packet
// would be answered only after the backlog too, but the backlog's own ACKs could not be told from that
// answer; rxe under emulation is such a responder.)
func TestTailProbeSlowResponder(t *testing.T) {
	l := newLink(t, probeOpts())
	warmUp(t, l)
	l.service = 100 * time.Microsecond
	src := l.a.reg(t, 64<<10, mr.LocalWrite)
	fill(src.Bytes(), 5)
	remote := l.b.reg(t, 64<<10, mr.LocalWrite|mr.RemoteWrite)
	for i := range 4 {
		must(t, l.a.qp.PostSend(l.now, &SendWR{ID: uint64(i), Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 64<<10),
			RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	}
	l.run(time.Second)
	var want []Completion
	for i := range 4 {
		want = append(want, Completion{WRID: uint64(i), Opcode: CompRDMAWrite, QPN: 0x11, ByteLen: 64 << 10})
	}
	expectCompletions(t, l.a.scq, want...)
	if !bytes.Equal(src.Bytes(), remote.Bytes()) {
		t.Fatal("data differs")
	}
	a, b := l.a.qp.Counters(), l.b.qp.Counters()
	if a.TailProbes == 0 {
		t.Fatal("no probe went: the test shows nothing")
	}
	if a.ProbeRetries != 0 || a.Timeouts != 0 || b.DuplicateRequest != a.TailProbes || b.OutOfSeqRequest != 0 {
		t.Fatalf("requester %+v\nresponder %+v", a, b)
	}
	if want := 4 * 64; int(a.SentPkts-a.TailProbes) != want+1 { // +1: warmUp's SEND
		t.Fatalf("sent %d packets besides %d probes, want %d", a.SentPkts-a.TailProbes, a.TailProbes, want+1)
	}
}

// With the probe off (the engines' default, and rxe's behaviour) a lost tail waits for the timeout.
func TestTailProbeOff(t *testing.T) {
	o := defaultOpts()
	l := newLink(t, o)
	src := l.a.reg(t, 10, mr.LocalWrite)
	remote := l.b.reg(t, 10, mr.LocalWrite|mr.RemoteWrite)
	l.hook = dropNth("A", wire.RCWriteOnly, 1)
	must(t, l.a.qp.PostSend(l.now, &SendWR{ID: 1, Opcode: WRWrite, Flags: Signaled, SGL: sge(src, 0, 10),
		RemoteAddr: remote.IOVA(), RKey: remote.RKey()}))
	start := l.now
	l.run(time.Second)
	if d := l.now.Sub(start); d < ackTimeout(14) {
		t.Fatalf("recovered after %v, before the timeout", d)
	}
	if c := l.a.qp.Counters(); c.TailProbes != 0 || c.Timeouts != 1 {
		t.Fatalf("counters %+v", c)
	}
	expectResends(t, l, ResendNone, ResendTimeout, ResendNone)
}
