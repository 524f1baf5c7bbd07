//go:build linux

package goroce

import (
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/wire"
	"golang.org/x/sys/unix"
)

// listenInNetns creates a network namespace of the test's own, gives its loopback the addresses, and
// opens a socket on each of them there. The sockets stay in that namespace; nothing outside it is
// touched. It skips the test where namespaces cannot be made (not root, no iproute2).
func listenInNetns(t *testing.T, addrs ...netip.Addr) []conn.Conn {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	type result struct {
		conns []conn.Conn
		err   error
		skip  string
	}
	done := make(chan result)
	go func() {
		// The namespace belongs to this OS thread only; the thread is never given back to the
		// runtime, so it dies with the goroutine instead of carrying the namespace elsewhere.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{skip: "unshare(CLONE_NEWNET): " + err.Error()}
			return
		}
		run := func(args ...string) error {
			out, err := exec.Command("ip", args...).CombinedOutput()
			if err != nil {
				return &exec.ExitError{Stderr: out}
			}
			return nil
		}
		if err := run("link", "set", "lo", "up"); err != nil {
			done <- result{err: err}
			return
		}
		var r result
		for _, a := range addrs {
			if a.Is6() {
				if err := run("-6", "addr", "add", a.String()+"/128", "dev", "lo", "nodad"); err != nil {
					done <- result{err: err}
					return
				}
			} else if err := run("addr", "add", a.String()+"/32", "dev", "lo"); err != nil {
				done <- result{err: err}
				return
			}
			c, err := conn.Listen(netip.AddrPortFrom(a, DefaultPort), conn.Options{})
			if err != nil {
				r.err = err
				break
			}
			r.conns = append(r.conns, c)
		}
		done <- r
	}()
	r := <-done
	if r.skip != "" {
		t.Skip(r.skip)
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.conns
}

// IPv6 over real sockets: two devices on IPv6 addresses in a namespace of the test's own, every
// opcode, with the ICRC computed over the IPv6 header by one side and checked by the other.
func TestIPv6Netns(t *testing.T) {
	a, b := netip.MustParseAddr("fd00:6f72:6365::1"), netip.MustParseAddr("fd00:6f72:6365::2")
	cs := listenInNetns(t, a, b)
	p := &testPair{}
	var err error
	p.a, err = Open(Config{Addr: a, Conn: cs[0]})
	must(t, err)
	defer p.a.Close()
	p.b, err = Open(Config{Addr: b, Conn: cs[1]})
	must(t, err)
	defer p.b.Close()
	p.connect(t, RC, ConnectOptions{MTU: wire.MTU4096})
	exerciseEveryOpcode(t, p, 20000)
	if s := p.b.Stats(); s.DropICRC != 0 || s.RxPackets == 0 {
		t.Fatalf("stats %+v", s)
	}
}
