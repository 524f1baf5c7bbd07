package explain

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/capture"
	"github.com/goroce/goroce/wire"
)

// TestTracedResends: WRITEs between two devices with 10% of the requester's packets lost; the capture
// of both devices says, on every packet sent again, what set it off (the sending device's own trace),
// and the story counts them as traced, not inferred: every retransmission, and the tail-loss probes
// as many as the requester's counter.
func TestTracedResends(t *testing.T) {
	var buf bytes.Buffer
	cw, err := capture.NewWriter(&buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := cw.Tracer(nil)
	net := goroce.NewMemNetwork()
	ca, cb := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	if err := net.Impair(goroce.Impairment{Loss: 0.1, Seed: 3, From: ca, Dropped: tr.Lost}); err != nil {
		t.Fatal(err)
	}
	open := func(a netip.Addr) (*goroce.Device, *goroce.PD, *goroce.CQ, *goroce.QP) {
		d, err := goroce.Open(goroce.Config{Addr: a, Port: goroce.DefaultPort, Network: net, Tracer: tr})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(64)
		q, err := pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		return d, pd, cq, q
	}
	da, pda, cqa, qa := open(ca)
	db, pdb, _, qb := open(cb)
	o := goroce.DefaultConnectOptions()
	o.MTU = goroce.MTU1024
	if err := qa.Connect(qb.Endpoint(), &o); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(qa.Endpoint(), &o); err != nil {
		t.Fatal(err)
	}
	src, _ := pda.AllocMR(8192, goroce.LocalWrite)
	dst, _ := pdb.AllocMR(8192, goroce.LocalWrite|goroce.RemoteWrite)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := make([]goroce.Completion, 1)
	for i := range 40 {
		if err := qa.PostSend(&goroce.SendWR{WRID: uint64(i), Opcode: goroce.WRRDMAWrite, Flags: goroce.Signaled,
			SGL: []goroce.SGE{src.SGE(0, 8192)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}); err != nil {
			t.Fatal(err)
		}
		if _, err := cqa.Wait(ctx, wc); err != nil || wc[0].Err() != nil {
			t.Fatalf("WRITE %d: %v %v", i, err, wc[0].Err())
		}
	}
	probes := qa.Counters().TailProbes
	da.Close()
	db.Close()
	if err := cw.Close(); err != nil {
		t.Fatal(err)
	}
	pkts, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	an := Analyze(pkts)
	var rc *Pair
	for i := range an.Pairs {
		if an.Pairs[i].Transport == wire.TransportRC {
			rc = an.Pairs[i]
		}
	}
	if rc == nil {
		t.Fatalf("no RC pair in %d pairs", len(an.Pairs))
	}
	st := rc.Stats
	t.Logf("%d retransmissions, %d traced, %d probes (the requester counted %d); story:\n%s", st.Retransmits, st.Traced, st.Probes, probes,
		strings.Join(rc.Story, "\n"))
	if st.Retransmits == 0 || st.Traced != st.Retransmits || st.Probes != int(probes) {
		t.Errorf("%d retransmissions, %d of them traced, %d probes; the requester sent %d probes", st.Retransmits, st.Traced, st.Probes, probes)
	}
	for _, f := range rc.Frames {
		for _, n := range an.Frame(f).Notes {
			if n.Kind == KindRetransmit && n.Inferred {
				t.Errorf("frame %d: an inferred retransmission note: %s", f, n.Text)
			}
		}
	}
	if !strings.Contains(strings.Join(rc.Story, " "), "as the sender's own trace says") {
		t.Errorf("the story does not say its causes are traced")
	}
}
