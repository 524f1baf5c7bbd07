package explain

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/capture"
)

// cmStory returns a connection's story in one string.
func cmStory(c *CMConn) string { return strings.Join(c.Story, "\n") }

// TestCMStoryRping: the CM exchange of rping between two rxe peers (REQ, REP, RTU, then DREQ and
// DREP at the end), told with the CMA header decoded and tied to the QPs' pair.
func TestCMStoryRping(t *testing.T) {
	pkts, err := ReadFile(wireTestdata + "/rping.pcap")
	if err != nil {
		t.Fatal(err)
	}
	a := Analyze(pkts)
	if len(a.CM) != 1 {
		t.Fatalf("%d CM connections, want 1", len(a.CM))
	}
	c := a.CM[0]
	s := cmStory(c)
	t.Logf("%v:\n%s", c, s)
	for _, want := range []string{
		"#1 REQ: 10.77.0.12 asks 10.77.0.11 for a connection to rdma_cm TCP port 7174 (service ID 0x1061c06): RC QP 0x000014, first PSN 0xf65fee, path MTU 1024",
		"rdma_cm header: from 10.77.0.12 port 58937 to 10.77.0.11 port 7174",
		"#2 REP: 10.77.0.11 accepts: its QP 0x000014, first PSN 0x42f96e",
		"#3 RTU: 10.77.0.12 confirms",
		"#124 DREQ: 10.77.0.12 disconnects", "#125 DREP: 10.77.0.11 agrees",
		"set up and torn down in full", "pair 2.",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("story lacks %q", want)
		}
	}
	if c.Pair == nil || c.Pair.ID != 2 || len(c.Frames) != 5 || strings.Contains(s, "more than once") {
		t.Errorf("pair %v, frames %v", c.Pair, c.Frames)
	}
	if e := a.Frame(2); len(e.Notes) != 1 || !strings.HasPrefix(e.Notes[0].Text, "REP: ") {
		t.Errorf("notes of the REP: %+v", e.Notes)
	}
}

// TestCMStoryGoroce: goroce's own CM traffic, captured by its Tracer: a connection whose first REQ is
// lost (resent after its timeout, the same transaction ID again), used and closed (DREQ, DREP), and a
// Dial to a port nobody listens on (REJ, invalid service ID).
func TestCMStoryGoroce(t *testing.T) {
	var buf bytes.Buffer
	cw, err := capture.NewWriter(&buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := cw.Tracer(nil)
	clock := goroce.NewManualClock(time.Unix(1e6, 0))
	net := goroce.NewMemNetwork()
	client, server := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	var mu sync.Mutex
	lostOne := false
	err = net.Impair(goroce.Impairment{Loss: 1, From: client, Dropped: func(b []byte, from, to netip.AddrPort) {
		mu.Lock()
		defer mu.Unlock()
		if !lostOne {
			tr.Lost(b, from, to)
			lostOne = true
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	open := func(a netip.Addr) *goroce.Device {
		d, err := goroce.Open(goroce.Config{Addr: a, Port: goroce.DefaultPort, Network: net, Tracer: tr, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := open(client), open(server)
	l, err := b.Listen(7471, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		c   *goroce.Conn
		err error
	}
	acc := make(chan result, 1)
	go func() { c, err := l.Accept(ctx); acc <- result{c, err} }()
	dialed := make(chan result, 1)
	go func() { c, err := a.Dial(ctx, "10.0.0.2:7471", nil); dialed <- result{c, err} }()
	// The first REQ is lost; the network then carries everything, and the client resends at its
	// timeout (about 8.6 s).
	for a.Stats().CM.Sent[0] == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := net.Impair(goroce.Impairment{}); err != nil {
		t.Fatal(err)
	}
	var d result
	for done := false; !done; {
		select {
		case d = <-dialed:
			done = true
		case <-time.After(time.Millisecond):
			clock.Advance(100 * time.Millisecond)
		}
	}
	if d.err != nil {
		t.Fatal(d.err)
	}
	s := <-acc
	if s.err != nil {
		t.Fatal(s.err)
	}
	if err := d.c.Close(); err != nil {
		t.Fatal(err)
	}
	<-s.c.Done()
	s.c.Close()
	_, err = a.Dial(ctx, "10.0.0.2:7472", nil)
	if !errors.Is(err, goroce.ErrConnRefused) {
		t.Fatalf("dial to a port nobody listens on: %v", err)
	}
	a.Close()
	b.Close()
	cw.Close()

	pkts, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	an := Analyze(pkts)
	if len(an.CM) != 2 {
		t.Fatalf("%d CM connections, want 2", len(an.CM))
	}
	c := an.CM[0]
	st := cmStory(c)
	t.Logf("%v:\n%s", c, st)
	for _, want := range []string{
		"REQ: 10.0.0.1 asks 10.0.0.2 for a connection to rdma_cm TCP port 7471", "rdma_cm header: from 10.0.0.1 port ",
		" to 10.0.0.2 port 7471", "REP: 10.0.0.2 accepts", "RTU: 10.0.0.1 confirms", "DREQ: 10.0.0.1 disconnects",
		"DREP: 10.0.0.2 agrees", "Sent more than once, as duplicates by transaction ID: the REQ twice (#1 and #",
		"set up and torn down in full",
	} {
		if !strings.Contains(st, want) {
			t.Errorf("story lacks %q", want)
		}
	}
	e := an.Frame(c.Frames[1])
	if len(e.Notes) < 1 || e.Notes[0].Kind != KindRetransmit || !strings.Contains(e.Notes[0].Text, "the same REQ again") ||
		!strings.Contains(e.Notes[0].Text, "no answer came in time") {
		t.Errorf("notes of the resent REQ: %+v", e.Notes)
	}
	if first := an.Frame(c.Frames[0]); len(first.Notes) < 2 || first.Notes[0].Kind != KindFate {
		t.Errorf("notes of the lost REQ: %+v", first.Notes)
	}
	rej := cmStory(an.CM[1])
	t.Logf("%v:\n%s", an.CM[1], rej)
	if !strings.Contains(rej, "REJ: 10.0.0.2 rejects the REQ: invalid-service-id(8): nobody listens") {
		t.Errorf("the rejection's story: %s", rej)
	}
}
