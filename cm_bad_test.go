package goroce

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// Bad input on the device's CM receive path: MADs handed to the device's CM as the datapath hands it
// QP1's (handleMAD), past the engine (whose own bad-input tests and fuzz target are internal/cm's)
// into what the device does with them: rdma_cm's header, the listener's queue, the QP connected with
// what a peer's REQ says. Nothing panics; every queue stays bounded; every MAD is counted.

var (
	badPeer = netip.MustParseAddr("10.0.0.9")
	badSelf = netip.MustParseAddr("10.0.0.2")
)

const badPort = 7471

// badDevice is a device on a manual clock with a listener on badPort of the given backlog.
func badDevice(t testing.TB, backlog int) (*Device, *Listener, *ManualClock) {
	t.Helper()
	clock := NewManualClock(time.Unix(1e6, 0))
	d, err := Open(Config{Addr: badSelf, Port: DefaultPort, Network: NewMemNetwork(), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	o := DefaultCMOptions()
	o.Backlog = backlog
	l, err := d.Listen(badPort, &o)
	if err != nil {
		t.Fatal(err)
	}
	return d, l, clock
}

// badREQ is an rdma_cm REQ from badPeer for badPort, changed by mod.
func badREQ(t testing.TB, commID uint32, mod func(f *mad.REQFields)) []byte {
	t.Helper()
	hdr := mad.CMAHeaderFields{SrcPort: 40000, SrcAddr: badPeer, DstAddr: badSelf}
	f := &mad.REQFields{LocalCommID: commID, ServiceID: mad.ServiceID(mad.PortSpaceTCP, badPort), LocalCAGUID: 0x9999,
		LocalQPN: 0x100 + wire.QPN(commID&0xFFFF), StartingPSN: 1, RetryCount: 7, RNRRetryCount: 7, PKey: wire.DefaultPKey,
		PathMTU: wire.MTU1024, MaxCMRetries: 15, LocalCMResponseTimeout: 20, RemoteCMResponseTimeout: 20,
		ResponderResources: 1, InitiatorDepth: 1, PrivateData: hdr.Append(nil, nil),
		Primary: mad.Path{LocalGID: badPeer, RemoteGID: badSelf, HopLimit: 64, LocalACKTimeout: 19}}
	if mod != nil {
		mod(f)
	}
	b, err := f.Append(nil, uint64(commID))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (d *Device) feedMAD(b []byte) {
	d.cm.handleMAD(netip.AddrPortFrom(badPeer, DefaultPort), b, d.clock.Now())
}

// TestCMBadCMAHeader: a REQ for a listener without rdma_cm's header (or with a version or IP version
// rdma_cm does not write) is rejected (consumer reject) and counted, and reaches no program.
func TestCMBadCMAHeader(t *testing.T) {
	d, l, _ := badDevice(t, 4)
	for i, mod := range []func(f *mad.REQFields){
		func(f *mad.REQFields) { f.PrivateData = nil },
		func(f *mad.REQFields) { f.PrivateData[0] = 1 },    // CMA version 1
		func(f *mad.REQFields) { f.PrivateData[1] = 0x50 }, // IP version 5
	} {
		d.feedMAD(badREQ(t, uint32(i+1), mod))
	}
	st := d.Stats().CM
	if st.BadCMAHeader != 3 || st.RejectsSent[RejectConsumer] != 3 || st.Rcvd[0] != 3 {
		t.Errorf("bad CMA headers %d, consumer REJs %d, REQs %d; want 3 each", st.BadCMAHeader, st.RejectsSent[RejectConsumer], st.Rcvd[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if r, err := l.Request(ctx); err == nil {
		t.Errorf("a request without rdma_cm's header reached the listener: %+v", r)
	}
}

// TestCMBadREQValues: REQs whose path MTU the QP cannot take (a code beyond 4096, or 0) are refused
// before any program sees them.
func TestCMBadREQValues(t *testing.T) {
	d, l, _ := badDevice(t, 4)
	for i, mod := range []func(f *mad.REQFields){
		func(f *mad.REQFields) { f.PathMTU = 7 },
		func(f *mad.REQFields) { f.PathMTU = 0 },
	} {
		d.feedMAD(badREQ(t, uint32(i+1), mod))
	}
	// Whatever the engine decided for each, a request that reaches the listener must be acceptable.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		r, err := l.Request(ctx)
		cancel()
		if err != nil {
			break
		}
		t.Errorf("REQ with path MTU %v and QPN %v reached the listener", r.PathMTU(), r.qp.DestQPN)
		_ = r.Reject(nil)
	}
	st := d.Stats().CM
	var rejs uint64
	for _, n := range st.RejectsSent {
		rejs += n
	}
	if st.Received != 2 || rejs+st.Dropped != 2 {
		t.Errorf("2 bad REQs: %d received, %d rejected, %d dropped", st.Received, rejs, st.Dropped)
	}
}

// TestCMREQFloodDevice: a thousand REQs from one peer with distinct IDs to a listener of backlog 4
// that nobody serves: the listener holds 4, the engine at most its connection table, and the rest
// are dropped or rejected and counted. After the CM's minute of waiting for the program, the held
// requests are rejected (timeout) and nothing is left.
func TestCMREQFloodDevice(t *testing.T) {
	const n, backlog = 1000, 4
	d, l, clock := badDevice(t, backlog)
	for i := range n {
		d.feedMAD(badREQ(t, uint32(i+1), nil))
	}
	m := d.cm
	m.mu.Lock()
	held, conns := len(m.reqs), m.eng.Len()
	m.mu.Unlock()
	if held > backlog || len(l.q.reqs) > backlog || conns > 256 {
		t.Fatalf("%d requests held for the listener (%d queued), %d in the engine", held, len(l.q.reqs), conns)
	}
	st := d.Stats().CM
	if st.Received != n || st.Rcvd[0] != n {
		t.Errorf("received %d, REQs %d; want %d", st.Received, st.Rcvd[0], n)
	}
	var rejs uint64
	for _, v := range st.RejectsSent {
		rejs += v
	}
	if uint64(held)+rejs+st.DropBacklog+st.DropConnTable < n {
		t.Errorf("%d held + %d rejected + %d beyond the backlog + %d beyond the table < %d", held, rejs, st.DropBacklog, st.DropConnTable, n)
	}
	// The timer goroutine runs the engine as the clock moves; give it real time too.
	for i := 0; ; i++ {
		clock.Advance(time.Minute)
		time.Sleep(time.Millisecond)
		m.mu.Lock()
		held, conns = len(m.reqs), m.eng.Len()
		m.mu.Unlock()
		if held == 0 && conns == 0 {
			break
		}
		if i == 2000 {
			t.Fatalf("after %d minutes: %d requests held, %d connections in the engine", i, held, conns)
		}
	}
	// The stale requests queued are skipped: Accept finds none.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if c, err := l.Accept(ctx); err == nil {
		t.Errorf("accepted a request that timed out: %v", c.RemoteAddr())
	}
}

// FuzzCMReceive feeds a device's CM arbitrary MADs from a peer, as QP1 delivers them, with a
// listener whose requests are accepted, rejected or left alone in turn, and time passing: nothing
// panics, the listener's queue and the engine stay within their bounds, and every MAD is counted.
func FuzzCMReceive(f *testing.F) {
	req := badREQ(f, 1, nil)
	f.Add(req, uint8(0))
	f.Add(append(bytes.Clone(req), badREQ(f, 2, func(f *mad.REQFields) { f.PathMTU = 5 })...), uint8(1))
	f.Add(badREQ(f, 3, func(f *mad.REQFields) { f.PrivateData = nil }), uint8(2))
	for _, m := range []mad.Message{
		&mad.REPFields{RemoteCommID: 1}, &mad.RTUFields{RemoteCommID: 1}, &mad.DREQFields{}, &mad.DREPFields{},
		&mad.MRAFields{}, &mad.REJFields{Reason: mad.RejTimeout, ARI: make([]byte, 8)},
		&mad.SIDRReqFields{ServiceID: mad.ServiceID(mad.PortSpaceUDP, badPort)}, &mad.SIDRRepFields{},
	} {
		b, _ := mad.AppendCM(nil, 1, m)
		f.Add(append(bytes.Clone(req), b...), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		const backlog = 2
		d, l, clock := badDevice(t, backlog)
		fed := uint64(0)
		answered := 0
		for len(data) > 0 {
			n := min(len(data), mad.Len)
			d.feedMAD(data[:n])
			data = data[n:]
			fed++
			clock.Advance(time.Duration(step) * 10 * time.Millisecond)
			// Answer what the listener holds: accept (with a context already over, so that the QP
			// is connected with the REQ's values and the attempt then abandoned), reject, or leave it.
			for {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				r, err := l.Request(ctx)
				if err != nil {
					break
				}
				switch answered % 3 {
				case 0:
					if c, err := r.Accept(ctx, nil); err == nil {
						_ = c.Close()
					}
				case 1:
					_ = r.Reject([]byte("no"))
				}
				answered++
			}
		}
		m := d.cm
		m.mu.Lock()
		held, conns, queued := len(m.reqs), m.eng.Len(), len(l.q.reqs)
		m.mu.Unlock()
		st := d.Stats().CM
		if held > conns || queued > backlog || conns > 256 || st.Received != fed || st.TransitionErrors != 0 || st.BuildErrors != 0 {
			t.Fatalf("held %d, queued %d, engine %d, received %d of %d, transition errors %d, build errors %d",
				held, queued, conns, st.Received, fed, st.TransitionErrors, st.BuildErrors)
		}
	})
}
