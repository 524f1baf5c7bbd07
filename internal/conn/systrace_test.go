//go:build goroce_systrace

package conn

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

// TestSyscallProfile plays a raw ping-pong and checks what SyscallProfile counts: a sendmmsg and a
// recvmmsg with data per datagram, a receive-to-send span for each datagram answered, a
// send-to-peer's-read span for each datagram read, and nothing left over for the next call.
func TestSyscallProfile(t *testing.T) {
	a, b := udpPair(t, loop4, Options{})
	SyscallProfile() // what came before
	const rounds = 200
	if _, err := RawPingPong(context.Background(), a, b, 64, rounds); err != nil {
		t.Fatal(err)
	}
	p := SyscallProfile()
	t.Log("\n" + p)
	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(p), "\n") {
		name, rest, _ := strings.Cut(line, "  ")
		f := strings.Fields(rest)
		if len(f) == 0 {
			t.Fatalf("line %q", line)
		}
		n, err := strconv.Atoi(f[0])
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		counts[strings.TrimSpace(name)] = n
	}
	// Each round trip is two datagrams, each sent once and read once; RawPingPong may add a few of
	// its own (a warm-up, the end), so the counts are bounds.
	for _, k := range []string{"sendmmsg", "recvmmsg with data"} {
		if counts[k] < 2*rounds || counts[k] > 2*rounds+16 {
			t.Errorf("%s: %d, want about %d", k, counts[k], 2*rounds)
		}
	}
	if counts["receive to send"] < rounds {
		t.Errorf("receive to send: %d spans, want at least %d", counts["receive to send"], rounds)
	}
	if n := counts["send to peer's read"]; n < 2*rounds-1 || n > counts["sendmmsg"] {
		t.Errorf("send to peer's read: %d spans, want one for each of the %d datagrams read", n, 2*rounds)
	}
	if p := SyscallProfile(); p != "" {
		t.Errorf("a second call reported %q, want nothing", p)
	}
}
