package conn

import (
	"net/netip"
	"testing"
)

func TestLossy(t *testing.T) {
	const total = 2000
	run := func(percent float64, seed uint64) (arrived []bool, s Stats) {
		n := NewMemNetwork()
		n.SetQueueLen(total)
		a, b := memPair(t, n)
		l := Lossy(a, percent, seed)
		msgs := make([]Message, total)
		for i := range msgs {
			msgs[i] = Message{Buf: payload(i, 16), Addr: b.LocalAddr()}
		}
		for i := 0; i < total; i += 64 {
			if k, err := l.WriteBatch(msgs[i:min(i+64, total)]); k != min(64, total-i) || err != nil {
				t.Fatalf("WriteBatch = %d, %v", k, err)
			}
		}
		s, _ = StatsOf(l)
		arrived = make([]bool, total)
		for _, m := range readN(t, b, total-int(s.DropFiltered), 64) {
			arrived[payloadSeq(m)] = true
		}
		return arrived, s
	}
	count := func(x []bool) (n int) {
		for _, v := range x {
			if !v {
				n++
			}
		}
		return n
	}
	x, sx := run(20, 7)
	y, _ := run(20, 7)
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("seed 7: datagram %d lost in one run only", i)
		}
	}
	if lost := count(x); lost != int(sx.DropFiltered) || lost < total*15/100 || lost > total*25/100 {
		t.Errorf("lost %d (counted %d) of %d at 20%%", lost, sx.DropFiltered, total)
	}
	if sx.DatagramsOut != total-sx.DropFiltered {
		t.Errorf("wrapped Conn sent %d, want %d", sx.DatagramsOut, total-sx.DropFiltered)
	}
	if z, _ := run(0, 1); count(z) != 0 {
		t.Errorf("0%% lost %d", count(z))
	}
	if z, _ := run(100, 1); count(z) != total {
		t.Errorf("100%% delivered %d", total-count(z))
	}
}

func TestMarkCE(t *testing.T) {
	const total = 1000
	n := NewMemNetwork()
	n.SetQueueLen(total)
	a, b := memPair(t, n)
	ce := MarkCE(a, 30, 3)
	msgs := make([]Message, total)
	for i := range msgs {
		msgs[i] = Message{Buf: payload(i, 16), Addr: b.LocalAddr(), TOS: 0xb8 | 0x02} // EF, ECT(0)
	}
	if k, err := ce.WriteBatch(msgs); k != total || err != nil {
		t.Fatal(k, err)
	}
	marked := 0
	for _, m := range readN(t, b, total, 64) {
		switch m.TOS {
		case 0xbb:
			marked++
		case 0xba:
		default:
			t.Fatalf("TOS %#x", m.TOS)
		}
	}
	s, _ := StatsOf(ce)
	if marked != int(s.MarkedCE) || marked < total*20/100 || marked > total*40/100 {
		t.Errorf("marked %d (counted %d) of %d at 30%%", marked, s.MarkedCE, total)
	}
	for i := range msgs {
		if msgs[i].TOS != 0xba {
			t.Fatal("MarkCE modified the caller's messages")
		}
	}
}

// shortConn sends at most limit datagrams per call, to check how Lossy maps a partial write of
// the datagrams it kept back to the caller's batch.
type shortConn struct {
	Conn
	limit int
}

func (s shortConn) WriteBatch(msgs []Message) (int, error) {
	return min(len(msgs), s.limit), nil
}

func TestLossyPartialWrite(t *testing.T) {
	// With seed 5 at 50%, find which of 8 datagrams are kept, then check the count returned
	// when the inner Conn sends only the first kept one.
	msgs := make([]Message, 8)
	for i := range msgs {
		msgs[i] = Message{Buf: []byte{byte(i)}, Addr: netip.MustParseAddrPort("10.0.0.1:1")}
	}
	rec := &recordConn{}
	Lossy(rec, 50, 5).WriteBatch(msgs)
	if len(rec.got) < 2 {
		t.Skip("seed keeps fewer than 2 datagrams")
	}
	second := int(rec.got[1].Buf[0])
	if k, _ := Lossy(shortConn{limit: 1}, 50, 5).WriteBatch(msgs); k != second {
		t.Errorf("partial write returned %d, want %d (index of the second kept datagram)", k, second)
	}
}

type recordConn struct {
	Conn
	got []Message
}

func (r *recordConn) WriteBatch(msgs []Message) (int, error) {
	r.got = append(r.got, msgs...)
	return len(msgs), nil
}
