package conn

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"
)

// networks are the Networks every test below runs on: the host's UDP stack and MemNetwork.
func networks() map[string]func() Network {
	return map[string]func() Network{
		"udp": func() Network { return UDP },
		"mem": func() Network { return NewMemNetwork() },
	}
}

// run returns a GSO message of segments of seg bytes, the last last bytes long, each segment
// starting with its index.
func run(n, seg, last int) []byte {
	var b []byte
	for i := 0; i < n; i++ {
		size := seg
		if i == n-1 {
			size = last
		}
		p := payload(i, size)
		p[0] = byte(i)
		b = append(b, p...)
	}
	return b
}

// listen opens a Conn on a loopback address of n, closed when the test ends.
func listen(t *testing.T, n Network, opts Options) Conn {
	t.Helper()
	c, err := n.Listen(netip.MustParseAddrPort("127.0.0.1:0"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestGSOToGRO sends one GSO write of 10 segments (9 of 1200 bytes and one of 500) to a receiver
// with GRO and to one without: the first reads one run and splits it into the same 10 datagrams
// the second reads one by one.
func TestGSOToGRO(t *testing.T) {
	for name, nw := range networks() {
		t.Run(name, func(t *testing.T) {
			net := nw()
			addr := netip.MustParseAddrPort("127.0.0.1:0")
			tx := listen(t, net, Options{GSO: true})
			if tx.Offload().GSO == 0 {
				t.Skip("no UDP GSO in this kernel")
			}
			buf := run(10, 1200, 500)
			for _, gro := range []bool{true, false} {
				rx, err := net.Listen(addr, Options{GRO: gro})
				if err != nil {
					t.Fatal(err)
				}
				if rx.Offload().GRO != gro {
					t.Fatalf("GRO %v asked, Offload says %v", gro, rx.Offload().GRO)
				}
				if n, err := tx.WriteBatch([]Message{{Buf: buf, Addr: rx.LocalAddr(), SegSize: 1200}}); n != 1 || err != nil {
					t.Fatalf("WriteBatch = %d, %v", n, err)
				}
				var segs [][]byte
				msgs := newMessages(16, MaxGROSize)
				for len(segs) < 10 {
					k, err := rx.ReadBatch(msgs)
					if err != nil {
						t.Fatal(err)
					}
					for i := range msgs[:k] {
						if gro && msgs[i].SegSize != 1200 {
							t.Errorf("GRO read: SegSize %d, want 1200 (one run)", msgs[i].SegSize)
						}
						if !gro && msgs[i].SegSize != 0 {
							t.Errorf("read without GRO: SegSize %d, want 0", msgs[i].SegSize)
						}
						msgs[i].Segments(func(s []byte) { segs = append(segs, append([]byte(nil), s...)) })
					}
				}
				if !bytes.Equal(bytes.Join(segs, nil), buf) || len(segs) != 10 || len(segs[9]) != 500 {
					t.Errorf("GRO %v: %d datagrams, want the 10 segments sent", gro, len(segs))
				}
				if st, _ := StatsOf(rx); st.DatagramsIn != 10 {
					t.Errorf("GRO %v: DatagramsIn %d, want 10", gro, st.DatagramsIn)
				}
				rx.Close()
			}
			if st, _ := StatsOf(tx); st.DatagramsOut != 20 || st.WriteBatches != 2 {
				t.Errorf("sender: DatagramsOut %d WriteBatches %d, want 20 and 2", st.DatagramsOut, st.WriteBatches)
			}
		})
	}
}

// TestGSOOff: a GSO message on a Conn without GSO is refused with ErrGSO and nothing after it is
// sent; single datagrams before it are.
func TestGSOOff(t *testing.T) {
	for name, nw := range networks() {
		t.Run(name, func(t *testing.T) {
			net := nw()
			addr := netip.MustParseAddrPort("127.0.0.1:0")
			tx, _ := net.Listen(addr, Options{})
			rx, _ := net.Listen(addr, Options{})
			defer tx.Close()
			defer rx.Close()
			msgs := []Message{
				{Buf: payload(1, 100), Addr: rx.LocalAddr()},
				{Buf: run(3, 100, 100), Addr: rx.LocalAddr(), SegSize: 100},
				{Buf: payload(2, 100), Addr: rx.LocalAddr()},
			}
			n, err := tx.WriteBatch(msgs)
			if n != 1 || !errors.Is(err, ErrGSO) {
				t.Fatalf("WriteBatch = %d, %v; want 1, ErrGSO", n, err)
			}
			got := readN(t, rx, 1, 2048)
			checkDatagram(t, got[0], msgs[0].Buf, tx.LocalAddr())
		})
	}
}

// TestReadDeadline: a deadline in the past set from another goroutine wakes a blocked reader with
// ErrDeadline; a future one ends an idle read; removing it lets the Conn read again.
func TestReadDeadline(t *testing.T) {
	for name, nw := range networks() {
		t.Run(name, func(t *testing.T) {
			net := nw()
			addr := netip.MustParseAddrPort("127.0.0.1:0")
			a, _ := net.Listen(addr, Options{})
			b, _ := net.Listen(addr, Options{})
			defer a.Close()
			defer b.Close()
			errc := make(chan error, 1)
			go func() {
				_, err := b.ReadBatch(newMessages(1, 64))
				errc <- err
			}()
			time.Sleep(20 * time.Millisecond) // let the reader block (the test holds either way)
			if err := b.SetReadDeadline(time.Unix(1, 0)); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; !errors.Is(err, ErrDeadline) {
				t.Fatalf("interrupted read: %v, want ErrDeadline", err)
			}
			b.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
			if _, err := b.ReadBatch(newMessages(1, 64)); !errors.Is(err, ErrDeadline) {
				t.Fatalf("read past a future deadline: %v, want ErrDeadline", err)
			}
			b.SetReadDeadline(time.Time{})
			if _, err := a.WriteBatch([]Message{{Buf: payload(7, 40), Addr: b.LocalAddr()}}); err != nil {
				t.Fatal(err)
			}
			got := readN(t, b, 1, 64)
			checkDatagram(t, got[0], payload(7, 40), a.LocalAddr())
		})
	}
}

// bthTo returns a datagram that starts like a BTH to qpn.
func bthTo(qpn uint32) []byte {
	b := make([]byte, 32)
	b[0] = 0x04 // SEND_ONLY; only the QPN matters here
	b[5], b[6], b[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
	return b
}

// TestListenShards: datagrams to a group of 3 go to the member at QPN mod 3 (on Linux, the
// reuseport BPF program); the address is then in use for anyone else.
func TestListenShards(t *testing.T) {
	for name, nw := range networks() {
		t.Run(name, func(t *testing.T) {
			net := nw()
			addr := netip.MustParseAddrPort("127.0.0.1:47911")
			g, err := net.ListenShards(addr, 3, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, c := range g {
					c.Close()
				}
			}()
			if st, _ := StatsOf(g[0]); st.SteerFailed != 0 {
				t.Fatal("the kernel refused the steering program")
			}
			for _, again := range []func() error{
				func() error { c, err := net.Listen(addr, Options{}); closeIf(c); return err },
				func() error {
					cs, err := net.ListenShards(addr, 2, Options{})
					for _, c := range cs {
						c.Close()
					}
					return err
				},
			} {
				if again() == nil {
					t.Error("a second bind of the group's address succeeded")
				}
			}
			tx, _ := net.Listen(netip.MustParseAddrPort("127.0.0.1:0"), Options{})
			defer tx.Close()
			const perShard = 4
			var msgs []Message
			for q := uint32(0x100); q < 0x100+3*perShard; q++ {
				msgs = append(msgs, Message{Buf: bthTo(q), Addr: addr})
			}
			if _, err := tx.WriteBatch(msgs); err != nil {
				t.Fatal(err)
			}
			for i, c := range g {
				for _, m := range readN(t, c, perShard, 64) {
					if s := ShardOf(m.Buf[:m.N], 3); s != i {
						t.Errorf("datagram to QPN %#x read by member %d, want %d", m.Buf[7], i, s)
					}
				}
			}
		})
	}
}

func closeIf(c Conn) {
	if c != nil {
		c.Close()
	}
}

func TestShardOf(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		n    int
		want int
	}{
		{bthTo(0x123456), 4, 0x123456 % 4},
		{bthTo(0xffffff), 7, 0xffffff % 7},
		{bthTo(5), 1, 0},
		{[]byte{1, 2, 3}, 4, 0},
	} {
		if got := ShardOf(tc.b, tc.n); got != tc.want {
			t.Errorf("ShardOf(% x, %d) = %d, want %d", tc.b[:min(8, len(tc.b))], tc.n, got, tc.want)
		}
	}
}

// TestMemGSOFiltered: a filter sees a GSO write's datagrams one by one, so it can drop one of them,
// and the rest arrive as separate datagrams even at a GRO endpoint.
func TestMemGSOFiltered(t *testing.T) {
	n := NewMemNetwork()
	seen := 0
	n.SetFilter(func(m *Message, _ netip.AddrPort) Verdict {
		seen++
		return Verdict{Drop: m.Buf[0] == 2}
	})
	tx, _ := n.Listen(netip.MustParseAddrPort("10.0.0.1:0"), Options{GSO: true})
	rx, _ := n.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), Options{GRO: true})
	if _, err := tx.WriteBatch([]Message{{Buf: run(5, 200, 200), Addr: rx.LocalAddr(), SegSize: 200}}); err != nil {
		t.Fatal(err)
	}
	got := readN(t, rx, 4, MaxGROSize)
	for i, m := range got {
		want := []byte{0, 1, 3, 4}[i]
		if m.SegSize != 0 || m.N != 200 || m.Buf[0] != want {
			t.Errorf("datagram %d: segment %d, %d bytes, SegSize %d; want segment %d alone", i, m.Buf[0], m.N, m.SegSize, want)
		}
	}
	if seen != 5 || n.Stats().DropFiltered != 1 {
		t.Errorf("filter saw %d datagrams and dropped %d, want 5 and 1", seen, n.Stats().DropFiltered)
	}
}

// TestPollBatch: PollBatch returns at once, empty, when nothing is queued, even with the read deadline
// past (where ReadBatch fails), and takes what is queued as ReadBatch would.
func TestPollBatch(t *testing.T) {
	for name, nw := range networks() {
		t.Run(name, func(t *testing.T) {
			net := nw()
			addr := netip.MustParseAddrPort("127.0.0.1:0")
			a, _ := net.Listen(addr, Options{})
			b, _ := net.Listen(addr, Options{})
			defer a.Close()
			defer b.Close()
			p, ok := b.(Poller)
			if !ok {
				t.Fatalf("%T is not a Poller", b)
			}
			if n, err := p.PollBatch(newMessages(4, 64)); n != 0 || err != nil {
				t.Fatalf("PollBatch with nothing queued: %d, %v", n, err)
			}
			b.SetReadDeadline(time.Unix(1, 0))
			if _, err := a.WriteBatch([]Message{{Buf: payload(3, 40), Addr: b.LocalAddr()}, {Buf: payload(4, 50), Addr: b.LocalAddr()}}); err != nil {
				t.Fatal(err)
			}
			msgs := newMessages(4, 64)
			got := 0
			for deadline := time.Now().Add(5 * time.Second); got < 2 && time.Now().Before(deadline); {
				n, err := p.PollBatch(msgs[got:])
				if err != nil {
					t.Fatal(err)
				}
				got += n
				if n == 0 {
					time.Sleep(time.Millisecond) // loopback delivers in the sender's call; this is for safety
				}
			}
			if got != 2 {
				t.Fatalf("PollBatch took %d of 2 datagrams", got)
			}
			checkDatagram(t, msgs[0], payload(3, 40), a.LocalAddr())
			checkDatagram(t, msgs[1], payload(4, 50), a.LocalAddr())
			if n, err := p.PollBatch(newMessages(1, 64)); n != 0 || err != nil {
				t.Fatalf("PollBatch after the queue emptied: %d, %v", n, err)
			}
			if _, err := b.ReadBatch(newMessages(1, 64)); !errors.Is(err, ErrDeadline) {
				t.Fatalf("ReadBatch past its deadline: %v, want ErrDeadline", err)
			}
			b.Close()
			if _, err := p.PollBatch(newMessages(1, 64)); !errors.Is(err, ErrClosed) {
				t.Fatalf("PollBatch after Close: %v, want ErrClosed", err)
			}
		})
	}
}

// cut splits b into pieces of the given sizes, then the rest, each a copy: what a writer in
// Pieces hands over are slices of memory of its own.
func cut(b []byte, sizes ...int) [][]byte {
	var out [][]byte
	for _, n := range sizes {
		out = append(out, bytes.Clone(b[:n]))
		b = b[n:]
	}
	return append(out, bytes.Clone(b))
}

// TestGatherPieces writes messages in Pieces: a datagram, and a GSO run whose pieces do not line
// up with its segments. The receiver reads what a message in Buf gives.
func TestGatherPieces(t *testing.T) {
	for name, nw := range networks() {
		t.Run(name, func(t *testing.T) {
			net := nw()
			tx, rx := listen(t, net, Options{GSO: true}), listen(t, net, Options{})
			if !tx.Offload().Gather {
				t.Skip("this Conn does not gather")
			}
			one := payload(1, 1000)
			msgs := []Message{{Pieces: cut(one, 10, 490), Addr: rx.LocalAddr()}}
			var want [][]byte
			want = append(want, one)
			if tx.Offload().GSO > 0 {
				buf := run(5, 1200, 300)
				msgs = append(msgs, Message{Pieces: cut(buf, 100, 1500, 2000), Addr: rx.LocalAddr(), SegSize: 1200})
				for b := buf; len(b) > 0; b = b[min(1200, len(b)):] {
					want = append(want, b[:min(1200, len(b))])
				}
			}
			if n, err := tx.WriteBatch(msgs); n != len(msgs) || err != nil {
				t.Fatalf("WriteBatch = %d, %v", n, err)
			}
			got := readN(t, rx, len(want), 2048)
			for i := range want {
				checkDatagram(t, got[i], want[i], tx.LocalAddr())
			}
			if s, _ := StatsOf(tx); s.DatagramsOut != uint64(len(want)) || s.BytesOut != uint64(len(one)+len(bytes.Join(want[1:], nil))) {
				t.Errorf("stats %+v, want %d datagrams", s, len(want))
			}
		})
	}
}
