package capture

import (
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/wire"
)

// BenchmarkTracer measures what capturing costs a device per packet: a 1 KiB packet sent, then
// received by the other traced device (matched, not written again).
func BenchmarkTracer(b *testing.B) {
	w, err := NewWriter(io.Discard, nil)
	if err != nil {
		b.Fatal(err)
	}
	tr := w.Tracer(nil)
	from, to := netip.MustParseAddrPort("10.0.0.1:49152"), netip.MustParseAddrPort("10.0.0.2:4791")
	pkt := sealed(b, from, to, 0, make([]byte, 1024))
	p, err := wire.Parse(pkt)
	if err != nil {
		b.Fatal(err)
	}
	e := goroce.TraceEvent{At: time.Unix(1, 0), From: from, To: to, Bytes: pkt, Packet: p}
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		pkt[12] = byte(i) // a packet of its own each time (a payload byte: the ICRC is not checked)
		pkt[13] = byte(i >> 8)
		e.Dir = goroce.Sent
		tr.Packet(&e)
		e.Dir = goroce.Received
		tr.Packet(&e)
	}
}
