package goroce

import (
	"net/netip"
	"testing"

	"github.com/goroce/goroce/wire"
	"github.com/goroce/goroce/wire/mad"
)

// TestSIDRBadCMAHeader: SIDR_REQs for a UD listener without rdma_cm's header in their private data are
// refused (a SIDR_REP, status reject) and counted, as Linux's rdma_cm refuses them; one with the
// header is answered with the listener's QPN. Nothing reaches the program.
func TestSIDRBadCMAHeader(t *testing.T) {
	d, _, _ := badDevice(t, 4)
	pd, err := d.AllocPD()
	must(t, err)
	cq, err := d.CreateCQ(4)
	must(t, err)
	q, err := pd.CreateQP(QPInit{Type: UD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
	must(t, err)
	l, err := d.ListenUD(7174, q, &UDOptions{ManualAccept: true})
	must(t, err)
	defer l.Close()
	sid := mad.ServiceID(mad.PortSpaceUDP, 7174)
	send := func(id uint32, p []byte) {
		b, err := (&mad.SIDRReqFields{RequestID: id, PKey: wire.DefaultPKey, ServiceID: sid, PrivateData: p}).Append(nil, uint64(id))
		must(t, err)
		d.cm.handleMAD(netip.AddrPortFrom(badPeer, DefaultPort), b, d.clock.Now())
	}
	send(1, nil)                      // no header at all
	send(2, []byte{0x99, 0x40, 0, 0}) // a CMA version rdma_cm does not have
	hdr := mad.CMAHeaderFields{SrcPort: 40000, SrcAddr: badPeer, DstAddr: badSelf}
	send(3, hdr.Append(nil, []byte("ok")))
	st := d.Stats().CM
	if st.BadCMAHeader != 2 || st.Rcvd[7] != 3 || st.Sent[8] != 2 {
		t.Fatalf("bad headers %d, SIDR_REQs %d, SIDR_REPs %d; want 2, 3, 2", st.BadCMAHeader, st.Rcvd[7], st.Sent[8])
	}
	select {
	case r := <-l.q.reqs:
		if r.RemoteAddr() != netip.AddrPortFrom(badPeer, 40000) || string(r.PrivateData()[:2]) != "ok" {
			t.Fatalf("request from %v with %q", r.RemoteAddr(), r.PrivateData()[:2])
		}
		must(t, r.Accept(nil))
	default:
		t.Fatal("the good request did not reach the listener")
	}
	if len(l.q.reqs) != 0 {
		t.Fatalf("%d more requests queued", len(l.q.reqs))
	}
	if st := d.Stats().CM; st.Sent[8] != 3 {
		t.Fatalf("SIDR_REPs %d after Accept; want 3", st.Sent[8])
	}
}
