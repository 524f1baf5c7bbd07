package cm

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

var udpSvc = mad.ServiceID(mad.PortSpaceUDP, 7174)

// sidrTimeout is a SIDR_REQ's resend timer with the defaults: 4.096 µs × 2^20 = 4.3 s.
var sidrTimeout = Timeout(DefaultCMResponseTimeout)

func TestSIDR(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(udpSvc, 0)
	id, err := a.e.Resolve(l.now, &SIDRParams{ServiceID: udpSvc, Peer: gidB, PrivateData: []byte("udaddy")})
	if err != nil {
		t.Fatal(err)
	}
	l.settle()
	req := b.expectEvents(t, EventSIDRRequest)[0]
	if req.ServiceID != udpSvc || req.QP.PKey != wire.DefaultPKey || string(req.PrivateData[:6]) != "udaddy" {
		t.Fatalf("request %+v", req)
	}
	if err := b.e.AnswerSIDR(l.now, req.ID, &SIDRAnswer{QPN: qpnB, QKey: 0x01234567, PrivateData: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	l.settle()
	l.expectLadder("A>B SIDR_REQ", "B>A SIDR_REP success")
	ev := a.expectEvents(t, EventSIDRResolved)[0]
	if ev.ID != id || ev.Status != mad.SIDRSuccess || ev.QP.DestQPN != qpnB || ev.QKey != 0x01234567 ||
		string(ev.PrivateData[:2]) != "ok" {
		t.Fatalf("resolved %+v", ev)
	}
	if a.e.Len() != 0 {
		t.Fatalf("A holds %d", a.e.Len())
	}
	// B keeps its answer a while for a duplicate, then forgets it.
	l.run(3 * sidrTimeout)
	if b.e.Len() != 0 {
		t.Fatalf("B holds %d", b.e.Len())
	}
	l.clean()
}

func TestSIDRUnsupported(t *testing.T) {
	l, a, _ := newLink(t)
	a.e.Resolve(l.now, &SIDRParams{ServiceID: udpSvc, Peer: gidB})
	l.settle()
	l.expectLadder("A>B SIDR_REQ", "B>A SIDR_REP unsupported")
	if ev := a.expectEvents(t, EventSIDRResolved)[0]; ev.Status != mad.SIDRUnsupported {
		t.Fatalf("resolved %+v", ev)
	}
	l.clean()
}

// TestSIDRLostReply: the SIDR_REP is lost; the client asks again and the server answers from what it
// kept, without asking its owner twice.
func TestSIDRLostReply(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(udpSvc, 0)
	l.hook = loseFirst(1, is(mad.AttrSIDRReply))
	a.e.Resolve(l.now, &SIDRParams{ServiceID: udpSvc, Peer: gidB})
	l.settle()
	req := b.expectEvents(t, EventSIDRRequest)[0]
	b.e.AnswerSIDR(l.now, req.ID, &SIDRAnswer{QPN: qpnB, QKey: 7})
	l.run(sidrTimeout + time.Second)
	l.expectLadder("A>B SIDR_REQ", "B>A SIDR_REP success lost", "A>B SIDR_REQ", "B>A SIDR_REP success")
	a.expectEvents(t, EventSIDRResolved)
	b.expectEvents(t)
	l.clean()
}

func TestSIDRUnreachable(t *testing.T) {
	l, a, _ := newLink(t)
	l.hook = func(*peer, mad.MAD) verdict { return lose }
	a.e.Resolve(l.now, &SIDRParams{ServiceID: udpSvc, Peer: gidB})
	l.run(16*sidrTimeout + time.Second)
	l.expectLadder(slices.Repeat([]string{"A>B SIDR_REQ lost"}, 16)...)
	a.expectEvents(t, EventUnreachable)
	if a.e.Len() != 0 {
		t.Fatalf("A holds %d", a.e.Len())
	}
	l.clean()
}

// TestSIDROwnerTooSlow: a SIDR request unanswered past Config.OwnerTimeout is refused.
func TestSIDROwnerTooSlow(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(udpSvc, 0)
	a.e.Resolve(l.now, &SIDRParams{ServiceID: udpSvc, Peer: gidB})
	l.run(DefaultOwnerTimeout + time.Second)
	b.expectEvents(t, EventSIDRRequest, EventUnreachable)
	// A resent its SIDR_REQ every 4.3 s meanwhile; those duplicates were dropped.
	if ev := a.expectEvents(t, EventSIDRResolved)[0]; ev.Status != mad.SIDRReject {
		t.Fatalf("resolved %+v", ev)
	}
	l.clean()
}

// TestLossyLink runs many connections at once over a link that loses, duplicates and delays MADs at
// random, with owners that accept, confirm and disconnect. Every connection comes up on both sides and
// goes away again, and the engines end empty. The seed is printed so that a failure replays.
func TestLossyLink(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 3))
	l, a, b := newLink(t)
	b.e.Listen(svc, 100)
	l.hook = func(*peer, mad.MAD) verdict {
		switch x := r.Float64(); {
		case x < 0.2:
			return lose
		case x < 0.3:
			return dup
		}
		return pass
	}
	const n = 30
	for i := range n {
		p := connectParams(nil)
		p.QPN = wire.QPN(0x100 + i)
		if _, err := a.e.Connect(l.now, p); err != nil {
			t.Fatal(err)
		}
	}
	established, disconnected, ended := map[*peer]int{}, map[*peer]int{}, map[*peer]int{}
	for step := 0; step < 20000 && (ended[a] < n || ended[b] < n); step++ {
		l.run(50 * time.Millisecond)
		for _, p := range []*peer{a, b} {
			for _, ev := range p.events {
				switch ev.Kind {
				case EventRequest:
					ap := acceptParams(nil)
					ap.QPN = ev.QP.DestQPN + 0x1000
					if _, err := p.e.Accept(l.now, ev.ID, ap); err != nil {
						t.Fatalf("seed %d: Accept: %v", seed, err)
					}
				case EventReply:
					if err := p.e.Confirm(l.now, ev.ID, nil); err != nil {
						t.Fatalf("seed %d: Confirm: %v", seed, err)
					}
					established[p]++
				case EventEstablished:
					established[p]++
				case EventDisconnected:
					disconnected[p]++
				case EventTimewaitDone:
					ended[p]++
				case EventRejected, EventUnreachable:
					t.Fatalf("seed %d: %s: %v (%v)", seed, p.name, ev.Kind, ev.Reason)
				}
			}
			p.events = nil
		}
		// Once a second, disconnect what is established: A the connections of even ID, B the others.
		// B may not have seen the RTU yet, and then learns of the end without EventEstablished.
		if step%20 == 19 {
			for id, c := range a.e.conns {
				if c.state == StateEstablished && id%2 == 0 {
					a.e.Disconnect(l.now, id, nil)
				}
			}
			for id, c := range b.e.conns {
				if c.state == StateEstablished && c.remoteID%2 == 1 {
					b.e.Disconnect(l.now, id, nil)
				}
			}
		}
	}
	if established[a] != n || established[b] > n || disconnected[a] != n || disconnected[b] != n ||
		ended[a] != n || ended[b] != n {
		t.Fatalf("seed %d: established %d/%d, disconnected %d/%d, ended %d/%d, want %d", seed, established[a],
			established[b], disconnected[a], disconnected[b], ended[a], ended[b], n)
	}
	if a.e.Len() != 0 || b.e.Len() != 0 {
		t.Fatalf("seed %d: connections left: %d, %d", seed, a.e.Len(), b.e.Len())
	}
	l.ladder = nil
	l.clean()
}
