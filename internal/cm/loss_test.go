package cm

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/wire/mad"
)

// Lost MADs, recovered by resends; MRA; duplicates answered from what was sent; timewait; a stale
// connection; a peer that vanishes.

// loseFirst returns a hook that loses the first n MADs for which match is true.
func loseFirst(n int, match func(from *peer, m mad.MAD) bool) func(*peer, mad.MAD) verdict {
	return func(from *peer, m mad.MAD) verdict {
		if n > 0 && match(from, m) {
			n--
			return lose
		}
		return pass
	}
}

func is(a mad.AttributeID) func(*peer, mad.MAD) bool {
	return func(_ *peer, m mad.MAD) bool { return m.Header().AttributeID() == a }
}

// rto is the resend timer of a REQ, REP or DREQ with the defaults: 2 × 4.096 µs × 2^18 + 4.096 µs ×
// 2^20 = 6.44 s.
var rto = 2*Timeout(DefaultPacketLifeTime) + Timeout(DefaultCMResponseTimeout)

// TestLostREQ: the first REQ is lost; A resends it after rto and the connection comes up.
func TestLostREQ(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	l.hook = loseFirst(1, is(mad.AttrConnectRequest))
	ida, _ := a.e.Connect(l.now, connectParams(nil))
	l.run(rto - time.Millisecond)
	l.expectLadder("A>B REQ lost")
	b.expectEvents(t)
	l.run(10 * time.Millisecond)
	l.expectLadder("A>B REQ")
	req := b.expectEvents(t, EventRequest)[0]
	b.e.Accept(l.now, req.ID, acceptParams(nil))
	l.settle()
	a.expectEvents(t, EventReply)
	a.e.Confirm(l.now, ida, nil)
	l.settle()
	l.expectLadder("B>A REP", "A>B RTU")
	b.expectEvents(t, EventEstablished)
	if c := a.e.Counters(); c.Retries[attrIndex(mad.AttrConnectRequest)] != 1 {
		t.Errorf("A's retries %v", c.Retries)
	}
	l.clean()
}

// TestLostREP: the REP is lost. A resends its REQ; B, in REP_SENT, answers the duplicate with the same
// REP, byte for byte.
func TestLostREP(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	var reps [][]byte
	lost := false
	l.hook = func(_ *peer, m mad.MAD) verdict {
		if m.REP() != nil {
			reps = append(reps, bytes.Clone(m))
			if !lost {
				lost = true
				return lose
			}
		}
		return pass
	}
	ida, _ := a.e.Connect(l.now, connectParams(nil))
	l.settle()
	req := b.expectEvents(t, EventRequest)[0]
	b.e.Accept(l.now, req.ID, acceptParams(nil))
	l.run(rto - 200*time.Millisecond)
	l.expectLadder("A>B REQ", "B>A REP lost")
	// A's resend comes before B's: B answers it with the REP.
	l.run(150 * time.Millisecond)
	l.expectLadder("A>B REQ", "B>A REP")
	if len(reps) != 2 || !bytes.Equal(reps[0], reps[1]) {
		t.Fatalf("REP resent as %x, first was %x", reps[len(reps)-1], reps[0])
	}
	a.expectEvents(t, EventReply)
	a.e.Confirm(l.now, ida, nil)
	l.settle()
	l.expectLadder("A>B RTU")
	b.expectEvents(t, EventEstablished)
	if c := b.e.Counters(); c.Duplicates[attrIndex(mad.AttrConnectRequest)] != 1 {
		t.Errorf("B's duplicates %v", c.Duplicates)
	}
	l.clean()
}

// TestLostRTU: the RTU is lost. B resends its REP after rto; A, established, answers with the RTU again.
func TestLostRTU(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	l.hook = loseFirst(1, is(mad.AttrReadyToUse))
	ida, _ := a.e.Connect(l.now, connectParams(nil))
	l.settle()
	req := b.expectEvents(t, EventRequest)[0]
	b.e.Accept(l.now, req.ID, acceptParams(nil))
	l.settle()
	a.expectEvents(t, EventReply)
	a.e.Confirm(l.now, ida, nil)
	l.run(rto + time.Second)
	l.expectLadder("A>B REQ", "B>A REP", "A>B RTU lost", "B>A REP", "A>B RTU")
	b.expectEvents(t, EventEstablished)
	l.clean()
}

// TestEstablishWithoutRTU: the RTU is lost but B's QP receives A's first packet: the device calls
// Establish, and the late RTU is a duplicate.
func TestEstablishWithoutRTU(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	var rtu []byte
	l.hook = func(_ *peer, m mad.MAD) verdict {
		if m.RTU() != nil {
			rtu = bytes.Clone(m)
			return lose
		}
		return pass
	}
	ida, _ := a.e.Connect(l.now, connectParams(nil))
	l.settle()
	req := b.expectEvents(t, EventRequest)[0]
	b.e.Accept(l.now, req.ID, acceptParams(nil))
	l.settle()
	a.e.Confirm(l.now, ida, nil)
	l.settle()
	if err := b.e.Establish(l.now, req.ID); err != nil {
		t.Fatal(err)
	}
	l.collect()
	b.expectEvents(t, EventEstablished)
	if !b.e.NextDeadline().IsZero() {
		t.Errorf("B still has a timer at %v", b.e.NextDeadline())
	}
	l.inject(b, gidA, rtu)
	b.expectEvents(t)
	if c := b.e.Counters(); c.Duplicates[attrIndex(mad.AttrReadyToUse)] != 1 {
		t.Errorf("B's duplicates %v", c.Duplicates)
	}
	l.clean()
}

// TestLostDREQAndDREP: the first DREQ is lost, then the DREP. A resends its DREQ each time; B, which
// has left timewait by the second resend (2.15 s < 6.44 s), answers a DREQ of no connection with a DREP
// all the same.
func TestLostDREQAndDREP(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	ida, _ := l.establish()
	lostDREQ, lostDREP := false, false
	l.hook = func(_ *peer, m mad.MAD) verdict {
		switch {
		case m.DREQ() != nil && !lostDREQ:
			lostDREQ = true
			return lose
		case m.DREP() != nil && !lostDREP:
			lostDREP = true
			return lose
		}
		return pass
	}
	a.e.Disconnect(l.now, ida, nil)
	l.run(2*rto + time.Second)
	l.expectLadder("A>B DREQ lost", "A>B DREQ", "B>A DREP lost", "A>B DREQ", "B>A DREP")
	a.expectEvents(t, EventDisconnected)
	b.expectEvents(t, EventDisconnected, EventTimewaitDone)
	if c := b.e.Counters(); c.UnknownAnswered != 1 {
		t.Errorf("B answered %d DREQs of no connection", c.UnknownAnswered)
	}
	l.run(10 * time.Second)
	a.expectEvents(t, EventTimewaitDone)
	l.clean()
}

// TestPeerVanishesREQ: nothing A sends arrives. A sends its REQ 1 + 15 times, then gives up: a REJ with
// reason timeout naming its GUID, and EventUnreachable.
func TestPeerVanishesREQ(t *testing.T) {
	l, a, _ := newLink(t)
	l.hook = func(*peer, mad.MAD) verdict { return lose }
	a.e.Connect(l.now, connectParams(nil))
	l.run(16*rto - time.Second)
	a.expectEvents(t)
	l.run(2 * time.Second)
	want := slices.Repeat([]string{"A>B REQ lost"}, 16)
	l.expectLadder(append(want, "A>B REJ other timeout(4) lost")...)
	a.expectEvents(t, EventUnreachable)
	c := a.e.Counters()
	if c.Retries[attrIndex(mad.AttrConnectRequest)] != 15 || c.Unreachable != 1 || a.e.Len() != 0 {
		t.Errorf("retries %d, unreachable %d, %d connections", c.Retries[0], c.Unreachable, a.e.Len())
	}
	l.clean()
}

// TestPeerVanishesDREQ: the peer goes away while connected; A's DREQ runs out of retries and the
// connection ends anyway.
func TestPeerVanishesDREQ(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	ida, _ := l.establish()
	l.hook = func(*peer, mad.MAD) verdict { return lose }
	a.e.Disconnect(l.now, ida, nil)
	l.run(16*rto + time.Second)
	l.expectLadder(slices.Repeat([]string{"A>B DREQ lost"}, 16)...)
	a.expectEvents(t, EventDisconnected)
	l.run(5 * time.Second)
	a.expectEvents(t, EventTimewaitDone)
	l.clean()
}

// TestMRA: B's owner takes 30 s to accept. A's resent REQ gets an MRA and A waits for the REP, sending
// no more REQs, though the MRA's 68.7 s are longer than many rtos.
func TestMRA(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	ida, _ := a.e.Connect(l.now, connectParams(nil))
	l.run(30 * time.Second)
	l.expectLadder("A>B REQ", "A>B REQ", "B>A MRA REQ")
	if s, _ := a.e.State(ida); s != StateMRAReqRcvd {
		t.Fatalf("A in %v", s)
	}
	req := b.expectEvents(t, EventRequest)[0]
	if s, _ := b.e.State(req.ID); s != StateMRAReqSent {
		t.Fatalf("B in %v", s)
	}
	b.e.Accept(l.now, req.ID, acceptParams(nil))
	l.settle()
	a.expectEvents(t, EventReply)
	a.e.Confirm(l.now, ida, nil)
	l.settle()
	l.expectLadder("B>A REP", "A>B RTU")
	b.expectEvents(t, EventEstablished)
	l.clean()
}

// TestMRAExpires: an MRA'd REQ whose REP never comes is resent once the MRA's wait is over.
func TestMRAExpires(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	a.e.Connect(l.now, connectParams(nil))
	l.run(rto + time.Second)
	l.expectLadder("A>B REQ", "A>B REQ", "B>A MRA REQ")
	// Keep B's answers from A from now on: its REJ at the owner timeout is lost too.
	l.hook = func(from *peer, _ mad.MAD) verdict {
		if from == b {
			return lose
		}
		return pass
	}
	wait := Timeout(DefaultMRATimeout) + Timeout(DefaultPacketLifeTime+1)
	l.run(wait - 2*time.Second)
	l.expectLadder("B>A REJ REQ timeout(4) lost")
	l.run(3 * time.Second)
	l.expectLadder("A>B REQ")
	l.clean()
}

// TestDuplicateREQ: a copy of the REQ arrives while B's owner decides (B sends an MRA), and another
// once the REP is out (B sends the same REP again).
func TestDuplicateREQ(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	var req []byte
	l.hook = func(_ *peer, m mad.MAD) verdict {
		if m.REQ() != nil {
			req = bytes.Clone(m)
			return dup
		}
		return pass
	}
	a.e.Connect(l.now, connectParams(nil))
	l.settle()
	l.expectLadder("A>B REQ dup", "B>A MRA REQ")
	ev := b.expectEvents(t, EventRequest)[0]
	// From here on nothing reaches A: the REPs are caught on the way.
	var reps [][]byte
	l.hook = func(_ *peer, m mad.MAD) verdict { reps = append(reps, bytes.Clone(m)); return lose }
	b.e.Accept(l.now, ev.ID, acceptParams(nil))
	l.collect()
	l.inject(b, gidA, req)
	l.expectLadder("B>A REP lost", "B>A REP lost")
	if len(reps) != 2 || !bytes.Equal(reps[0], reps[1]) || mad.MAD(reps[0]).REP() == nil {
		t.Fatalf("answers %x", reps)
	}
	if c := b.e.Counters(); c.Duplicates[attrIndex(mad.AttrConnectRequest)] != 2 {
		t.Errorf("B's duplicates %v", c.Duplicates)
	}
	a.expectEvents(t)
	l.clean()
}

// TestTimewait: while B is in timewait, a replayed REQ of the old connection gets REJ stale connection
// and a replayed DREQ gets the DREP again; after timewait the connection is gone.
func TestTimewait(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	var req, dreq []byte
	l.hook = func(_ *peer, m mad.MAD) verdict {
		switch {
		case m.REQ() != nil:
			req = bytes.Clone(m)
		case m.DREQ() != nil:
			dreq = bytes.Clone(m)
		}
		return pass
	}
	ida, idb := l.establish()
	a.e.Disconnect(l.now, ida, nil)
	l.settle()
	l.expectLadder("A>B DREQ", "B>A DREP")
	l.inject(b, gidA, req)
	l.inject(b, gidA, dreq)
	l.settle()
	l.expectLadder("B>A REJ other stale-connection(10)", "B>A DREP")
	if s, _ := b.e.State(idb); s != StateTimewait {
		t.Fatalf("B in %v", s)
	}
	l.run(Timeout(19) + time.Second)
	if _, ok := b.e.State(idb); ok {
		t.Fatal("B still holds the connection after timewait")
	}
	l.clean()
}

// TestStaleConnection: A loses its state (a new engine on the same CA) and connects again from the same
// QP. B still has the old connection: it rejects the REQ as stale and disconnects the old one; the
// new A answers that DREQ of a connection it does not know with a DREP.
func TestStaleConnection(t *testing.T) {
	l, _, b := newLink(t)
	b.e.Listen(svc, 0)
	_, idb := l.establish()
	a2 := &peer{name: "A", gid: gidA, e: NewEngine(Config{LocalGID: gidA, CAGUID: 0xA0A0, Seed: 99})}
	l.peers[0] = a2
	if _, err := a2.e.Connect(l.now, connectParams(nil)); err != nil {
		t.Fatal(err)
	}
	l.settle()
	l.expectLadder("A>B REQ", "B>A REJ REQ stale-connection(10)", "B>A DREQ", "A>B DREP")
	if ev := a2.expectEvents(t, EventRejected)[0]; ev.Reason != mad.RejStaleConnection {
		t.Fatalf("A's event %+v", ev)
	}
	b.expectEvents(t, EventDisconnected)
	if s, _ := b.e.State(idb); s != StateTimewait {
		t.Fatalf("B's old connection in %v", s)
	}
	if c := b.e.Counters(); c.StaleRejected != 1 {
		t.Errorf("stale rejected %d", c.StaleRejected)
	}
	// After both timewaits A connects again, and this time it works.
	l.run(10 * time.Second)
	b.events = nil
	a2.events = nil
	l.ladder = nil
	l.establish()
	l.clean()
}
