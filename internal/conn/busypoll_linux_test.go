//go:build linux

package conn

import (
	"errors"
	"testing"
	"time"
)

// TestBusyPolling: a busy-polling reader returns a datagram that comes while it polls, and after
// the poll it waits as the socket's own ReadBatch does, deadline included.
func TestBusyPolling(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	r := BusyPolling(b, 200*time.Millisecond)
	if _, ok := r.(*busyPolling); !ok {
		t.Fatalf("BusyPolling of a Poller returned %T", r)
	}
	if c := BusyPolling(b, 0); c != Conn(b) {
		t.Errorf("BusyPolling with no duration returned %T, want the Conn itself", c)
	}
	want := payload(3, 100)
	go func() {
		time.Sleep(5 * time.Millisecond)
		a.WriteBatch([]Message{{Buf: want, Addr: b.LocalAddr()}})
	}()
	msgs := []Message{{Buf: make([]byte, 2048)}}
	n, err := r.ReadBatch(msgs)
	if n != 1 || err != nil {
		t.Fatalf("ReadBatch = %d, %v", n, err)
	}
	checkDatagram(t, msgs[0], want, a.LocalAddr())
	if b.Waited() {
		t.Error("the datagram came by a read that waited in the netpoller, not by polling")
	}

	r = BusyPolling(b, 10*time.Millisecond)
	b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := r.ReadBatch(msgs); !errors.Is(err, ErrDeadline) {
		t.Fatalf("ReadBatch with nothing to read: %v, want ErrDeadline", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Errorf("ReadBatch gave up after %v, before its deadline", d)
	}
}
