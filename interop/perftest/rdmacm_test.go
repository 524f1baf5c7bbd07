package perftest

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/goroce/goroce"
)

func TestDestBinary(t *testing.T) {
	d := Dest{LID: 3, OutReads: 16, QPN: 0x123456, PSN: 0xabcdef, RKey: 0xdeadbeef, VAddr: 0x0102030405060708,
		GID: goroce.GIDFromAddr(netip.MustParseAddr("10.0.0.1")), SRQN: 9}
	b := d.AppendBinary(nil)
	if len(b) != DestBinaryLen {
		t.Fatalf("%d bytes, want %d", len(b), DestBinaryLen)
	}
	// lid, out_reads, qpn, psn, rkey big-endian, then padding and the vaddr at offset 24.
	want := []byte{0, 0, 0, 3, 0, 0, 0, 16, 0, 0x12, 0x34, 0x56, 0, 0xab, 0xcd, 0xef, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0,
		1, 2, 3, 4, 5, 6, 7, 8}
	if !bytes.Equal(b[:32], want) {
		t.Fatalf("got % x\nwant % x", b[:32], want)
	}
	got, err := ParseDestBinary(b)
	if err != nil || got != d {
		t.Fatalf("ParseDestBinary = %+v, %v; want %+v", got, err, d)
	}
	// A longer struct (a later perftest's) parses alike; a shorter one is refused.
	if got, err := ParseDestBinary(append(b, make([]byte, 8)...)); err != nil || got != d {
		t.Fatalf("longer: %+v, %v", got, err)
	}
	if _, err := ParseDestBinary(b[:destBinaryMin-1]); !errors.Is(err, ErrBadKey) {
		t.Fatalf("short: %v, want ErrBadKey", err)
	}
}

// TestRDMACM runs both sides in rdma_cm mode over an in-memory network: the exchange over its own
// rdma_cm connection, the test QPs connected by the CM.
func TestRDMACM(t *testing.T) {
	for _, c := range []loopbackCase{
		{name: "write_bw", test: WriteBW, srvResult: true, same: true, mem: true},
		{name: "read_bw", test: ReadBW, srvResult: true, same: true, mem: true},
		{name: "send_bw", test: SendBW, srvResult: true, mem: true},
		{name: "send_lat", test: SendLat, srvResult: true, mem: true, race: true},
		{name: "read_lat", test: ReadLat, mem: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.race && raceEnabled {
				t.Skip("polls memory the peer's WRITEs change")
			}
			o := DefaultOptions(c.test)
			o.Iters, o.RDMACM, o.MTU, o.GIDIndex = 200, true, goroce.MTU1024, 1
			if !c.test.Latency() {
				o.Size = 4096
			}
			s, cl := runLoopback(t, c, o)
			if s.err != nil || cl.err != nil {
				t.Fatalf("server: %v\n%s\nclient: %v\n%s", s.err, s.out, cl.err, cl.out)
			}
			for _, out := range []string{s.out, cl.out} {
				if !strings.Contains(out, " Data ex. method : rdma_cm\n") {
					t.Fatalf("no rdma_cm exchange in the header:\n%s", out)
				}
			}
			checkLoopback(t, c, o, s, cl)
			// One connection for the exchange, one per QP.
			for _, r := range []Result{s.res, cl.res} {
				if r.Stats == nil || r.Stats.CM.Established != uint64(1+o.QPs) {
					t.Fatalf("CM stats %+v: want %d connections established", r.Stats, 1+o.QPs)
				}
			}
		})
	}
}
