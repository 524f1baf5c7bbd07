package cm

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// The test network: engines on an in-memory link with a manual clock. Every MAD that crosses it is
// written down as a line of a ladder ("A>B REQ", "B>A REP lost"), which the tests compare with the
// exchange they expect. Hooks drop, duplicate or delay MADs.

var (
	gidA = netip.MustParseAddr("::ffff:10.0.0.1")
	gidB = netip.MustParseAddr("::ffff:10.0.0.2")
	t0   = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
)

const (
	svc  = 0x0000000001061d1f // RDMA_PS_TCP port 7455
	qpnA = wire.QPN(0x11)
	qpnB = wire.QPN(0x22)
	psnA = wire.PSN(0x00a0a0)
	psnB = wire.PSN(0x00b0b0)
)

type peer struct {
	name   string
	gid    netip.Addr
	e      *Engine
	events []Event
}

// packet is a MAD in flight.
type packet struct {
	from, to *peer
	at       time.Time
	b        []byte
}

type verdict int

const (
	pass verdict = iota
	lose
	dup
)

type link struct {
	t      testing.TB
	now    time.Time
	peers  []*peer
	delay  time.Duration
	flight []packet
	ladder []string
	// hook decides the fate of each MAD put on the link; nil passes them all.
	hook func(from *peer, m mad.MAD) verdict
}

func newLink(t testing.TB, cfgs ...Config) (*link, *peer, *peer) {
	l := &link{t: t, now: t0, delay: time.Millisecond}
	for i, name := range []string{"A", "B"} {
		cfg := Config{LocalGID: []netip.Addr{gidA, gidB}[i], CAGUID: 0xA0A0 + uint64(i)*0x1010, Seed: uint64(i + 1)}
		if i < len(cfgs) {
			c := cfgs[i]
			c.LocalGID, c.CAGUID, c.Seed = cfg.LocalGID, cfg.CAGUID, cfg.Seed
			cfg = c
		}
		l.peers = append(l.peers, &peer{name: name, gid: cfg.LocalGID, e: NewEngine(cfg)})
	}
	return l, l.peers[0], l.peers[1]
}

func (l *link) peerAt(g netip.Addr) *peer {
	for _, p := range l.peers {
		if gidEqual(p.gid, g) {
			return p
		}
	}
	return nil
}

// rung names a MAD for the ladder.
func rung(m mad.MAD) string {
	h := m.Header()
	switch h.AttributeID() {
	case mad.AttrConnectRequest:
		return "REQ"
	case mad.AttrMRA:
		return "MRA " + m.MRA().MessageMRAed().String()
	case mad.AttrConnectReject:
		r := m.REJ()
		return fmt.Sprintf("REJ %s %s", r.MessageRejected(), r.Reason())
	case mad.AttrConnectReply:
		return "REP"
	case mad.AttrReadyToUse:
		return "RTU"
	case mad.AttrDisconnectRequest:
		return "DREQ"
	case mad.AttrDisconnectReply:
		return "DREP"
	case mad.AttrSIDRRequest:
		return "SIDR_REQ"
	case mad.AttrSIDRReply:
		return "SIDR_REP " + m.SIDRRep().Status().String()
	}
	return h.AttributeName()
}

// collect moves what the engines queued onto the link and their events into the peers' lists.
func (l *link) collect() {
	for _, p := range l.peers {
		for {
			to, b, ok := p.e.PollMAD(nil)
			if !ok {
				break
			}
			m, err := mad.ParseCM(b)
			if err != nil {
				l.t.Fatalf("%s sent a MAD that does not parse: %v", p.name, err)
			}
			dst := l.peerAt(to)
			name := "?"
			if dst != nil {
				name = dst.name
			}
			line := p.name + ">" + name + " " + rung(m)
			v := pass
			if l.hook != nil {
				v = l.hook(p, m)
			}
			switch {
			case dst == nil:
				line += " (nowhere)"
			case v == lose:
				line += " lost"
			default:
				l.flight = append(l.flight, packet{from: p, to: dst, at: l.now.Add(l.delay), b: b})
				if v == dup {
					line += " dup"
					l.flight = append(l.flight, packet{from: p, to: dst, at: l.now.Add(2 * l.delay), b: b})
				}
			}
			l.ladder = append(l.ladder, line)
		}
		for {
			ev, ok := p.e.PollEvent()
			if !ok {
				break
			}
			p.events = append(p.events, ev)
		}
	}
}

// next returns the earliest moment something happens: a delivery or a timer.
func (l *link) next() (time.Time, bool) {
	var d time.Time
	for _, pk := range l.flight {
		if d.IsZero() || pk.at.Before(d) {
			d = pk.at
		}
	}
	for _, p := range l.peers {
		if n := p.e.NextDeadline(); !n.IsZero() && (d.IsZero() || n.Before(d)) {
			d = n
		}
	}
	return d, !d.IsZero()
}

// run lets the network go until nothing is left to happen before now+d, then sets the clock to
// now+d.
func (l *link) run(d time.Duration) {
	end := l.now.Add(d)
	l.collect()
	for steps := 0; ; steps++ {
		if steps > 100000 {
			l.t.Fatal("the link does not settle")
		}
		n, ok := l.next()
		if !ok || n.After(end) {
			break
		}
		if n.After(l.now) {
			l.now = n
		}
		var due []packet
		l.flight = slices.DeleteFunc(l.flight, func(pk packet) bool {
			if !pk.at.After(l.now) {
				due = append(due, pk)
				return true
			}
			return false
		})
		for _, pk := range due {
			pk.to.e.HandleMAD(l.now, pk.from.gid, pk.b)
		}
		for _, p := range l.peers {
			p.e.Advance(l.now)
		}
		l.collect()
	}
	l.now = end
}

// settle runs the network for a moment: what is in flight arrives, no timer has fired yet.
func (l *link) settle() { l.run(100 * time.Millisecond) }

// inject hands b to p as if it came from the GID from, and collects what follows.
func (l *link) inject(p *peer, from netip.Addr, b []byte) {
	p.e.HandleMAD(l.now, from, b)
	l.collect()
}

// expectLadder compares the rungs since the last call with want.
func (l *link) expectLadder(want ...string) {
	l.t.Helper()
	if !slices.Equal(l.ladder, want) {
		l.t.Fatalf("ladder\n got: %s\nwant: %s", strings.Join(l.ladder, " | "), strings.Join(want, " | "))
	}
	l.ladder = nil
}

// expectEvents takes p's events since the last call and checks their kinds.
func (p *peer) expectEvents(t testing.TB, kinds ...EventKind) []Event {
	t.Helper()
	got := p.events
	p.events = nil
	var names []string
	for _, ev := range got {
		names = append(names, ev.Kind.String())
	}
	var want []string
	for _, k := range kinds {
		want = append(want, k.String())
	}
	if !slices.Equal(names, want) {
		t.Fatalf("%s events %v, want %v", p.name, names, want)
	}
	return got
}

// clean checks the invariants every test ends with: no transition refused, nothing stuck.
func (l *link) clean() {
	l.t.Helper()
	for _, p := range l.peers {
		if c := p.e.Counters(); c.TransitionErrors != 0 || c.DropEventQueueFull != 0 || c.BuildErrors != 0 {
			l.t.Errorf("%s: %d transition errors, %d events lost, %d build errors", p.name, c.TransitionErrors,
				c.DropEventQueueFull, c.BuildErrors)
		}
	}
}

// connectParams are A's usual REQ.
func connectParams(pd []byte) *ConnectParams {
	return &ConnectParams{ServiceID: svc, Peer: gidB, QPN: qpnA, StartingPSN: psnA, ResponderResources: 4,
		InitiatorDepth: 8, RetryCount: 7, RNRRetryCount: 6, PathMTU: wire.MTU1024, PrivateData: pd}
}

func acceptParams(pd []byte) *AcceptParams {
	return &AcceptParams{QPN: qpnB, StartingPSN: psnB, ResponderResources: 2, InitiatorDepth: 3, RNRRetryCount: 5,
		PrivateData: pd}
}

// establish runs a whole connection setup from A to B and returns both connection IDs.
func (l *link) establish() (ConnID, ConnID) {
	l.t.Helper()
	a, b := l.peers[0], l.peers[1]
	ida, err := a.e.Connect(l.now, connectParams(nil))
	if err != nil {
		l.t.Fatal(err)
	}
	l.settle()
	req := b.expectEvents(l.t, EventRequest)[0]
	if _, err := b.e.Accept(l.now, req.ID, acceptParams(nil)); err != nil {
		l.t.Fatal(err)
	}
	l.settle()
	a.expectEvents(l.t, EventReply)
	if err := a.e.Confirm(l.now, ida, nil); err != nil {
		l.t.Fatal(err)
	}
	l.settle()
	b.expectEvents(l.t, EventEstablished)
	l.expectLadder("A>B REQ", "B>A REP", "A>B RTU")
	return ida, req.ID
}

// rpingMADs returns the five CM MADs of testdata/rping-cm.txt: REQ, REP, RTU, DREQ, DREP.
func rpingMADs(t testing.TB) [][]byte {
	f, err := os.Open("testdata/rping-cm.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	s := bufio.NewScanner(f)
	s.Buffer(nil, 4096)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) != 4 || strings.HasPrefix(fs[0], "#") {
			continue
		}
		b, err := hex.DecodeString(fs[3])
		if err != nil || len(b) != mad.Len {
			t.Fatalf("testdata/rping-cm.txt: bad line %q", s.Text())
		}
		out = append(out, b)
	}
	if len(out) != 5 {
		t.Fatalf("testdata/rping-cm.txt holds %d MADs, want 5", len(out))
	}
	return out
}
