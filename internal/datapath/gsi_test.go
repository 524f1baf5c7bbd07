package datapath

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/wire"
)

// gsiBench is a datapath on an in-memory network whose QP1 hands MADs to a recorder, and a raw socket
// on the same network that plays the peer.
type gsiBench struct {
	d    *Datapath
	peer conn.Conn
	mu   sync.Mutex
	got  [][]byte
	from []netip.AddrPort
}

func newGSIBench(t *testing.T) *gsiBench {
	t.Helper()
	n := conn.NewMemNetwork()
	g := &gsiBench{}
	d, err := Open(Config{Network: n, Addr: dstAP, Shards: 2, GSI: func(from netip.AddrPort, mad []byte, _ time.Time) {
		g.mu.Lock()
		g.got = append(g.got, append([]byte(nil), mad...))
		g.from = append(g.from, from)
		g.mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	g.d = d
	if g.peer, err = n.Listen(srcAP, conn.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.peer.Close() })
	return g
}

// send seals f with payload as the peer's packet to the datapath and sends it.
func (g *gsiBench) send(t *testing.T, f *wire.Fields, payload []byte) {
	t.Helper()
	pkt, err := wire.Append(nil, f, payload)
	if err != nil {
		t.Fatal(err)
	}
	seal(pkt, srcAP, dstAP, 0)
	if _, err := g.peer.WriteBatch([]conn.Message{{Buf: pkt, Addr: dstAP}}); err != nil {
		t.Fatal(err)
	}
}

func madFields() wire.Fields {
	return wire.Fields{BTH: wire.BTHFields{Opcode: wire.UDSendOnly, PKey: wire.DefaultPKey, DestQP: wire.QPNGSI},
		DETH: wire.DETHFields{QKey: wire.GSIQKey, SrcQP: wire.QPNGSI}}
}

// TestGSIReceive: a UD SEND_ONLY to QP1 with the GSI Q_Key reaches Config.GSI with its payload and its
// sender, from a full or a limited member of the default partition; a wrong Q_Key, another opcode, a
// SEND with immediate, another partition are dropped and counted as not MADs; each is seen once.
func TestGSIReceive(t *testing.T) {
	g := newGSIBench(t)
	mad := bytes.Repeat([]byte{0xab}, 256)
	good := madFields()
	limited := madFields()
	limited.BTH.PKey = 0x7FFF
	badQKey := madFields()
	badQKey.DETH.QKey = 0x11111111
	rc := wire.Fields{BTH: wire.BTHFields{Opcode: wire.RCSendOnly, PKey: wire.DefaultPKey, DestQP: wire.QPNGSI}}
	imm := madFields()
	imm.BTH.Opcode = wire.UDSendOnlyImm
	otherPart := madFields()
	otherPart.BTH.PKey = 0x8001
	for _, f := range []*wire.Fields{&good, &badQKey, &rc, &imm, &otherPart, &limited} {
		g.send(t, f, mad)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := g.d.Stats()
		if s.RxMADs == 2 && s.DropGSI == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.got) != 2 || !bytes.Equal(g.got[0], mad) || g.from[0] != srcAP {
		t.Fatalf("GSI got %d MADs from %v", len(g.got), g.from)
	}
	if s := g.d.Stats(); s.DropUnknownQPN != 0 || s.DropMalformed != 0 {
		t.Errorf("QP1's packets counted elsewhere: %+v", s)
	}
}

// TestSendMAD: a MAD leaves as one UD SEND_ONLY from QP1 to QP1 with the GSI Q_Key, the default P_Key
// and a valid ICRC, the PSN counting QP1's packets.
func TestSendMAD(t *testing.T) {
	g := newGSIBench(t)
	mad := bytes.Repeat([]byte{0x5a}, 256)
	for range 2 {
		if err := g.d.SendMAD(srcAP, mad, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	msgs := []conn.Message{{Buf: make([]byte, 2048)}, {Buf: make([]byte, 2048)}}
	var v verifier
	for i := 0; i < 2; {
		n, err := g.peer.ReadBatch(msgs)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs[:n] {
			p, err := wire.Parse(m.Buf[:m.N])
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := v.verify(ICRCStrict, m.Addr, srcAP, p, 0); !ok {
				t.Error("ICRC does not verify")
			}
			b, d := p.BTH(), p.DETH()
			if p.Opcode() != wire.UDSendOnly || b.DestQP() != wire.QPNGSI || b.PKey() != wire.DefaultPKey ||
				d.QKey() != wire.GSIQKey || d.SrcQP() != wire.QPNGSI || b.PSN() != wire.PSN(i) ||
				!bytes.Equal(p.Payload(), mad) {
				t.Errorf("packet %d: %v", i, p)
			}
			i++
		}
	}
	if s := g.d.Stats(); s.TxMADs != 2 {
		t.Errorf("TxMADs %d, want 2", s.TxMADs)
	}
}
