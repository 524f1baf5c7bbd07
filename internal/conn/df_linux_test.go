//go:build linux

package conn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// IPv4 header offsets. RFC 791 section 3.1.
const (
	ipv4TOS      = 1
	ipv4ID       = 4
	ipv4FlagsOff = 6
	ipv4FlagDF   = 0x4000
)

// TestUDPDontFragmentIDZero captures, with a raw IPPROTO_UDP socket, datagrams a Conn sends on
// loopback and checks their IPv4 header: DF set and identification 0 (RoCEv2's ICRC covers the
// identification, so it must be predictable), and the TOS asked for.
func TestUDPDontFragmentIDZero(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_UDP)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		t.Skipf("raw socket not permitted: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// A receive timeout keeps the test from hanging if the capture sees nothing; it bounds a
	// wait, it asserts no duration.
	tv := unix.Timeval{Sec: 0, Usec: 200_000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}

	a, b := udpPair(t, loop4, Options{})
	marker := []byte("goroce-df-id-test")
	for _, tos := range []uint8{0, 0xb8} {
		hdr := capture(t, fd, func() {
			if _, err := a.WriteBatch([]Message{{Buf: marker, Addr: b.LocalAddr(), TOS: tos}}); err != nil {
				t.Fatal(err)
			}
		}, b.LocalAddr().Port(), marker)
		id := binary.BigEndian.Uint16(hdr[ipv4ID:])
		flags := binary.BigEndian.Uint16(hdr[ipv4FlagsOff:])
		t.Logf("TOS %#02x: captured IPv4 header %x: id=%d DF=%v TOS=%#02x", tos, hdr, id, flags&ipv4FlagDF != 0, hdr[ipv4TOS])
		if flags&ipv4FlagDF == 0 {
			t.Errorf("DF not set: flags/offset = %#04x", flags)
		}
		if id != 0 {
			t.Errorf("IP identification = %d, want 0", id)
		}
		if hdr[ipv4TOS] != tos {
			t.Errorf("TOS on the wire = %#02x, want %#02x", hdr[ipv4TOS], tos)
		}
	}
}

// capture runs send until the raw socket fd sees a UDP datagram to port carrying marker, and
// returns its IPv4 header.
func capture(t *testing.T, fd int, send func(), port uint16, marker []byte) []byte {
	t.Helper()
	buf := make([]byte, 65536)
	for range 25 { // each attempt waits at most SO_RCVTIMEO
		send()
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				break // timeout: send again
			}
			p := buf[:n]
			if len(p) < 20 {
				continue
			}
			ihl := int(p[0]&0x0f) * 4
			if len(p) < ihl+8 || binary.BigEndian.Uint16(p[ihl+2:]) != port || !bytes.Equal(p[ihl+8:], marker) {
				continue
			}
			return append([]byte(nil), p[:ihl]...)
		}
	}
	t.Fatal("raw socket captured nothing")
	return nil
}
