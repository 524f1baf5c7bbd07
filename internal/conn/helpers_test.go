package conn

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

var (
	loop4 = netip.MustParseAddrPort("127.0.0.1:0")
	loop6 = netip.MustParseAddrPort("[::1]:0")
)

// udpPair opens two sockets bound to addr (port 0), closed at the end of the test.
func udpPair(tb testing.TB, addr netip.AddrPort, opts Options) (a, b *UDPConn) {
	tb.Helper()
	a, err := ListenUDP(addr, opts)
	if err != nil {
		if addr.Addr().Is6() {
			tb.Skipf("IPv6 loopback unavailable: %v", err)
		}
		tb.Fatal(err)
	}
	b, err = ListenUDP(addr, opts)
	if err != nil {
		a.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// payload returns a datagram of size bytes whose content depends on seq.
func payload(seq, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(seq*31 + i)
	}
	if size >= 8 {
		binary.BigEndian.PutUint64(b, uint64(seq))
	}
	return b
}

// readN reads until n datagrams arrived, into fresh buffers of bufSize bytes.
func readN(tb testing.TB, c Conn, n, bufSize int) []Message {
	tb.Helper()
	var got []Message
	for len(got) < n {
		msgs := newMessages(min(n-len(got), c.BatchSize()), bufSize)
		k, err := c.ReadBatch(msgs)
		if err != nil {
			tb.Fatalf("ReadBatch after %d of %d: %v", len(got), n, err)
		}
		got = append(got, msgs[:k]...)
	}
	return got
}

func checkDatagram(tb testing.TB, m Message, want []byte, from netip.AddrPort) {
	tb.Helper()
	if !bytes.Equal(m.Buf[:m.N], want) {
		tb.Errorf("datagram = %x..., want %x...", m.Buf[:min(m.N, 16)], want[:min(len(want), 16)])
	}
	if m.Addr != from {
		tb.Errorf("Addr = %v, want %v", m.Addr, from)
	}
	if m.Truncated {
		tb.Errorf("Truncated set on a datagram that fits")
	}
}

// waitGoroutines waits for the goroutine count to come back to base (goroutines end
// asynchronously after Close returns); it fails the test if it never does.
func waitGoroutines(tb testing.TB, base int) {
	tb.Helper()
	for range 500 {
		if runtime.NumGoroutine() <= base {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, 1<<16)
	tb.Fatalf("goroutines: %d, baseline %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
}
