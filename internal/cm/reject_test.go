package cm

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// REJ at every stage: a service nobody listens on, a refusing application, a path or transport the
// passive side cannot take, an active side that cannot use the REP, an owner too slow to answer, and a
// REJ that ends an established connection.

// rawREQ builds a REQ as A would send it, changed by mod.
func rawREQ(t testing.TB, mod func(f *mad.REQFields)) []byte {
	f := &mad.REQFields{LocalCommID: 0x1234, ServiceID: svc, LocalCAGUID: 0xA0A0, LocalQPN: qpnA,
		StartingPSN: psnA, RetryCount: 7, PKey: wire.DefaultPKey, PathMTU: wire.MTU1024, MaxCMRetries: 15,
		LocalCMResponseTimeout: 20, RemoteCMResponseTimeout: 20,
		Primary: mad.Path{LocalGID: gidA, RemoteGID: gidB, HopLimit: 64, LocalACKTimeout: 19}}
	if mod != nil {
		mod(f)
	}
	b, err := f.Append(nil, 0x77)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRejectNoListener(t *testing.T) {
	l, a, b := newLink(t)
	if _, err := a.e.Connect(l.now, connectParams(nil)); err != nil {
		t.Fatal(err)
	}
	l.settle()
	l.expectLadder("A>B REQ", "B>A REJ REQ invalid-service-id(8)")
	ev := a.expectEvents(t, EventRejected)[0]
	if ev.Reason != mad.RejInvalidServiceID {
		t.Fatalf("reason %v", ev.Reason)
	}
	if a.e.Len() != 0 || b.e.Len() != 0 {
		t.Fatalf("connections left: %d, %d", a.e.Len(), b.e.Len())
	}
	if c := b.e.Counters(); c.RejectsSent[mad.RejInvalidServiceID] != 1 {
		t.Errorf("B's REJ counters %v", c.RejectsSent)
	}
	if c := a.e.Counters(); c.RejectsRcvd[mad.RejInvalidServiceID] != 1 {
		t.Errorf("A's REJ counters %v", c.RejectsRcvd)
	}
	l.clean()
}

func TestConsumerReject(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	var rej mad.REJFields
	l.hook = func(_ *peer, m mad.MAD) verdict {
		if r := m.REJ(); r != nil {
			rej = r.Fields()
			rej.PrivateData = bytes.Clone(rej.PrivateData)
		}
		return pass
	}
	ida, _ := a.e.Connect(l.now, connectParams(nil))
	l.settle()
	req := b.expectEvents(t, EventRequest)[0]
	if err := b.e.Reject(l.now, req.ID, mad.RejConsumerReject, []byte("busy")); err != nil {
		t.Fatal(err)
	}
	l.settle()
	l.expectLadder("A>B REQ", "B>A REJ REQ consumer-reject(28)")
	ev := a.expectEvents(t, EventRejected)[0]
	if ev.ID != ida || ev.Reason != mad.RejConsumerReject || string(ev.PrivateData[:4]) != "busy" {
		t.Fatalf("A's event %+v", ev)
	}
	// Linux's REJ of a REQ it never answered leaves its own communication ID out.
	if rej.LocalCommID != 0 || rej.RemoteCommID != uint32(ida) {
		t.Errorf("REJ IDs %#x %#x", rej.LocalCommID, rej.RemoteCommID)
	}
	b.expectEvents(t)
	if _, err := b.e.Accept(l.now, req.ID, acceptParams(nil)); err != ErrUnknownConn {
		t.Errorf("Accept after Reject: %v", err)
	}
	if a.e.Len() != 0 || b.e.Len() != 0 {
		t.Fatalf("connections left: %d, %d", a.e.Len(), b.e.Len())
	}
	l.clean()
}

// TestRejectBadREQ: REQs the passive side cannot take, each answered with its chapter 12 reason.
func TestRejectBadREQ(t *testing.T) {
	for _, c := range []struct {
		name   string
		mod    func(f *mad.REQFields)
		reason string
		ari    []byte
	}{
		{"other GID", func(f *mad.REQFields) { f.Primary.RemoteGID = netip.MustParseAddr("::ffff:10.0.0.9") },
			"B>? REJ REQ invalid-gid(12)", gidB.AsSlice()},
		{"RD", func(f *mad.REQFields) { f.TransportServiceType = mad.TransportRD },
			"B>? REJ REQ invalid-transport-type(9)", nil},
		{"XRC", func(f *mad.REQFields) { f.TransportServiceType = mad.TransportExtended; f.ExtendedTransportType = 1 },
			"B>? REJ REQ invalid-transport-type(9)", nil},
		{"MTU 8192", func(f *mad.REQFields) { f.PathMTU = 6 }, "B>? REJ REQ invalid-mtu(26)", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, _, b := newLink(t)
			b.e.Listen(svc, 0)
			var ari []byte
			l.hook = func(_ *peer, m mad.MAD) verdict {
				if r := m.REJ(); r != nil {
					ari = bytes.Clone(r.ARI())
					if r.RemoteCommID() != 0x1234 || m.Header().TransactionID() != 0x77 {
						t.Errorf("REJ IDs %#x tid %#x", r.RemoteCommID(), m.Header().TransactionID())
					}
				}
				return pass
			}
			l.inject(b, netip.MustParseAddr("::ffff:10.0.0.3"), rawREQ(t, c.mod))
			l.expectLadder(c.reason + " (nowhere)")
			b.expectEvents(t)
			if !bytes.Equal(ari, c.ari) {
				t.Errorf("ARI %x, want %x", ari, c.ari)
			}
			if b.e.Len() != 0 {
				t.Errorf("B holds %d connections", b.e.Len())
			}
		})
	}
}

// TestActiveRejectsReply: the active side cannot use the REP (its QP would not connect) and rejects it.
// The passive side reports the REJ and forgets the connection, as Linux's cm_rej_handler does in
// REP_SENT (only a stale-connection REJ leads to timewait there).
func TestActiveRejectsReply(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	ida, _ := a.e.Connect(l.now, connectParams(nil))
	l.settle()
	req := b.expectEvents(t, EventRequest)[0]
	b.e.Accept(l.now, req.ID, acceptParams(nil))
	l.settle()
	a.expectEvents(t, EventReply)
	if err := a.e.Reject(l.now, ida, mad.RejConsumerReject, nil); err != nil {
		t.Fatal(err)
	}
	l.settle()
	l.expectLadder("A>B REQ", "B>A REP", "A>B REJ REP consumer-reject(28)")
	b.expectEvents(t, EventRejected)
	l.run(5 * time.Second)
	b.expectEvents(t)
	a.expectEvents(t)
	l.expectLadder()
	if a.e.Len() != 0 || b.e.Len() != 0 {
		t.Fatalf("connections left: %d, %d", a.e.Len(), b.e.Len())
	}
	l.clean()
}

// TestRejectEstablished: a REJ for an established connection ends it.
func TestRejectEstablished(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	ida, idb := l.establish()
	rej, _ := (&mad.REJFields{LocalCommID: uint32(idb), RemoteCommID: uint32(ida), MessageRejected: mad.MsgOther,
		Reason: mad.RejConsumerReject}).Append(nil, 1)
	l.inject(a, gidB, rej)
	ev := a.expectEvents(t, EventDisconnected)[0]
	if ev.Reason != mad.RejConsumerReject || !ev.Remote {
		t.Fatalf("event %+v", ev)
	}
	if s, _ := a.e.State(ida); s != StateTimewait {
		t.Fatalf("A in %v", s)
	}
	// The same REJ again is a duplicate.
	l.inject(a, gidB, rej)
	a.expectEvents(t)
	if c := a.e.Counters(); c.Duplicates[attrIndex(mad.AttrConnectReject)] != 1 {
		t.Errorf("duplicates %v", c.Duplicates)
	}
	l.clean()
}

// TestOwnerTooSlowPassive: B's owner never answers. A's resent REQ gets an MRA, so A waits; when
// Config.OwnerTimeout passes, B rejects with reason timeout.
func TestOwnerTooSlowPassive(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	a.e.Connect(l.now, connectParams(nil))
	l.run(DefaultOwnerTimeout + time.Second)
	l.expectLadder("A>B REQ", "A>B REQ", "B>A MRA REQ", "B>A REJ REQ timeout(4)")
	if ev := a.expectEvents(t, EventRejected)[0]; ev.Reason != mad.RejTimeout || len(ev.ARI) != 8 {
		t.Fatalf("A's event %+v", ev)
	}
	b.expectEvents(t, EventRequest, EventUnreachable)
	if a.e.Len() != 0 || b.e.Len() != 0 {
		t.Fatalf("connections left: %d, %d", a.e.Len(), b.e.Len())
	}
	l.clean()
}

// TestOwnerTooSlowActive: A's owner never confirms the REP. B's resent REP gets an MRA; when
// Config.OwnerTimeout passes, A rejects the REP with reason timeout.
func TestOwnerTooSlowActive(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	a.e.Connect(l.now, connectParams(nil))
	l.run(time.Millisecond)
	req := b.expectEvents(t, EventRequest)[0]
	b.e.Accept(l.now, req.ID, acceptParams(nil))
	l.run(DefaultOwnerTimeout + time.Second)
	l.expectLadder("A>B REQ", "B>A REP", "B>A REP", "A>B MRA REP", "A>B REJ REP timeout(4)")
	a.expectEvents(t, EventReply, EventUnreachable)
	if ev := b.expectEvents(t, EventRejected)[0]; ev.Reason != mad.RejTimeout {
		t.Fatalf("B's event %+v", ev)
	}
	l.run(time.Minute)
	if a.e.Len() != 0 || b.e.Len() != 0 {
		t.Fatalf("connections left: %d, %d", a.e.Len(), b.e.Len())
	}
	l.clean()
}

// TestOwnerCallsInWrongState: the owner's calls check the state and their parameters.
func TestOwnerCallsInWrongState(t *testing.T) {
	l, a, b := newLink(t)
	b.e.Listen(svc, 0)
	if err := b.e.Listen(svc, 0); err != ErrServiceInUse {
		t.Errorf("second Listen: %v", err)
	}
	ida, _ := a.e.Connect(l.now, connectParams(nil))
	for _, err := range []error{
		a.e.Confirm(l.now, ida, nil),
		a.e.Disconnect(l.now, ida, nil),
		a.e.Establish(l.now, ida),
		a.e.AnswerSIDR(l.now, ida, &SIDRAnswer{}),
	} {
		if err != ErrState {
			t.Errorf("call in REQ_SENT: %v", err)
		}
	}
	if _, err := a.e.Accept(l.now, ida, acceptParams(nil)); err != ErrState {
		t.Errorf("Accept on the active side: %v", err)
	}
	if err := a.e.Confirm(l.now, 12345, nil); err != ErrUnknownConn {
		t.Errorf("unknown ID: %v", err)
	}
	for _, p := range []*ConnectParams{
		{Peer: gidB, QPN: qpnA, PathMTU: 0},
		{Peer: gidB, QPN: 1, PathMTU: wire.MTU1024},
		{Peer: netip.Addr{}, QPN: qpnA, PathMTU: wire.MTU1024},
		{Peer: gidB, QPN: qpnA, PathMTU: wire.MTU1024, Transport: mad.TransportRD},
		{Peer: gidB, QPN: qpnA, PathMTU: wire.MTU1024, PrivateData: make([]byte, 93)},
		{Peer: gidB, QPN: qpnA, PathMTU: wire.MTU1024, RNRRetryCount: 8},
	} {
		if _, err := a.e.Connect(l.now, p); err != ErrBadParam {
			t.Errorf("Connect(%+v): %v", p, err)
		}
	}
	l.settle()
	req := b.expectEvents(t, EventRequest)[0]
	if _, err := b.e.Accept(l.now, req.ID, &AcceptParams{QPN: qpnB, PrivateData: make([]byte, 197)}); err != ErrBadParam {
		t.Errorf("Accept with 197 bytes: %v", err)
	}
	if err := b.e.Reject(l.now, req.ID, mad.RejConsumerReject, make([]byte, 149)); err != ErrBadParam {
		t.Errorf("Reject with 149 bytes: %v", err)
	}
	l.clean()
}
