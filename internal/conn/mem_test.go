package conn

import (
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

func memPair(t *testing.T, n *MemNetwork) (a, b Conn) {
	t.Helper()
	a, err := n.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err = n.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestMemDelivery(t *testing.T) {
	n := NewMemNetwork()
	a, b := memPair(t, n)
	buf := payload(1, 100)
	msgs := []Message{{Buf: buf, Addr: b.LocalAddr(), TOS: 0xb8}, {Buf: payload(2, 30), Addr: b.LocalAddr(), TOS: 0x02}}
	if k, err := a.WriteBatch(msgs); k != 2 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", k, err)
	}
	want := payload(1, 100)
	buf[0] ^= 0xff // copied on write: the sender may reuse its buffer at once
	got := readN(t, b, 2, 2048)
	checkDatagram(t, got[0], want, a.LocalAddr())
	checkDatagram(t, got[1], msgs[1].Buf, a.LocalAddr())
	if got[0].TOS != 0xb8 || got[1].TOS != 0x02 {
		t.Errorf("TOS = %#x, %#x", got[0].TOS, got[1].TOS)
	}
	if got[0].Local != b.LocalAddr().Addr() {
		t.Errorf("Local = %v", got[0].Local)
	}
	// Truncation.
	a.WriteBatch([]Message{{Buf: payload(3, 100), Addr: b.LocalAddr()}})
	m := newMessages(1, 10)
	if k, err := b.ReadBatch(m); k != 1 || err != nil || !m[0].Truncated || m[0].N != 10 {
		t.Errorf("truncated read = %d, %v, %+v", k, err, m[0])
	}
	s, _ := StatsOf(b)
	if s.DatagramsIn != 3 || s.DropTruncated != 1 {
		t.Errorf("stats = %+v", s)
	}
}

func TestMemPortZeroAndWildcard(t *testing.T) {
	n := NewMemNetwork()
	a, err := n.Listen(netip.MustParseAddrPort("[fd00::1]:0"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := n.Listen(netip.MustParseAddrPort("[fd00::1]:0"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.LocalAddr().Port() == 0 || a.LocalAddr() == b.LocalAddr() {
		t.Errorf("ports %v, %v", a.LocalAddr(), b.LocalAddr())
	}
	if _, err := n.Listen(a.LocalAddr(), Options{}); err == nil {
		t.Error("second Listen on a bound address succeeded")
	}
	w, err := n.Listen(netip.MustParseAddrPort("0.0.0.0:4791"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	to := netip.MustParseAddrPort("192.0.2.7:4791")
	a.WriteBatch([]Message{{Buf: []byte("hi"), Addr: to}})
	if m := readN(t, w, 1, 64)[0]; m.Local != to.Addr() || string(m.Buf[:m.N]) != "hi" {
		t.Errorf("wildcard got %+v", m)
	}
}

func TestMemOverflowAndUnknown(t *testing.T) {
	n := NewMemNetwork()
	n.SetQueueLen(4)
	a, b := memPair(t, n)
	msgs := make([]Message, 10)
	for i := range msgs {
		msgs[i] = Message{Buf: payload(i, 20), Addr: b.LocalAddr()}
	}
	if k, err := a.WriteBatch(msgs); k != 10 || err != nil { // never blocks on the full queue
		t.Fatalf("WriteBatch = %d, %v", k, err)
	}
	for i, m := range readN(t, b, 4, 64) {
		checkDatagram(t, m, msgs[i].Buf, a.LocalAddr())
	}
	a.WriteBatch([]Message{{Buf: []byte("x"), Addr: netip.MustParseAddrPort("10.9.9.9:1")}})
	if s, _ := StatsOf(b); s.DropOverflow != 6 {
		t.Errorf("receiver DropOverflow = %d, want 6", s.DropOverflow)
	}
	if s := n.Stats(); s.DropOverflow != 6 || s.DropUnknownDest != 1 {
		t.Errorf("network stats = %+v", s)
	}
	// Closed endpoints are unknown destinations.
	b.Close()
	a.WriteBatch(msgs[:1])
	if s := n.Stats(); s.DropUnknownDest != 2 {
		t.Errorf("DropUnknownDest after Close = %d, want 2", s.DropUnknownDest)
	}
}

func TestMemClose(t *testing.T) {
	base := runtime.NumGoroutine()
	n := NewMemNetwork()
	c, err := n.Listen(netip.MustParseAddrPort("10.0.0.1:1"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error)
	go func() {
		_, err := c.ReadBatch(newMessages(1, 64))
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond) // let the reader block; correct either way
	c.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("blocked ReadBatch = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := c.WriteBatch([]Message{{Buf: []byte{1}, Addr: c.LocalAddr()}}); !errors.Is(err, ErrClosed) {
		t.Errorf("WriteBatch after Close = %v", err)
	}
	// The address is free again.
	c2, err := n.Listen(c.LocalAddr(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	waitGoroutines(t, base)
}

func TestMemFilter(t *testing.T) {
	n := NewMemNetwork()
	a, b := memPair(t, n)
	var seen []netip.AddrPort
	n.SetFilter(func(m *Message, from netip.AddrPort) Verdict {
		seen = append(seen, from)
		switch m.Buf[0] {
		case 'd':
			return Verdict{Drop: true}
		case '2':
			return Verdict{Duplicates: 1}
		case 'c':
			m.TOS |= ecnCE
		case 'x':
			m.Buf[1] ^= 0xff
		case 'l':
			return Verdict{Delay: 20 * time.Millisecond}
		}
		return Verdict{}
	})
	src := []string{"l-late", "d-drop", "2-dup", "c-ce", "x-corrupt", "p-plain"}
	msgs := make([]Message, len(src))
	for i, s := range src {
		msgs[i] = Message{Buf: []byte(s), Addr: b.LocalAddr(), TOS: 0x02}
	}
	if k, err := a.WriteBatch(msgs); k != len(msgs) || err != nil {
		t.Fatal(k, err)
	}
	n.Wait()
	got := readN(t, b, 6, 64)
	var order []string
	for _, m := range got {
		order = append(order, string(m.Buf[:m.N]))
	}
	want := []string{"2-dup", "2-dup", "c-ce", "x\xd2corrupt", "p-plain", "l-late"}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("delivered %q, want %q", order, want)
		}
	}
	if got[2].TOS != 0x03 || got[4].TOS != 0x02 {
		t.Errorf("TOS: CE-marked %#x, plain %#x", got[2].TOS, got[4].TOS)
	}
	if msgs[4].Buf[1] != '-' {
		t.Error("filter corrupted the sender's buffer")
	}
	if len(seen) != len(src) || seen[0] != a.LocalAddr() {
		t.Errorf("filter saw %v", seen)
	}
	if s := n.Stats(); s.DropFiltered != 1 {
		t.Errorf("DropFiltered = %d", s.DropFiltered)
	}
}

// TestMemRandomLoss checks that a seeded loss filter drops about the share asked for and the
// same datagrams for the same seed.
func TestMemRandomLoss(t *testing.T) {
	const total, seed = 2000, 42
	run := func(seed uint64) []bool {
		n := NewMemNetwork()
		n.SetQueueLen(total)
		n.SetFilter(RandomLoss(10, seed))
		a, b := memPair(t, n)
		msgs := make([]Message, total)
		for i := range msgs {
			msgs[i] = Message{Buf: payload(i, 16), Addr: b.LocalAddr()}
		}
		a.WriteBatch(msgs)
		arrived := make([]bool, total)
		k := total - int(n.Stats().DropFiltered)
		for _, m := range readN(t, b, k, 64) {
			arrived[payloadSeq(m)] = true
		}
		return arrived
	}
	x, y, z := run(seed), run(seed), run(seed+1)
	lost, same, samez := 0, true, true
	for i := range x {
		if !x[i] {
			lost++
		}
		same = same && x[i] == y[i]
		samez = samez && x[i] == z[i]
	}
	if !same {
		t.Errorf("seed %d: two runs lost different datagrams", seed)
	}
	if samez {
		t.Errorf("seeds %d and %d lost the same datagrams", seed, seed+1)
	}
	if lost < total*5/100 || lost > total*15/100 {
		t.Errorf("seed %d: lost %d of %d at 10%%", seed, lost, total)
	}
}

func payloadSeq(m Message) int {
	b := m.Buf[:m.N]
	return int(uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 | uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7]))
}
