//go:build linux

package conn

import (
	"bufio"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
)

// TestSendOnly: a send-only socket sends what an ordinary one does, refuses reads with
// ErrSendOnly, and is not among the descriptors the Go runtime's epoll instance watches, while an
// ordinary socket is.
func TestSendOnly(t *testing.T) {
	forEachFamily(t, func(t *testing.T, addr netip.AddrPort) {
		r, _ := udpPair(t, addr, Options{GRO: true})
		s, err := ListenUDP(addr, Options{SendOnly: true, GSO: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()

		one, two := payload(1, 300), payload(2, 1200)
		msgs := []Message{
			{Buf: one, Addr: r.LocalAddr()},
			{Pieces: [][]byte{two[:100], two[100:]}, Addr: r.LocalAddr()},
		}
		if n, err := s.WriteBatch(msgs); n != 2 || err != nil {
			t.Fatalf("WriteBatch = %d, %v", n, err)
		}
		got := readN(t, r, 2, 2048)
		checkDatagram(t, got[0], one, s.LocalAddr())
		checkDatagram(t, got[1], two, s.LocalAddr())

		buf := []Message{{Buf: make([]byte, 2048)}}
		if _, err := s.ReadBatch(buf); !errors.Is(err, ErrSendOnly) {
			t.Errorf("ReadBatch on a send-only socket: %v, want ErrSendOnly", err)
		}
		if _, err := s.PollBatch(buf); !errors.Is(err, ErrSendOnly) {
			t.Errorf("PollBatch on a send-only socket: %v, want ErrSendOnly", err)
		}

		watched := epollWatched(t)
		if fd := sysfd(t, s); watched[fd] {
			t.Errorf("the send-only socket (fd %d) is in the netpoller's epoll set %v", fd, watched)
		}
		if fd := sysfd(t, r); !watched[fd] {
			t.Errorf("the ordinary socket (fd %d) is not in the netpoller's epoll set %v: the check cannot tell", fd, watched)
		}
	})
}

// TestSendOnlyWaitsForRoom fills a send-only socket's send buffer behind a slow queue (a veth in a
// network namespace of the test's own, shaped by tbf to 8 kbit/s): a write then waits, and goes on
// once the queue is removed and its datagrams freed, sending everything; a write waiting so ends
// with ErrClosed when the socket is closed.
func TestSendOnlyWaitsForRoom(t *testing.T) {
	shape := []string{"tc", "qdisc", "add", "dev", "v0", "root", "tbf", "rate", "8kbit", "burst", "1600", "limit", "10000000"}
	unshape := []string{"tc", "qdisc", "del", "dev", "v0", "root"}
	ns := netnstest.NewOrSkip(t,
		[]string{"ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"},
		[]string{"ip", "link", "set", "v0", "up"},
		[]string{"ip", "link", "set", "v1", "up"},
		[]string{"ip", "addr", "add", "10.99.0.1/24", "dev", "v0"},
		[]string{"ip", "neigh", "add", "10.99.0.2", "lladdr", "02:00:00:00:00:02", "dev", "v0", "nud", "permanent"},
		shape,
	)
	var s *UDPConn
	var err error
	ns.Do(func() {
		s, err = ListenUDP(netip.MustParseAddrPort("10.99.0.1:0"), Options{SendOnly: true, SendBuffer: 4096})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msgs := make([]Message, 64)
	for i := range msgs {
		msgs[i] = Message{Buf: payload(i, 1000), Addr: netip.MustParseAddrPort("10.99.0.2:9")}
	}
	write := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			n, err := s.WriteBatch(msgs)
			if err == nil && n != len(msgs) {
				err = errors.New("WriteBatch sent " + strconv.Itoa(n) + " of " + strconv.Itoa(len(msgs)))
			}
			done <- err
		}()
		return done
	}

	done := write()
	select {
	case err := <-done:
		t.Fatalf("WriteBatch of 64 KB into a 4 KB send buffer behind an 8 kbit/s queue returned at once: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	ns.Run(t, unshape...)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WriteBatch still waits after the queue was removed")
	}
	if st := s.Stats(); st.DatagramsOut != uint64(len(msgs)) {
		t.Errorf("DatagramsOut = %d, want %d", st.DatagramsOut, len(msgs))
	}

	ns.Run(t, shape...)
	done = write()
	select {
	case err := <-done:
		t.Fatalf("second WriteBatch returned at once: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("WriteBatch waiting for room, then Close: %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a WriteBatch waiting for room")
	}
}

// sysfd returns c's descriptor.
func sysfd(t *testing.T, c *UDPConn) int {
	t.Helper()
	var fd int
	if err := c.raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// epollWatched returns the descriptors this process's epoll instances watch, read from
// /proc/self/fdinfo (a "tfd:" line per watched descriptor).
func epollWatched(t *testing.T) map[int]bool {
	t.Helper()
	links, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	watched := map[int]bool{}
	for _, l := range links {
		if target, err := os.Readlink(l); err != nil || target != "anon_inode:[eventpoll]" {
			continue
		}
		f, err := os.Open("/proc/self/fdinfo/" + filepath.Base(l))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) >= 2 && fields[0] == "tfd:" {
				if fd, err := strconv.Atoi(fields[1]); err == nil {
					watched[fd] = true
				}
			}
		}
		f.Close()
	}
	if len(watched) == 0 {
		t.Skip("no epoll instance to read in /proc/self/fdinfo")
	}
	return watched
}
