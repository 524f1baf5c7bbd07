//go:build linux

package goroce

import (
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/goroce/goroce/internal/conn"
	"golang.org/x/sys/unix"
)

// netnsNetwork is a conn.Network whose sockets are opened inside a network namespace of the test's
// own: a goroutine locked to a thread that entered the namespace opens them, and a socket stays in the
// namespace it was created in, whatever thread uses it later.
type netnsNetwork struct {
	req chan func()
}

func (n netnsNetwork) do(f func()) {
	done := make(chan struct{})
	n.req <- func() { f(); close(done) }
	<-done
}

func (n netnsNetwork) Listen(addr netip.AddrPort, opts conn.Options) (c conn.Conn, err error) {
	n.do(func() { c, err = conn.UDP.Listen(addr, opts) })
	return c, err
}

func (n netnsNetwork) ListenShards(addr netip.AddrPort, k int, opts conn.Options) (cs []conn.Conn, err error) {
	n.do(func() { cs, err = conn.UDP.ListenShards(addr, k, opts) })
	return cs, err
}

// newNetns creates a network namespace with the addresses on its loopback and returns a Network
// inside it. Nothing outside the namespace is touched. It skips the test where namespaces cannot be
// made (not root, no iproute2).
func newNetns(t *testing.T, addrs ...netip.Addr) netnsNetwork {
	t.Helper()
	var cmds [][]string
	for _, a := range addrs {
		if a.Is6() {
			cmds = append(cmds, []string{"-6", "addr", "add", a.String() + "/128", "dev", "lo", "nodad"})
		} else {
			cmds = append(cmds, []string{"addr", "add", a.String() + "/32", "dev", "lo"})
		}
	}
	return newNetnsCmds(t, cmds...)
}

// newNetnsCmds is newNetns with the namespace set up by ip commands of the caller's: each is ip's
// arguments, run inside the namespace after lo is up.
func newNetnsCmds(t *testing.T, cmds ...[]string) netnsNetwork {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	n := netnsNetwork{req: make(chan func())}
	setup := make(chan string)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		// The namespace belongs to this OS thread only; the thread is never given back to the
		// runtime, so it dies with the goroutine instead of carrying the namespace elsewhere.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			setup <- "skip: unshare(CLONE_NEWNET): " + err.Error()
			return
		}
		run := func(args ...string) string {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return "ip " + args[0] + ": " + err.Error() + ": " + string(out)
			}
			return ""
		}
		if e := run("link", "set", "lo", "up"); e != "" {
			setup <- e
			return
		}
		for _, c := range cmds {
			if e := run(c...); e != "" {
				setup <- e
				return
			}
		}
		setup <- ""
		for {
			select {
			case f := <-n.req:
				f()
			case <-stop:
				return
			}
		}
	}()
	switch e := <-setup; {
	case len(e) > 5 && e[:5] == "skip:":
		t.Skip(e[5:])
	case e != "":
		t.Fatal(e)
	}
	return n
}

// IPv6 over real sockets: two devices on IPv6 addresses in a namespace of the test's own, every
// opcode, with the ICRC computed over the IPv6 header by one side and checked by the other.
func TestIPv6Netns(t *testing.T) {
	a, b := netip.MustParseAddr("fd00:6f72:6365::1"), netip.MustParseAddr("fd00:6f72:6365::2")
	ns := newNetns(t, a, b)
	p := &testPair{}
	var err error
	p.a, err = Open(Config{Addr: a, Network: rawNetwork{ns}})
	must(t, err)
	defer p.a.Close()
	p.b, err = Open(Config{Addr: b, Network: rawNetwork{ns}})
	must(t, err)
	defer p.b.Close()
	p.connect(t, RC, ConnectOptions{MTU: MTU4096})
	exerciseEveryOpcode(t, p, 20000)
	if s := p.b.Stats(); s.DropICRC != 0 || s.RxPackets == 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Link-local IPv6: a GID carries no zone, so each device gives its peer's link-local address the zone
// of its own. Two devices on the two ends of a veth pair, fe80::1%v0 and fe80::2%v1.
func TestIPv6LinkLocalNetns(t *testing.T) {
	ns := newNetnsCmds(t,
		[]string{"link", "add", "v0", "type", "veth", "peer", "name", "v1"},
		[]string{"link", "set", "v0", "up"}, []string{"link", "set", "v1", "up"},
		[]string{"-6", "addr", "add", "fe80::1/64", "dev", "v0", "nodad"},
		[]string{"-6", "addr", "add", "fe80::2/64", "dev", "v1", "nodad"})
	p := &testPair{}
	var err error
	p.a, err = Open(Config{Addr: netip.MustParseAddr("fe80::1%v0"), Network: rawNetwork{ns}})
	must(t, err)
	defer p.a.Close()
	p.b, err = Open(Config{Addr: netip.MustParseAddr("fe80::2%v1"), Network: rawNetwork{ns}})
	must(t, err)
	defer p.b.Close()
	p.connect(t, RC, ConnectOptions{MTU: MTU1024})
	exerciseEveryOpcode(t, p, 3000)
	if s := p.b.Stats(); s.DropICRC != 0 || s.DropWrongPeer != 0 || s.RxPackets == 0 {
		t.Fatalf("stats %+v", s)
	}
}
