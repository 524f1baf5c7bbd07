package explain

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/wire"
)

// TestAckOnReadPSN: the ladder goroce's responder sent before cabcbb6 when a SEND's ACK and the
// response of the READ behind it were lost: the resent SEND was ACKed with the READ's PSN. The
// explanation warns on that ACK, names the READ, and the story counts it; the ACK a responder should
// send (the SEND's own PSN) draws no warning.
func TestAckOnReadPSN(t *testing.T) {
	req, rsp := netip.MustParseAddrPort("10.0.0.1:49152"), netip.MustParseAddrPort("10.0.0.2:4791")
	at := time.Unix(1700000000, 0)
	var pkts []Packet
	add := func(from, to netip.AddrPort, f wire.Fields, payload int) {
		t.Helper()
		b, err := wire.Append(nil, &f, make([]byte, payload))
		if err != nil {
			t.Fatal(err)
		}
		at = at.Add(time.Microsecond)
		pkts = append(pkts, Packet{Frame: len(pkts) + 1, At: at, Src: from, Dst: to, Data: b, IPLen: 28 + len(b)})
	}
	bth := func(op wire.Opcode, qpn wire.QPN, psn wire.PSN, ackReq bool) wire.BTHFields {
		return wire.BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: qpn, PSN: psn, AckReq: ackReq}
	}
	const qpA, qpB = 0x11, 0x22
	send := wire.Fields{BTH: bth(wire.RCSendOnly, qpB, 256, true)}
	read := wire.Fields{BTH: bth(wire.RCReadRequest, qpB, 257, true), RETH: wire.RETHFields{VA: 0x1000, RKey: 7, DMALen: 100}}
	ack := func(psn wire.PSN, msn wire.MSN) wire.Fields {
		return wire.Fields{BTH: bth(wire.RCAcknowledge, qpA, psn, false), AETH: wire.AETHFields{Syndrome: wire.SyndromeACK(wire.CreditInvalid), MSN: msn}}
	}
	resp := wire.Fields{BTH: bth(wire.RCReadResponseOnly, qpA, 257, false), AETH: wire.AETHFields{Syndrome: wire.SyndromeACK(wire.CreditInvalid), MSN: 2}}
	for _, psn := range []wire.PSN{257, 256} { // the old responder's ACK, then the right one
		pkts = pkts[:0]
		add(req, rsp, send, 10)
		add(req, rsp, read, 0)
		add(req, rsp, send, 10) // the retry: the first ACK and the READ's response were lost
		add(req, rsp, read, 0)
		add(rsp, req, ack(psn, 2), 0)
		add(rsp, req, resp, 100)
		a := Analyze(pkts)
		var warn []Note
		for _, n := range a.Packets[4].Notes {
			if n.Kind == KindError {
				warn = append(warn, n)
			}
		}
		story := strings.Join(a.Pairs[0].Story, " ")
		if psn == 256 {
			if len(warn) != 0 || strings.Contains(story, "last PSN") {
				t.Errorf("ACK psn=256 warned: %v; story %q", warn, story)
			}
			continue
		}
		if len(warn) != 1 || !strings.Contains(warn[0].Text, "the last PSN of the READ #2") || !warn[0].Inferred {
			t.Fatalf("ACK psn=257: notes %+v", a.Packets[4].Notes)
		}
		if a.Pairs[0].Stats.AckOnReadAtomic != 1 || !strings.Contains(story, "1 plain ACK carried a READ's or atomic's last PSN: a requester must ask again") {
			t.Errorf("stats %+v; story %q", a.Pairs[0].Stats, story)
		}
	}
}
