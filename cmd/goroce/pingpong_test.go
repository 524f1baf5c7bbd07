package main

import (
	"bytes"
	"context"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// freeTCPPort returns a TCP port that was free a moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

var (
	ppLocal  = regexp.MustCompile(`(?m)^  local address:  LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}[,:] GID ::ffff:127\.0\.77\.\d$`)
	ppRemote = regexp.MustCompile(`(?m)^  remote address: LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:127\.0\.77\.\d$`)
	ppBytes  = regexp.MustCompile(`(?m)^(\d+) bytes in \d+\.\d\d seconds = \d+\.\d\d Mbit/sec$`)
	ppIters  = regexp.MustCompile(`(?m)^(\d+) iters in \d+\.\d\d seconds = \d+\.\d\d usec/iter$`)
)

// lockedBuffer is a bytes.Buffer one goroutine writes while another reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runPingpongPair runs a goroce pingpong server and client against each other on loopback.
func runPingpongPair(t *testing.T, srv, cli pingpongOptions) (srvOut, cliOut string, srvErr, cliErr error) {
	t.Helper()
	port := freeTCPPort(t)
	srv.port, cli.port = port, port
	srv.addr, cli.addr = "127.0.77.1", "127.0.77.2"
	cli.host = "127.0.0.1"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sb lockedBuffer
	var cb, se bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- pingpong(ctx, &sb, &se, srv) }()
	// The server prints its address once it listens.
	for !strings.Contains(sb.String(), "local address") {
		select {
		case err := <-done:
			t.Fatalf("server ended before listening: %v\n%s", err, sb.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
	cliErr = pingpong(ctx, &cb, &se, cli)
	srvErr = <-done
	return sb.String(), cb.String(), srvErr, cliErr
}

func TestPingpongLoopback(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  int
		mtu   int
		iters int
		typ   goroce.QPType
		chk   bool
	}{
		{"1B", 1, 1024, 200, goroce.RC, false},
		{"4KiB-chk", 4096, 1024, 200, goroce.RC, true},
		{"multipage-mtu4096-chk", 3*4096 + 100, 4096, 100, goroce.RC, true},
		{"64KiB-mtu1024", 65536, 1024, 50, goroce.RC, true},
		{"UC-4KiB", 4096, 1024, 200, goroce.UC, true},
		{"UD-1KiB", 1024, 1024, 200, goroce.UD, false},
		{"UD-2KiB-mtu2048", 2048, 2048, 200, goroce.UD, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := pingpongOptions{size: tc.size, mtu: tc.mtu, iters: tc.iters, rxDepth: 500, qpType: tc.typ, chk: tc.chk}
			so, co, serr, cerr := runPingpongPair(t, o, o)
			if serr != nil || cerr != nil {
				t.Fatalf("server: %v\n%s\nclient: %v\n%s", serr, so, cerr, co)
			}
			for side, out := range map[string]string{"server": so, "client": co} {
				for _, re := range []*regexp.Regexp{ppLocal, ppRemote, ppBytes, ppIters} {
					if !re.MatchString(out) {
						t.Errorf("%s output lacks %v:\n%s", side, re, out)
					}
				}
				if m := ppBytes.FindStringSubmatch(out); m != nil && m[1] != strconv.Itoa(2*tc.size*tc.iters) {
					t.Errorf("%s: %s bytes, want %d", side, m[1], 2*tc.size*tc.iters)
				}
				if m := ppIters.FindStringSubmatch(out); m != nil && m[1] != strconv.Itoa(tc.iters) {
					t.Errorf("%s: %s iters, want %d", side, m[1], tc.iters)
				}
				if strings.Contains(out, "invalid data") {
					t.Errorf("%s: %s", side, out)
				}
			}
		})
	}
}

// TestPingpongCheckCatchesWrongData runs a server with -c against a client without it: the client
// sends its buffer without rc_pingpong's check pattern, so the server must report every page.
func TestPingpongCheckCatchesWrongData(t *testing.T) {
	o := pingpongOptions{size: 2*4096 + 1, mtu: 1024, iters: 10, rxDepth: 16, qpType: goroce.RC}
	srv := o
	srv.chk = true
	so, co, serr, cerr := runPingpongPair(t, srv, o)
	if cerr != nil {
		t.Fatalf("client: %v\n%s", cerr, co)
	}
	if serr == nil {
		t.Fatalf("server with -c accepted a buffer without the pattern:\n%s", so)
	}
	for _, p := range []string{"0", "1", "2"} {
		if !strings.Contains(so, "invalid data in page "+p+"\n") {
			t.Errorf("server output lacks page %s:\n%s", p, so)
		}
	}
}

// TestPingpongDestFormat checks the out-of-band message against one ibv_rc_pingpong sent (captured in
// the rxe lab: QPN 0x11, PSN 0x10b60a, GID ::ffff:10.77.0.12).
func TestPingpongDestFormat(t *testing.T) {
	golden := "0000:000011:10b60a:00000000000000000000ffff0a4d000c\x00"
	if len(golden) != pingpongMsgLen {
		t.Fatalf("golden message is %d bytes, want %d", len(golden), pingpongMsgLen)
	}
	d, err := parsePingpongDest([]byte(golden))
	if err != nil {
		t.Fatal(err)
	}
	if d.qpn != 0x11 || d.psn != 0x10b60a || d.gid.String() != "10.77.0.12" {
		t.Errorf("parsed %+v", d)
	}
	if got := string(d.encode()); got != golden {
		t.Errorf("encode = %q, want %q", got, golden)
	}
	if got, want := d.line("remote address:"), "  remote address: LID 0x0000, QPN 0x000011, PSN 0x10b60a, GID ::ffff:10.77.0.12"; got != want {
		t.Errorf("line = %q, want %q", got, want)
	}
	for _, bad := range []string{"", "0000:000011:10b60a", "0000:1000000:10b60a:00000000000000000000ffff0a4d000c", "0000:000011:10b60a:zz000000000000000000ffff0a4d000c"} {
		if _, err := parsePingpongDest([]byte(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}
