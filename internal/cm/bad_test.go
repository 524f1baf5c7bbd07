package cm

import (
	"bytes"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// Bad input: malformed MADs, messages of connections that do not exist, floods of requests. Each is
// answered as chapter 12 says or dropped and counted; none panics, none grows a queue without bound.

func TestMalformed(t *testing.T) {
	good := rawREQ(t, nil)
	mod := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	lap, _ := mad.AppendCM(nil, 1, &mad.RTUFields{})
	lap[17] = byte(mad.AttrLoadAlternatePath)
	apr := bytes.Clone(lap)
	apr[17] = byte(mad.AttrAlternatePathResp)
	e := NewEngine(Config{})
	e.Listen(svc, 0)
	for _, c := range []struct {
		name    string
		b       []byte
		counter func(c *Counters) uint64
	}{
		{"empty", nil, func(c *Counters) uint64 { return c.DropMalformed }},
		{"header only", good[:mad.HeaderLen], func(c *Counters) uint64 { return c.DropMalformed }},
		{"255 bytes", good[:mad.Len-1], func(c *Counters) uint64 { return c.DropMalformed }},
		{"base version 2", mod(func(b []byte) { b[0] = 2 }), func(c *Counters) uint64 { return c.DropMalformed }},
		{"SA class", mod(func(b []byte) { b[1] = byte(mad.ClassSubnAdm) }), func(c *Counters) uint64 { return c.DropNotCM }},
		{"GetResp", mod(func(b []byte) { b[3] = byte(mad.MethodGetResp) }), func(c *Counters) uint64 { return c.DropNotCM }},
		{"class version 1", mod(func(b []byte) { b[2] = 1 }), func(c *Counters) uint64 { return c.DropClassVersion }},
		{"ClassPortInfo", mod(func(b []byte) { b[17] = 1 }), func(c *Counters) uint64 { return c.DropUnknownAttribute }},
		{"attribute 0x00FF", mod(func(b []byte) { b[17] = 0xFF }), func(c *Counters) uint64 { return c.DropUnknownAttribute }},
		{"LAP", lap, func(c *Counters) uint64 { return c.DropUnsupported }},
		{"APR", apr, func(c *Counters) uint64 { return c.DropUnsupported }},
	} {
		before := e.Counters()
		e.HandleMAD(t0, gidA, c.b)
		after := e.Counters()
		if c.counter(&after) != c.counter(&before)+1 || after.Dropped != before.Dropped+1 {
			t.Errorf("%s: not counted", c.name)
		}
		if _, _, ok := e.PollMAD(nil); ok {
			t.Errorf("%s: answered", c.name)
		}
		if _, ok := e.PollEvent(); ok {
			t.Errorf("%s: reported", c.name)
		}
	}
	// A MAD longer than 256 bytes (a UD payload with padding) is the MAD and its first 256 bytes.
	e.HandleMAD(t0, gidA, append(bytes.Clone(good), 1, 2, 3, 4))
	if ev, ok := e.PollEvent(); !ok || ev.Kind != EventRequest {
		t.Errorf("long MAD: %+v", ev)
	}
}

// TestUnknownConnection: messages for connections the engine does not hold.
func TestUnknownConnection(t *testing.T) {
	l, _, b := newLink(t)
	build := func(m mad.Message) []byte {
		out, err := mad.AppendCM(nil, 0x99, m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// A REP for no REQ of ours: REJ invalid communication ID, so that its sender stops resending.
	var rej mad.REJFields
	l.hook = func(_ *peer, m mad.MAD) verdict {
		if r := m.REJ(); r != nil {
			rej = r.Fields()
		}
		return pass
	}
	l.inject(b, gidA, build(&mad.REPFields{LocalCommID: 0xAAAA, RemoteCommID: 0xBBBB, LocalQPN: qpnA}))
	l.expectLadder("B>A REJ REP invalid-comm-id(6)")
	if rej.LocalCommID != 0xBBBB || rej.RemoteCommID != 0xAAAA {
		t.Errorf("REJ IDs %#x %#x", rej.LocalCommID, rej.RemoteCommID)
	}
	// A DREQ: DREP, since the peer may have lost ours after we forgot the connection.
	l.inject(b, gidA, build(&mad.DREQFields{LocalCommID: 0xAAAA, RemoteCommID: 0xBBBB, RemoteQPN: qpnB}))
	l.expectLadder("B>A DREP")
	// The rest are dropped.
	for _, m := range []mad.Message{
		&mad.RTUFields{LocalCommID: 0xAAAA, RemoteCommID: 0xBBBB},
		&mad.DREPFields{LocalCommID: 0xAAAA, RemoteCommID: 0xBBBB},
		&mad.MRAFields{LocalCommID: 0xAAAA, RemoteCommID: 0xBBBB},
		&mad.MRAFields{LocalCommID: 0xAAAA, RemoteCommID: 0xBBBB, MessageMRAed: mad.MsgREP},
		&mad.REJFields{LocalCommID: 0xAAAA, RemoteCommID: 0xBBBB, Reason: mad.RejConsumerReject},
		&mad.REJFields{LocalCommID: 0xAAAA, RemoteCommID: 0xBBBB, Reason: mad.RejTimeout, ARI: make([]byte, 8)},
		&mad.SIDRRepFields{RequestID: 0xBBBB},
	} {
		l.inject(b, gidA, build(m))
	}
	l.expectLadder()
	c := b.e.Counters()
	if c.DropUnknownConn != 7 || c.UnknownAnswered != 2 || b.e.Len() != 0 {
		t.Errorf("dropped %d, answered %d, %d connections", c.DropUnknownConn, c.UnknownAnswered, b.e.Len())
	}
	b.expectEvents(t)
	l.clean()
}

// TestWrongIDs: messages naming one of our connections but the wrong peer ID or QP are dropped.
func TestWrongIDs(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	ida, idb := l.establish()
	build := func(m mad.Message) []byte {
		out, _ := mad.AppendCM(nil, 1, m)
		return out
	}
	l.inject(a, gidB, build(&mad.DREQFields{LocalCommID: uint32(idb) + 1, RemoteCommID: uint32(ida), RemoteQPN: qpnA}))
	l.expectLadder("A>B DREP") // a DREQ of no connection we know: answered, the connection stays
	l.inject(a, gidB, build(&mad.DREQFields{LocalCommID: uint32(idb), RemoteCommID: uint32(ida), RemoteQPN: qpnA + 1}))
	l.inject(a, gidB, build(&mad.REJFields{LocalCommID: uint32(idb) + 1, RemoteCommID: uint32(ida)}))
	l.inject(b, gidA, build(&mad.RTUFields{LocalCommID: uint32(ida) + 1, RemoteCommID: uint32(idb)}))
	l.expectLadder()
	if s, _ := a.e.State(ida); s != StateEstablished {
		t.Fatalf("A in %v", s)
	}
	if c := a.e.Counters(); c.DropQPN != 1 || c.DropUnknownConn != 1 {
		t.Errorf("A dropped QPN %d, unknown %d", c.DropQPN, c.DropUnknownConn)
	}
	a.expectEvents(t)
	b.expectEvents(t)
	l.clean()
}

// TestREQFlood: REQs from many connections at once. A listener takes as many as its backlog; beyond
// that they are dropped for their senders to retry. With the backlog wide open, the connection table
// is the bound. Nothing is sent for the dropped ones and no queue grows.
func TestREQFlood(t *testing.T) {
	e := NewEngine(Config{MaxConns: 8, LocalGID: gidB})
	e.Listen(svc, 4)
	e.Listen(svc+1, 100)
	flood := func(service uint64, n int, base uint32) {
		for i := range n {
			e.HandleMAD(t0, gidA, rawREQ(t, func(f *mad.REQFields) {
				f.ServiceID = service
				f.LocalCommID = base + uint32(i)
				f.LocalQPN = wire.QPN(base + uint32(i))
			}))
		}
	}
	flood(svc, 20, 1000)
	if c := e.Counters(); c.DropBacklog != 16 || e.Len() != 4 {
		t.Fatalf("backlog drops %d, %d connections", c.DropBacklog, e.Len())
	}
	flood(svc+1, 20, 2000)
	if c := e.Counters(); c.DropConnTable != 16 || e.Len() != 8 {
		t.Fatalf("table drops %d, %d connections", c.DropConnTable, e.Len())
	}
	var ids []ConnID
	for {
		ev, ok := e.PollEvent()
		if !ok {
			break
		}
		ids = append(ids, ev.ID)
	}
	if len(ids) != 8 {
		t.Fatalf("%d requests reported, want 8", len(ids))
	}
	if _, _, ok := e.PollMAD(nil); ok {
		t.Fatal("the flood was answered")
	}
	if _, err := e.Connect(t0, connectParams(nil)); err != ErrTooManyConns {
		t.Fatalf("Connect with a full table: %v", err)
	}
	// Rejecting the requests makes room again.
	for _, id := range ids {
		if err := e.Reject(t0, id, mad.RejConsumerReject, nil); err != nil {
			t.Fatal(err)
		}
	}
	if e.Len() != 0 {
		t.Fatalf("%d connections after rejecting all", e.Len())
	}
	flood(svc, 5, 3000)
	if e.Len() != 4 {
		t.Fatalf("%d connections after the backlog emptied", e.Len())
	}
	if c := e.Counters(); c.TransitionErrors != 0 || c.DropTxQueueFull != 0 {
		t.Errorf("counters %+v", c)
	}
}

// TestTxQueueBound: an owner that never drains the outgoing queue loses MADs, counted, and the queue
// stays at its bound.
func TestTxQueueBound(t *testing.T) {
	e := NewEngine(Config{MaxConns: 4})
	for i := range 200 {
		e.HandleMAD(t0, gidA, rawREQ(t, func(f *mad.REQFields) { f.LocalCommID = uint32(i + 1) }))
	}
	c := e.Counters()
	if e.tx.n != 4+txSlack || c.DropTxQueueFull != 200-(4+txSlack) {
		t.Fatalf("queue %d, dropped %d", e.tx.n, c.DropTxQueueFull)
	}
	n := 0
	for {
		if _, _, ok := e.PollMAD(nil); !ok {
			break
		}
		n++
	}
	if n != 4+txSlack {
		t.Fatalf("drained %d", n)
	}
}

// TestPollMADAllocs: draining the outgoing queue into a buffer with room allocates nothing.
func TestPollMADAllocs(t *testing.T) {
	e := NewEngine(Config{})
	buf := make([]byte, 0, mad.Len)
	req := rawREQ(t, nil)
	n := testing.AllocsPerRun(100, func() {
		e.HandleMAD(t0, gidA, req) // no listener: a REJ, no connection
		if _, _, ok := e.PollMAD(buf[:0]); !ok {
			t.Fatal("no REJ")
		}
	})
	if n != 0 {
		t.Errorf("REJ of an unknown service and its poll allocate %v times", n)
	}
}

// FuzzEngine feeds a pair of engines arbitrary MADs and time steps: a passive engine listening, and an
// active one with a connection under way. Nothing panics, no transition is refused, and the engines
// stay within their bounds.
func FuzzEngine(f *testing.F) {
	for _, b := range rpingMADs(f) {
		f.Add(b, uint8(1))
	}
	f.Add(rawREQ(f, nil), uint8(0))
	for _, m := range []mad.Message{
		&mad.REPFields{RemoteCommID: 1}, &mad.RTUFields{}, &mad.DREQFields{}, &mad.DREPFields{},
		&mad.MRAFields{}, &mad.REJFields{Reason: mad.RejTimeout, ARI: make([]byte, 8)},
		&mad.SIDRReqFields{ServiceID: svc}, &mad.SIDRRepFields{},
	} {
		b, _ := mad.AppendCM(nil, 1, m)
		f.Add(b, uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		active := NewEngine(Config{MaxConns: 4, LocalGID: gidA, CAGUID: 0xA0A0, Seed: 1})
		passive := NewEngine(Config{MaxConns: 4, LocalGID: gidB, CAGUID: 0xB0B0, Seed: 2})
		passive.Listen(svc, 2)
		passive.Listen(mad.ServiceID(mad.PortSpaceTCP, 7174), 2)
		id, err := active.Connect(t0, connectParams(nil))
		if err != nil {
			t.Fatal(err)
		}
		now := t0
		// Each 256-byte piece of data is a MAD to both engines; a short tail is a malformed one. The
		// active engine's MADs get the connection's ID patched in so that they reach its state.
		for len(data) > 0 {
			n := min(len(data), mad.Len)
			piece := data[:n]
			data = data[n:]
			passive.HandleMAD(now, gidA, piece)
			if n == mad.Len {
				p := bytes.Clone(piece)
				copy(p[mad.HeaderLen+4:], be32b(uint32(id)))
				active.HandleMAD(now, gidB, p)
			}
			now = now.Add(time.Duration(step) * 100 * time.Millisecond)
			for _, e := range []*Engine{active, passive} {
				e.Advance(now)
				for {
					ev, ok := e.PollEvent()
					if !ok {
						break
					}
					answer(e, now, ev)
				}
				for {
					if _, _, ok := e.PollMAD(nil); !ok {
						break
					}
				}
			}
		}
		for _, e := range []*Engine{active, passive} {
			c := e.Counters()
			if c.TransitionErrors != 0 || c.DropEventQueueFull != 0 || e.Len() > 4 {
				t.Fatalf("transition errors %d, events lost %d, %d connections", c.TransitionErrors,
					c.DropEventQueueFull, e.Len())
			}
		}
		// Given time, every connection ends; established ones once their owner gives them up.
		for _, e := range []*Engine{active, passive} {
			for id := range e.conns {
				e.Abort(now, id)
			}
		}
		for range 200 {
			now = now.Add(time.Minute)
			for _, e := range []*Engine{active, passive} {
				e.Advance(now)
				for {
					if _, ok := e.PollEvent(); !ok {
						break
					}
				}
				for {
					if _, _, ok := e.PollMAD(nil); !ok {
						break
					}
				}
			}
		}
		if active.Len() != 0 || passive.Len() != 0 {
			t.Fatalf("connections never ended: %d, %d", active.Len(), passive.Len())
		}
	})
}

// answer is an owner that says yes to everything.
func answer(e *Engine, now time.Time, ev Event) {
	switch ev.Kind {
	case EventRequest:
		e.Accept(now, ev.ID, acceptParams(nil))
	case EventReply:
		e.Confirm(now, ev.ID, nil)
	case EventSIDRRequest:
		e.AnswerSIDR(now, ev.ID, &SIDRAnswer{QPN: qpnB, QKey: 0x01234567})
	}
}

// TestREQReservedQPN: a REQ naming QP0 or QP1 as its QP is dropped and counted before any state: no
// answer, no event, no connection; the same REQ with an ordinary QPN reaches the owner.
func TestREQReservedQPN(t *testing.T) {
	e := NewEngine(Config{LocalGID: gidB})
	e.Listen(svc, 0)
	for _, qpn := range []wire.QPN{0, 1} {
		e.HandleMAD(t0, gidA, rawREQ(t, func(f *mad.REQFields) { f.LocalQPN = qpn }))
		if _, _, ok := e.PollMAD(nil); ok {
			t.Errorf("QPN %d: answered", qpn)
		}
		if ev, ok := e.PollEvent(); ok {
			t.Errorf("QPN %d: reported %+v", qpn, ev)
		}
		if e.Len() != 0 {
			t.Errorf("QPN %d: %d connections", qpn, e.Len())
		}
	}
	if c := e.Counters(); c.DropReservedQPN != 2 || c.Dropped != 2 {
		t.Errorf("reserved QPN drops %d, dropped %d; want 2, 2", c.DropReservedQPN, c.Dropped)
	}
	e.HandleMAD(t0, gidA, rawREQ(t, func(f *mad.REQFields) { f.LocalQPN = 2 }))
	if ev, ok := e.PollEvent(); !ok || ev.Kind != EventRequest || ev.QP.DestQPN != 2 {
		t.Errorf("QPN 2: %+v", ev)
	}
}

// TestREPReservedQPN: a REP naming QP0 or QP1 as the passive side's QP is dropped and counted, and the
// connection waits on in REQ sent; a REP with an ordinary QPN then reaches the owner.
func TestREPReservedQPN(t *testing.T) {
	e := NewEngine(Config{LocalGID: gidA})
	id, err := e.Connect(t0, connectParams(nil))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, _, ok := e.PollMAD(nil); !ok {
			break
		}
	}
	rep := func(qpn wire.QPN) []byte {
		f := &mad.REPFields{LocalCommID: 0xBBBB, RemoteCommID: uint32(id), LocalCAGUID: 0xB0B0, LocalQPN: qpn,
			StartingPSN: psnB, ResponderResources: 1, InitiatorDepth: 1, TargetACKDelay: 15, RNRRetryCount: 7}
		b, err := mad.AppendCM(nil, 0x99, f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, qpn := range []wire.QPN{0, 1} {
		e.HandleMAD(t0, gidB, rep(qpn))
		if ev, ok := e.PollEvent(); ok {
			t.Errorf("QPN %d: reported %+v", qpn, ev)
		}
		if _, _, ok := e.PollMAD(nil); ok {
			t.Errorf("QPN %d: answered", qpn)
		}
	}
	if c := e.Counters(); c.DropReservedQPN != 2 || e.Len() != 1 {
		t.Errorf("reserved QPN drops %d, connections %d; want 2, 1", c.DropReservedQPN, e.Len())
	}
	e.HandleMAD(t0, gidB, rep(qpnB))
	if ev, ok := e.PollEvent(); !ok || ev.Kind != EventReply || ev.QP.DestQPN != qpnB {
		t.Errorf("QPN %v: %+v", qpnB, ev)
	}
}
