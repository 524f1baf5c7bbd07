//go:build linux

package conn

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func forEachFamily(t *testing.T, f func(t *testing.T, addr netip.AddrPort)) {
	for _, addr := range []netip.AddrPort{loop4, loop6} {
		name := "IPv4"
		if addr.Addr().Is6() {
			name = "IPv6"
		}
		t.Run(name, func(t *testing.T) { f(t, addr) })
	}
}

func TestUDPRoundTrip(t *testing.T) {
	forEachFamily(t, func(t *testing.T, addr netip.AddrPort) {
		a, b := udpPair(t, addr, Options{})
		want := payload(1, 300)
		n, err := a.WriteBatch([]Message{{Buf: want, Addr: b.LocalAddr()}})
		if n != 1 || err != nil {
			t.Fatalf("WriteBatch = %d, %v", n, err)
		}
		m := readN(t, b, 1, 2048)[0]
		checkDatagram(t, m, want, a.LocalAddr())
		if m.Local != addr.Addr() {
			t.Errorf("Local = %v, want %v", m.Local, addr.Addr())
		}
		if m.TOS != 0 {
			t.Errorf("TOS = %#x, want 0", m.TOS)
		}
		// And back, to the address the datagram came from.
		if _, err := b.WriteBatch([]Message{{Buf: want[:7], Addr: m.Addr}}); err != nil {
			t.Fatal(err)
		}
		checkDatagram(t, readN(t, a, 1, 2048)[0], want[:7], b.LocalAddr())

		sa, sb := a.Stats(), b.Stats()
		if sa.DatagramsOut != 1 || sa.BytesOut != 300 || sa.DatagramsIn != 1 || sa.BytesIn != 7 {
			t.Errorf("a stats = %+v", sa)
		}
		if sb.DatagramsIn != 1 || sb.BytesIn != 300 || sb.DatagramsOut != 1 || sb.ReadBatches != 1 {
			t.Errorf("b stats = %+v", sb)
		}
	})
}

// TestUDPFullBatch writes more than a batch in one call (two sendmmsg calls) and reads them
// back in order through full recvmmsg batches.
func TestUDPFullBatch(t *testing.T) {
	forEachFamily(t, func(t *testing.T, addr netip.AddrPort) {
		const batch = 16
		a, b := udpPair(t, addr, Options{BatchSize: batch})
		const total = 2*batch + 3
		msgs := make([]Message, total)
		for i := range msgs {
			msgs[i] = Message{Buf: payload(i, 64+i), Addr: b.LocalAddr()}
		}
		if n, err := a.WriteBatch(msgs); n != total || err != nil {
			t.Fatalf("WriteBatch = %d, %v", n, err)
		}
		got := readN(t, b, total, 2048)
		for i, m := range got {
			checkDatagram(t, m, msgs[i].Buf, a.LocalAddr())
		}
		if s := a.Stats(); s.WriteBatches != 3 || s.DatagramsOut != total {
			t.Errorf("writer stats = %+v, want 3 batches of %d datagrams", s, total)
		}
		// A full batch is read by one call once it is queued.
		msgs2 := newMessages(batch, 2048)
		if n, err := a.WriteBatch(msgs[:batch]); n != batch || err != nil {
			t.Fatal(n, err)
		}
		n := 0
		for n < batch {
			k, err := b.ReadBatch(msgs2[n:])
			if err != nil {
				t.Fatal(err)
			}
			n += k
		}
	})
}

func TestUDPTOS(t *testing.T) {
	forEachFamily(t, func(t *testing.T, addr netip.AddrPort) {
		a, b := udpPair(t, addr, Options{})
		tos := []uint8{0x02, 0xb8, 0x00, 0x03, 0xbb, 0x01}
		msgs := make([]Message, len(tos))
		for i, v := range tos {
			msgs[i] = Message{Buf: payload(i, 100), Addr: b.LocalAddr(), TOS: v}
		}
		if _, err := a.WriteBatch(msgs); err != nil {
			t.Fatal(err)
		}
		for i, m := range readN(t, b, len(tos), 2048) {
			checkDatagram(t, m, msgs[i].Buf, a.LocalAddr())
			if m.TOS != tos[i] {
				t.Errorf("datagram %d: TOS = %#02x, want %#02x", i, m.TOS, tos[i])
			}
		}
	})
}

func TestUDPAlwaysTOS(t *testing.T) {
	a, b := udpPair(t, loop4, Options{AlwaysTOS: true})
	if _, err := a.WriteBatch([]Message{{Buf: []byte("x"), Addr: b.LocalAddr()}, {Buf: []byte("y"), Addr: b.LocalAddr(), TOS: 0xb8}}); err != nil {
		t.Fatal(err)
	}
	got := readN(t, b, 2, 64)
	if got[0].TOS != 0 || got[1].TOS != 0xb8 {
		t.Errorf("TOS = %#x, %#x; want 0, 0xb8", got[0].TOS, got[1].TOS)
	}
}

func TestUDPTruncated(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	big, small := payload(1, 1000), payload(2, 10)
	if _, err := a.WriteBatch([]Message{{Buf: big, Addr: b.LocalAddr()}, {Buf: small, Addr: b.LocalAddr()}}); err != nil {
		t.Fatal(err)
	}
	got := readN(t, b, 2, 100)
	if !got[0].Truncated || got[0].N != 100 || string(got[0].Buf[:100]) != string(big[:100]) {
		t.Errorf("big: Truncated=%v N=%d, want true, 100", got[0].Truncated, got[0].N)
	}
	checkDatagram(t, got[1], small, a.LocalAddr())
	if s := b.Stats(); s.DropTruncated != 1 {
		t.Errorf("DropTruncated = %d, want 1", s.DropTruncated)
	}
	// A zero-capacity buffer is all truncation, not an error.
	if _, err := a.WriteBatch([]Message{{Buf: small, Addr: b.LocalAddr()}}); err != nil {
		t.Fatal(err)
	}
	m := []Message{{}}
	if n, err := b.ReadBatch(m); n != 1 || err != nil || !m[0].Truncated || m[0].N != 0 {
		t.Errorf("zero-capacity read = %d, %v, %+v", n, err, m[0])
	}
}

// TestUDPDropsPerMessage checks that datagrams the kernel refuses one by one are reported as
// sent and counted, and that the rest of the batch still goes.
func TestUDPDropsPerMessage(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	tooBig := make([]byte, maxUDPPayload+1) // EMSGSIZE
	msgs := []Message{
		{Buf: payload(1, 50), Addr: b.LocalAddr()},
		{Buf: tooBig, Addr: b.LocalAddr()},
		{Buf: payload(2, 50), Addr: netip.AddrPort{}},                            // invalid
		{Buf: payload(3, 50), Addr: netip.MustParseAddrPort("[::1]:9")},          // wrong family
		{Buf: payload(4, 50), Addr: netip.AddrPortFrom(b.LocalAddr().Addr(), 0)}, // port 0
		{Buf: payload(5, 50), Addr: b.LocalAddr()},
	}
	n, err := a.WriteBatch(msgs)
	if n != len(msgs) || err != nil {
		t.Fatalf("WriteBatch = %d, %v; want %d, nil", n, err, len(msgs))
	}
	got := readN(t, b, 2, 2048)
	checkDatagram(t, got[0], msgs[0].Buf, a.LocalAddr())
	checkDatagram(t, got[1], msgs[5].Buf, a.LocalAddr())
	s := a.Stats()
	if s.DropTooBig != 1 || s.DropBadAddr != 3 || s.DatagramsOut != uint64(len(msgs)) || s.BytesOut != 100 {
		t.Errorf("stats = %+v", s)
	}
}

func TestUDPCloseUnblocksRead(t *testing.T) {
	base := runtime.NumGoroutine()
	c, err := Listen(loop4, Options{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error)
	go func() {
		_, err := c.ReadBatch(newMessages(4, 64))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // let the reader park in the poller; correct either way
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("blocked ReadBatch = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := c.ReadBatch(newMessages(1, 64)); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadBatch after Close = %v", err)
	}
	if _, err := c.WriteBatch([]Message{{Buf: []byte{1}, Addr: netip.MustParseAddrPort("127.0.0.1:9")}}); !errors.Is(err, ErrClosed) {
		t.Errorf("WriteBatch after Close = %v", err)
	}
	waitGoroutines(t, base)
}

func TestUDPAllocs(t *testing.T) {
	forEachFamily(t, func(t *testing.T, addr netip.AddrPort) {
		const batch = 8
		a, b := udpPair(t, addr, Options{BatchSize: batch})
		out := make([]Message, batch)
		for i := range out {
			out[i] = Message{Buf: payload(i, 200), Addr: b.LocalAddr()}
			if i%2 == 1 {
				out[i].TOS = 0x02 // both the plain and the control-message paths
			}
		}
		in := newMessages(batch, 2048)
		roundTrip := func() {
			if n, err := a.WriteBatch(out); n != batch || err != nil {
				t.Fatalf("WriteBatch = %d, %v", n, err)
			}
			for got := 0; got < batch; {
				n, err := b.ReadBatch(in[got:])
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
		}
		roundTrip()
		if allocs := testing.AllocsPerRun(200, roundTrip); allocs != 0 {
			t.Errorf("allocations per write+read of %d datagrams = %v, want 0", batch, allocs)
		}
		// A read a deadline ends, as the datapath's kicks end one: through a net.UDPConn's RawConn
		// each cost a *net.OpError.
		kicked := func() {
			b.SetReadDeadline(time.Unix(1, 0))
			if _, err := b.ReadBatch(in); !errors.Is(err, ErrDeadline) {
				t.Fatalf("ReadBatch past its deadline = %v", err)
			}
		}
		kicked()
		if allocs := testing.AllocsPerRun(200, kicked); allocs != 0 {
			t.Errorf("allocations per read ended by a deadline = %v, want 0", allocs)
		}
		b.SetReadDeadline(time.Time{})
	})
}

func TestUDPOptions(t *testing.T) {
	forEachFamily(t, func(t *testing.T, addr netip.AddrPort) {
		const want = 2 << 20
		c, _ := udpPair(t, addr, Options{RecvBuffer: want, SendBuffer: want})
		recv, send := c.BufferSizes()
		t.Logf("SO_RCVBUF %d, SO_SNDBUF %d (kernel accounting, twice the payload bytes)", recv, send)
		if recv < want || send < want {
			t.Errorf("BufferSizes = %d, %d; want at least %d (rmem_max and wmem_max permitting)", recv, send, want)
		}
		if c.BatchSize() != DefaultBatchSize {
			t.Errorf("BatchSize = %d", c.BatchSize())
		}
		level, name := unix.IPPROTO_IP, unix.IP_MTU_DISCOVER
		if addr.Addr().Is6() {
			level, name = unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER
		}
		var v int
		var gerr error
		if err := c.raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, name) }); err != nil || gerr != nil {
			t.Fatal(err, gerr)
		}
		if v != unix.IP_PMTUDISC_DO { // IPV6_PMTUDISC_DO has the same value
			t.Errorf("MTU discover = %d, want PMTUDISC_DO", v)
		}
	})
}

func TestListenErrors(t *testing.T) {
	if _, err := Listen(netip.AddrPort{}, Options{}); err == nil {
		t.Error("Listen(invalid) succeeded")
	}
	c, err := Listen(loop4, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := Listen(c.LocalAddr(), Options{}); err == nil {
		t.Errorf("second Listen(%v) succeeded", c.LocalAddr())
	}
	if c2, err := Listen(loop4, Options{BatchSize: 1 << 20}); err != nil || c2.BatchSize() != MaxBatchSize {
		t.Errorf("huge BatchSize: %v, %v", c2, err)
	} else {
		c2.Close()
	}
}

func TestUDPMarkCE(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	ce := MarkCE(a, 100, 1)
	if _, err := ce.WriteBatch([]Message{{Buf: []byte("0123"), Addr: b.LocalAddr(), TOS: 0x02}, {Buf: []byte("4567"), Addr: b.LocalAddr(), TOS: 0xb8}}); err != nil {
		t.Fatal(err)
	}
	got := readN(t, b, 2, 64)
	if got[0].TOS != 0x03 || got[1].TOS != 0xbb {
		t.Errorf("TOS after MarkCE through the kernel = %#x, %#x; want 0x03, 0xbb", got[0].TOS, got[1].TOS)
	}
}

func ExampleListen() {
	c, err := Listen(netip.MustParseAddrPort("127.0.0.1:0"), Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	fmt.Println(c.BatchSize())
	// Output: 64
}

// TestGSORefusedByKernel makes the kernel refuse a GSO write (a socket without UDP checksums cannot
// segment: net/ipv4/udp.c, udp_send_skb returns EINVAL) and checks that WriteBatch reports ErrGSO at
// that message, having sent the ones before it, and that the Conn stops offering GSO.
func TestGSORefusedByKernel(t *testing.T) {
	a, b := udpPair(t, loop4, Options{GSO: true})
	if a.Offload().GSO == 0 {
		t.Skip("no UDP GSO in this kernel")
	}
	if err := a.raw.Control(func(fd uintptr) {
		if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	msgs := []Message{
		{Buf: payload(1, 100), Addr: b.LocalAddr()},
		{Buf: run(4, 300, 300), Addr: b.LocalAddr(), SegSize: 300},
	}
	n, err := a.WriteBatch(msgs)
	if n != 1 || !errors.Is(err, ErrGSO) {
		t.Fatalf("WriteBatch = %d, %v; want 1, ErrGSO", n, err)
	}
	if a.Offload().GSO != 0 {
		t.Error("Offload still reports GSO after the kernel refused it")
	}
	if st := a.Stats(); st.GSORefused != 1 {
		t.Errorf("GSORefused = %d, want 1", st.GSORefused)
	}
	checkDatagram(t, readN(t, b, 1, 2048)[0], msgs[0].Buf, a.LocalAddr())
}

// rxe sends RoCEv2 over IPv6 with a zero UDP checksum; the receive socket takes such datagrams
// (UDP_NO_CHECK6_RX), which the kernel drops otherwise. The sender here is a plain socket with
// UDP_NO_CHECK6_TX, as rxe's tunnel socket.
func TestZeroChecksumIPv6(t *testing.T) {
	c, err := Listen(loop6, Options{})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer c.Close()
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_TX, 1); err != nil {
		t.Fatalf("UDP_NO_CHECK6_TX: %v", err)
	}
	to := &unix.SockaddrInet6{Port: int(c.LocalAddr().Port()), Addr: c.LocalAddr().Addr().As16()}
	want := payload(3, 100)
	if err := unix.Sendto(fd, want, 0, to); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second)) // a dropped datagram fails the read
	m := readN(t, c, 1, 2048)[0]
	if string(m.Buf[:m.N]) != string(want) {
		t.Fatalf("got %x", m.Buf[:m.N])
	}
}

// TestUDPWaited checks that Waited tells a ReadBatch that had to wait (here, on an empty socket until
// its deadline) from one that found a datagram queued. On loopback a datagram is normally queued
// before the send returns; under a softirq backlog the kernel may deliver it later, so the second case
// asks only that one read of twenty found its datagram queued.
func TestUDPWaited(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	msgs := newMessages(1, 64)
	if err := b.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadBatch(msgs); !errors.Is(err, ErrDeadline) {
		t.Fatalf("ReadBatch on an empty socket = %v, want ErrDeadline", err)
	}
	if !b.Waited() {
		t.Error("Waited() = false after a ReadBatch that waited for its deadline")
	}
	if err := b.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	queued := 0
	for range 20 {
		if _, err := a.WriteBatch([]Message{{Buf: []byte{1}, Addr: b.LocalAddr()}}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.ReadBatch(msgs); err != nil {
			t.Fatal(err)
		}
		if !b.Waited() {
			queued++
		}
	}
	if queued == 0 {
		t.Error("Waited() = true after each of 20 ReadBatch calls made after their datagram was sent")
	}
}

// TestUDPGatherMaxPieces: a batch whose messages' pieces pass MaxPieces goes in two system calls,
// and a message of more pieces than that is dropped and counted, not sent in part.
func TestUDPGatherMaxPieces(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	tiny := func(seq, n int) ([]byte, [][]byte) {
		whole := payload(seq, n)
		var pieces [][]byte
		for i := range whole {
			pieces = append(pieces, whole[i:i+1])
		}
		return whole, pieces
	}
	w1, p1 := tiny(1, MaxPieces/2+1)
	w2, p2 := tiny(2, MaxPieces/2+1)
	_, p3 := tiny(3, MaxPieces+1)
	w4, p4 := tiny(4, 3)
	msgs := []Message{{Pieces: p1, Addr: b.LocalAddr()}, {Pieces: p2, Addr: b.LocalAddr()},
		{Pieces: p3, Addr: b.LocalAddr()}, {Pieces: p4, Addr: b.LocalAddr()}}
	if n, err := a.WriteBatch(msgs); n != len(msgs) || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	got := readN(t, b, 3, 2048)
	for i, w := range [][]byte{w1, w2, w4} {
		checkDatagram(t, got[i], w, a.LocalAddr())
	}
	if s := a.Stats(); s.WriteBatches != 3 || s.DropBadAddr != 1 || s.DatagramsOut != 4 {
		t.Errorf("stats %+v, want 3 sendmmsg calls and 1 of 4 datagrams dropped", s)
	}
}

// TestGatherUnmapped: a message whose piece lies in memory unmapped since (a region its program
// unmapped while a packet sent from it was on its way out) is dropped and counted, and the
// message after it in the batch still goes.
func TestGatherUnmapped(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(page); err != nil {
		t.Fatal(err)
	}
	after := payload(2, 100)
	msgs := []Message{{Pieces: [][]byte{[]byte("head"), page[:100]}, Addr: b.LocalAddr()}, {Pieces: [][]byte{after}, Addr: b.LocalAddr()}}
	if n, err := a.WriteBatch(msgs); n != 2 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	checkDatagram(t, readN(t, b, 1, 2048)[0], after, a.LocalAddr())
	if s := a.Stats(); s.DropBadAddr != 1 || s.DatagramsOut != 2 {
		t.Errorf("stats %+v, want 1 of 2 datagrams dropped", s)
	}
}

// TestListenShardsJoinLazily: with Options.JoinLazily the first socket of a group takes every
// datagram, with no steering program attached, until the second joins; from then on the group steers
// by QPN mod n as ListenShards does.
func TestListenShardsJoinLazily(t *testing.T) {
	for _, a := range []string{"127.0.0.1:47913", "[::1]:47913"} {
		t.Run(a, func(t *testing.T) { testJoinLazily(t, netip.MustParseAddrPort(a)) })
	}
}

func testJoinLazily(t *testing.T, addr netip.AddrPort) {
	g, err := UDP.ListenShards(addr, 2, Options{JoinLazily: true})
	if err != nil {
		if addr.Addr().Is6() {
			t.Skipf("IPv6 loopback unavailable: %v", err)
		}
		t.Fatal(err)
	}
	defer func() {
		for _, c := range g {
			c.Close()
		}
	}()
	for _, c := range g { // a datagram read by the wrong member fails the test, not its timeout
		if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	second, ok := g[1].(Joiner)
	if !ok {
		t.Fatalf("%T does not join lazily", g[1])
	}
	group := g[1].(*UDPConn).group
	tx, err := UDP.Listen(netip.AddrPortFrom(addr.Addr(), 0), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	send := func() {
		t.Helper()
		var msgs []Message
		for q := uint32(0x100); q < 0x104; q++ {
			msgs = append(msgs, Message{Buf: bthTo(q), Addr: addr})
		}
		if _, err := tx.WriteBatch(msgs); err != nil {
			t.Fatal(err)
		}
	}

	send()
	readN(t, g[0], 4, 64)
	if n, _ := g[1].(Poller).PollBatch(make([]Message, 1)); n != 0 {
		t.Errorf("the socket that has not joined read %d datagrams", n)
	}
	if group.steered {
		t.Error("the steering program was attached to a group of one")
	}
	if reusePort(t, g[0]) {
		t.Error("the group's only socket has SO_REUSEPORT: the kernel runs its group selection for every datagram")
	}

	if err := second.Join(); err != nil {
		t.Fatal(err)
	}
	if err := second.Join(); err != nil {
		t.Fatalf("joining again: %v", err)
	}
	if st, _ := StatsOf(g[0]); !group.steered || st.SteerFailed != 0 {
		t.Fatalf("after the join: steered %v, SteerFailed %d", group.steered, st.SteerFailed)
	}
	if !reusePort(t, g[0]) {
		t.Error("after the join the first socket has no SO_REUSEPORT")
	}
	send()
	for i, c := range g {
		for _, m := range readN(t, c, 2, 64) {
			if s := ShardOf(m.Buf[:m.N], 2); s != i {
				t.Errorf("datagram to QPN %#x read by member %d, want %d", m.Buf[7], i, s)
			}
		}
	}
}

// reusePort reports whether c's socket has SO_REUSEPORT set.
func reusePort(t *testing.T, c Conn) bool {
	t.Helper()
	var v int
	var gerr error
	if err := c.(*UDPConn).raw.Control(func(fd uintptr) {
		v, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT)
	}); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v != 0
}
