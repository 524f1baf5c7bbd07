package cm

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// TestConnectDisconnect is the whole life of a connection between two engines: REQ, REP, RTU, then A
// disconnects (DREQ, DREP), both sides wait out timewait and forget the connection. Each side's QP
// parameters are the other side's announcement.
func TestConnectDisconnect(t *testing.T) {
	l, a, b := newLink(t)
	cma := (&mad.CMAHeaderFields{SrcPort: 40000, SrcAddr: netip.MustParseAddr("10.0.0.1"),
		DstAddr: netip.MustParseAddr("10.0.0.2")}).Append(nil, []byte("hello"))
	b.e.Listen(svc, 0)
	ida, err := a.e.Connect(l.now, connectParams(cma))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := a.e.State(ida); s != StateReqSent {
		t.Fatalf("A in %v after Connect", s)
	}
	l.settle()
	l.expectLadder("A>B REQ")
	req := b.expectEvents(t, EventRequest)[0]
	wantReq := QPParams{Transport: mad.TransportRC, Peer: gidA, DestQPN: qpnA, SQPSN: psnA, PathMTU: wire.MTU1024,
		PKey: wire.DefaultPKey, HopLimit: DefaultHopLimit, Timeout: 19, RetryCount: 7, RNRRetry: 6, MaxRdAtomic: 4,
		MaxDestRdAtomic: 8}
	if req.QP != wantReq || req.ServiceID != svc || req.Peer != gidA || req.PeerCAGUID != 0xA0A0 {
		t.Fatalf("request %+v\nQP %+v\nwant %+v", req, req.QP, wantReq)
	}
	h, err := mad.ParseCMAHeader(req.PrivateData)
	if err != nil || h.SrcPort() != 40000 || string(req.PrivateData[mad.CMAHeaderLen:][:5]) != "hello" ||
		len(req.PrivateData) != mad.REQPrivateDataLen {
		t.Fatalf("request private data %x: %v", req.PrivateData, err)
	}

	qpB, err := b.e.Accept(l.now, req.ID, acceptParams([]byte("welcome")))
	if err != nil {
		t.Fatal(err)
	}
	// B's QP: sends from A's announced PSN, expects its own, issues at most A's responder resources.
	wantB := wantReq
	wantB.RQPSN, wantB.MaxRdAtomic, wantB.MaxDestRdAtomic = psnB, 3, 2
	if qpB != wantB {
		t.Fatalf("B's QP %+v\nwant %+v", qpB, wantB)
	}
	l.settle()
	l.expectLadder("B>A REP")
	rep := a.expectEvents(t, EventReply)[0]
	// A's QP: the mirror image, with the REP's RNR retry count and the ACK timeout from B's ACK delay.
	wantA := QPParams{Transport: mad.TransportRC, Peer: gidB, DestQPN: qpnB, SQPSN: psnB, RQPSN: psnA,
		PathMTU: wire.MTU1024, PKey: wire.DefaultPKey, HopLimit: DefaultHopLimit, Timeout: 19, RetryCount: 7,
		RNRRetry: 5, MaxRdAtomic: 2, MaxDestRdAtomic: 4}
	if rep.ID != ida || rep.QP != wantA || string(rep.PrivateData[:7]) != "welcome" {
		t.Fatalf("reply %+v\nQP %+v\nwant %+v", rep, rep.QP, wantA)
	}
	if err := a.e.Confirm(l.now, ida, nil); err != nil {
		t.Fatal(err)
	}
	l.settle()
	l.expectLadder("A>B RTU")
	b.expectEvents(t, EventEstablished)
	for _, p := range []*peer{a, b} {
		if p.e.Counters().Established != 1 || p.e.NextDeadline() != (time.Time{}) {
			t.Fatalf("%s: established %d, deadline %v", p.name, p.e.Counters().Established, p.e.NextDeadline())
		}
	}

	if err := a.e.Disconnect(l.now, ida, []byte("bye")); err != nil {
		t.Fatal(err)
	}
	l.settle()
	l.expectLadder("A>B DREQ", "B>A DREP")
	a.expectEvents(t, EventDisconnected)
	dis := b.expectEvents(t, EventDisconnected)[0]
	if !dis.Remote || string(dis.PrivateData[:3]) != "bye" {
		t.Fatalf("B's disconnect %+v", dis)
	}
	if s, _ := b.e.State(req.ID); s != StateTimewait {
		t.Fatalf("B in %v", s)
	}
	// Timewait lasts the QP's ACK timeout, 4.096 us * 2^19 = 2.15 s.
	l.run(Timeout(19) - 200*time.Millisecond)
	a.expectEvents(t)
	l.run(time.Second)
	a.expectEvents(t, EventTimewaitDone)
	b.expectEvents(t, EventTimewaitDone)
	l.expectLadder()
	if a.e.Len() != 0 || b.e.Len() != 0 {
		t.Fatalf("connections left: A %d, B %d", a.e.Len(), b.e.Len())
	}
	l.clean()
}

// TestPassiveDisconnects has the passive side end the connection.
func TestPassiveDisconnects(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	ida, idb := l.establish()
	if err := b.e.Disconnect(l.now, idb, nil); err != nil {
		t.Fatal(err)
	}
	l.settle()
	l.expectLadder("B>A DREQ", "A>B DREP")
	if ev := a.expectEvents(t, EventDisconnected)[0]; !ev.Remote || ev.ID != ida {
		t.Fatalf("A's event %+v", ev)
	}
	if ev := b.expectEvents(t, EventDisconnected)[0]; ev.Remote {
		t.Fatalf("B's event %+v", ev)
	}
	// Disconnecting again is a no-op; a connection in timewait takes no Confirm.
	if err := b.e.Disconnect(l.now, idb, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.e.Confirm(l.now, ida, nil); err != ErrState {
		t.Fatalf("Confirm in timewait: %v", err)
	}
	l.run(10 * time.Second)
	a.expectEvents(t, EventTimewaitDone)
	b.expectEvents(t, EventTimewaitDone)
	l.clean()
}

// TestSimultaneousDisconnect: both sides send a DREQ at once; each answers the other's and both report
// one disconnection.
func TestSimultaneousDisconnect(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	ida, idb := l.establish()
	a.e.Disconnect(l.now, ida, nil)
	b.e.Disconnect(l.now, idb, nil)
	l.settle()
	l.expectLadder("A>B DREQ", "B>A DREQ", "A>B DREP", "B>A DREP")
	a.expectEvents(t, EventDisconnected)
	b.expectEvents(t, EventDisconnected)
	l.run(10 * time.Second)
	a.expectEvents(t, EventTimewaitDone)
	b.expectEvents(t, EventTimewaitDone)
	if c := a.e.Counters(); c.DropState != 1 {
		// The DREP to A's own DREQ arrives in timewait and is dropped.
		t.Errorf("A dropped %d in the wrong state", c.DropState)
	}
	l.clean()
}

// TestRpingPassive feeds a passive engine the REQ, RTU and DREQ of a real rping client (rxe) and
// checks its answers against the server's REP and DREP in the same capture: the same bytes but for the
// server's communication ID, which is random.
func TestRpingPassive(t *testing.T) {
	mads := rpingMADs(t)
	client, server := netip.MustParseAddr("::ffff:10.77.0.12"), netip.MustParseAddr("10.77.0.11")
	e := NewEngine(Config{LocalGID: server, CAGUID: mad.MAD(mads[1]).REP().LocalCAGUID(), Seed: 7})
	e.Listen(mad.ServiceID(mad.PortSpaceTCP, 7174), 0)
	now := t0
	e.HandleMAD(now, client, mads[0])
	ev, ok := e.PollEvent()
	if !ok || ev.Kind != EventRequest {
		t.Fatalf("event %+v", ev)
	}
	want := QPParams{Transport: mad.TransportRC, Peer: client, DestQPN: 0x14, SQPSN: 0xf65fee, PathMTU: wire.MTU1024,
		PKey: wire.DefaultPKey, HopLimit: 64, FlowLabel: 785645, Timeout: 19, RetryCount: 7, RNRRetry: 7,
		MaxRdAtomic: 1, MaxDestRdAtomic: 1}
	if ev.QP != want {
		t.Fatalf("request QP %+v\nwant %+v", ev.QP, want)
	}
	h, err := mad.ParseCMAHeader(ev.PrivateData)
	if err != nil || h.DstAddr() != netip.MustParseAddr("10.77.0.11") {
		t.Fatalf("CMA header: %v", err)
	}
	// rping's server accepts with QP 0x14, PSN 0x42f96e, one READ each way, RNR retry 7.
	if _, err := e.Accept(now, ev.ID, &AcceptParams{QPN: 0x14, StartingPSN: 0x42f96e, ResponderResources: 1,
		InitiatorDepth: 1, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}
	to, rep, ok := e.PollMAD(nil)
	if !ok || to != client {
		t.Fatalf("REP to %v", to)
	}
	wantREP := bytes.Clone(mads[1])
	copy(wantREP[mad.HeaderLen:], be32b(uint32(ev.ID)))
	if !bytes.Equal(rep, wantREP) {
		t.Fatalf("REP\n got %x\nwant %x", rep, wantREP)
	}
	// The client's RTU and DREQ, addressed to our communication ID.
	rtu := bytes.Clone(mads[2])
	copy(rtu[mad.HeaderLen+4:], be32b(uint32(ev.ID)))
	e.HandleMAD(now, client, rtu)
	if ev, _ := e.PollEvent(); ev.Kind != EventEstablished {
		t.Fatalf("after RTU: %+v", ev)
	}
	dreq := bytes.Clone(mads[3])
	copy(dreq[mad.HeaderLen+4:], be32b(uint32(ev.ID)))
	e.HandleMAD(now, client, dreq)
	if ev, _ := e.PollEvent(); ev.Kind != EventDisconnected || !ev.Remote {
		t.Fatalf("after DREQ: %+v", ev)
	}
	_, drep, _ := e.PollMAD(nil)
	wantDREP := bytes.Clone(mads[4])
	copy(wantDREP[mad.HeaderLen:], be32b(uint32(ev.ID)))
	if !bytes.Equal(drep, wantDREP) {
		t.Fatalf("DREP\n got %x\nwant %x", drep, wantDREP)
	}
}

// TestRpingActive checks that an active engine given rping's parameters sends rping's REQ, byte for
// byte but for its communication and transaction IDs, and answers the server's REP with its RTU.
func TestRpingActive(t *testing.T) {
	mads := rpingMADs(t)
	client, server := netip.MustParseAddr("10.77.0.12"), netip.MustParseAddr("::ffff:10.77.0.11")
	capREQ := mad.MAD(mads[0]).REQ()
	e := NewEngine(Config{LocalGID: client, CAGUID: capREQ.LocalCAGUID(), Seed: 9})
	now := t0
	id, err := e.Connect(now, &ConnectParams{ServiceID: capREQ.ServiceID(), Peer: server, QPN: 0x14,
		StartingPSN: 0xf65fee, ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7,
		PathMTU: wire.MTU1024, FlowLabel: capREQ.PrimaryPath().FlowLabel, PrivateData: capREQ.PrivateData()})
	if err != nil {
		t.Fatal(err)
	}
	to, req, _ := e.PollMAD(nil)
	if to != server {
		t.Fatalf("REQ to %v", to)
	}
	tid := mad.MAD(req).Header().TransactionID()
	if uint32(tid) != uint32(id) {
		t.Errorf("transaction ID %#x does not end in the comm ID %#x (Linux cm_form_tid)", tid, id)
	}
	wantREQ := bytes.Clone(mads[0])
	copy(wantREQ[8:], be64b(tid))
	copy(wantREQ[mad.HeaderLen:], be32b(uint32(id)))
	if !bytes.Equal(req, wantREQ) {
		t.Fatalf("REQ\n got %x\nwant %x", req, wantREQ)
	}
	rep := bytes.Clone(mads[1])
	copy(rep[8:], be64b(tid))
	copy(rep[mad.HeaderLen+4:], be32b(uint32(id)))
	e.HandleMAD(now, server, rep)
	ev, _ := e.PollEvent()
	want := QPParams{Transport: mad.TransportRC, Peer: server, DestQPN: 0x14, SQPSN: 0x42f96e, RQPSN: 0xf65fee,
		PathMTU: wire.MTU1024, PKey: wire.DefaultPKey, HopLimit: 64, FlowLabel: 785645, Timeout: 19, RetryCount: 7,
		RNRRetry: 7, MaxRdAtomic: 1, MaxDestRdAtomic: 1}
	if ev.Kind != EventReply || ev.QP != want {
		t.Fatalf("reply %+v\nQP %+v\nwant %+v", ev, ev.QP, want)
	}
	if err := e.Confirm(now, id, nil); err != nil {
		t.Fatal(err)
	}
	_, rtu, _ := e.PollMAD(nil)
	wantRTU := bytes.Clone(mads[2])
	copy(wantRTU[8:], be64b(tid))
	copy(wantRTU[mad.HeaderLen:], be32b(uint32(id)))
	if !bytes.Equal(rtu, wantRTU) {
		t.Fatalf("RTU\n got %x\nwant %x", rtu, wantRTU)
	}
}

func be32b(v uint32) []byte { return []byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }
func be64b(v uint64) []byte { return append(be32b(uint32(v>>32)), be32b(uint32(v))...) }

func TestTimeout(t *testing.T) {
	for _, c := range []struct {
		code uint8
		want time.Duration
	}{{0, 4096 * time.Nanosecond}, {8, 1048576 * time.Nanosecond}, {18, 1073741824 * time.Nanosecond},
		{20, 4294967296 * time.Nanosecond}, {31, 4096 * time.Nanosecond << 31}, {40, 4096 * time.Nanosecond << 31}} {
		if got := Timeout(c.code); got != c.want {
			t.Errorf("Timeout(%d) = %v, want %v", c.code, got, c.want)
		}
	}
	// Linux cm_ack_timeout: the larger of the two, one more when the other is within one of it.
	for _, c := range []struct{ delay, life, want uint8 }{
		{15, 18, 19}, {18, 18, 20}, {20, 18, 21}, {25, 18, 25}, {0, 0, 2}, {31, 31, 31}, {3, 0, 3}, {2, 0, 3},
	} {
		if got := ACKTimeout(c.delay, c.life); got != c.want {
			t.Errorf("ACKTimeout(%d, %d) = %d, want %d", c.delay, c.life, got, c.want)
		}
	}
}
