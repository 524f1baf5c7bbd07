//go:build linux

package goroce

import (
	"net/netip"
	"testing"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/internal/netnstest"
)

// netnsNetwork is a conn.Network whose sockets are opened inside a network namespace of the test's
// own (netnstest), where they stay whatever thread uses them later.
type netnsNetwork struct{ ns netnstest.NS }

func (n netnsNetwork) Listen(addr netip.AddrPort, opts conn.Options) (c conn.Conn, err error) {
	n.ns.Do(func() { c, err = conn.UDP.Listen(addr, opts) })
	return c, err
}

func (n netnsNetwork) ListenShards(addr netip.AddrPort, k int, opts conn.Options) (cs []conn.Conn, err error) {
	n.ns.Do(func() { cs, err = conn.UDP.ListenShards(addr, k, opts) })
	return cs, err
}

// newNetns creates a network namespace with the addresses on its loopback and returns a Network
// inside it. It skips the test where namespaces cannot be made (not root, no iproute2).
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
	argvs := make([][]string, len(cmds))
	for i, c := range cmds {
		argvs[i] = append([]string{"ip"}, c...)
	}
	return netnsNetwork{netnstest.New(t, argvs...)}
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
