//go:build interop

package interop

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/lab"
)

// RoCEv2 over IPv6 against rxe, in both roles, with global (fd77::/64) and link-local GIDs. rxe sends
// its IPv6 datagrams with a zero UDP checksum, which goroce's sockets accept (UDP_NO_CHECK6_RX); the
// out-of-band exchanges still run over IPv4.

// guestGIDIndex returns the index of addr in rxe's GID table in guest g.
func guestGIDIndex(ctx context.Context, t testing.TB, g *lab.Guest, addr netip.Addr) int {
	t.Helper()
	out, err := g.Exec(ctx, `for i in $(seq 0 15); do printf '%s %s\n' $i "$(cat /sys/class/infiniband/rxe0/ports/1/gids/$i 2>/dev/null)"; done`)
	if err != nil {
		t.Fatalf("reading rxe's GID table: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		idx, gid, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if a, err := netip.ParseAddr(gid); err == nil && a == addr.WithZone("") {
			n, _ := strconv.Atoi(idx)
			return n
		}
	}
	t.Fatalf("rxe has no GID %v:\n%s", addr, out)
	return 0
}

// guestLinkLocal returns the guest's link-local address on eth0.
func guestLinkLocal(ctx context.Context, t testing.TB, g *lab.Guest) netip.Addr {
	t.Helper()
	out, err := g.Exec(ctx, "ip -6 -o addr show dev eth0 scope link")
	if err != nil {
		t.Fatalf("ip: %v\n%s", err, out)
	}
	for _, f := range strings.Fields(out) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr().IsLinkLocalUnicast() {
			return p.Addr()
		}
	}
	t.Fatalf("no link-local address in the guest:\n%s", out)
	return netip.Addr{}
}

// ipv6Case is one pair of addresses: goroce's and the guest's.
type ipv6Case struct {
	name          string
	host, guest   netip.Addr
	guestGIDIndex int
}

func ipv6Cases(ctx context.Context, t *testing.T, l *lab.Lab, g *lab.Guest) []ipv6Case {
	ll, err := l.LinkLocal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gll := guestLinkLocal(ctx, t, g)
	return []ipv6Case{
		{"global", netip.MustParseAddr(lab.HostIP6), lab.GuestIP6(g.N), guestGIDIndex(ctx, t, g, lab.GuestIP6(g.N))},
		{"link-local", ll, gll, guestGIDIndex(ctx, t, g, gll)},
	}
}

var gidLine = regexp.MustCompile(`(?m)^  (local|remote) address: .* GID ([0-9a-f:.]+)$`)

// checkGIDs checks that a pingpong side printed the IPv6 GIDs it was meant to use.
func checkGIDs(t testing.TB, who, out string, local, remote netip.Addr) {
	t.Helper()
	want := map[string]netip.Addr{"local": local.WithZone(""), "remote": remote.WithZone("")}
	for _, m := range gidLine.FindAllStringSubmatch(out, -1) {
		a, err := netip.ParseAddr(m[2])
		if err != nil || a != want[m[1]] {
			t.Errorf("%s: %s GID %s, want %v", who, m[1], m[2], want[m[1]])
		}
		delete(want, m[1])
	}
	if len(want) != 0 {
		t.Errorf("%s printed no GID line for %v:\n%s", who, want, out)
	}
}

// TestIPv6Pingpong: ibv_rc_pingpong over an IPv6 GID, goroce as client and as server.
func TestIPv6Pingpong(t *testing.T) {
	l, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := pingpongCase{size: 65536, mtu: 1024, iters: 20}
	for i, v := range ipv6Cases(ctx, t, l, g) {
		t.Run(v.name+"/goroce-client", onGuest(g, nil, func(t testing.TB) {
			port := 19215 + 2*i
			srv := execBackground(ctx, g, fmt.Sprintf("timeout 90 %s -d rxe0 -g %d -p %d %s", c.tool(), v.guestGIDIndex, port, strings.Join(c.flags(), " ")))
			if err := waitListen(ctx, g, port); err != nil {
				t.Fatalf("%s does not listen: %v", c.tool(), err)
			}
			args := []string{"pingpong", "-g", "1", "-a", v.host.String(), "-p", strconv.Itoa(port), "-timeout", "90s"}
			cout, cerr := lab.NSCommand(ctx, goroceBin, append(append(args, c.flags()...), g.IP.String())...).CombinedOutput()
			s := <-srv
			t.Logf("goroce pingpong (client):\n%s", cout)
			t.Logf("%s (server):\n%s", c.tool(), s.out)
			if cerr != nil || s.err != nil {
				t.Fatalf("goroce pingpong: %v; %s: %v", cerr, c.tool(), s.err)
			}
			checkGIDs(t, "goroce pingpong", string(cout), v.host, v.guest)
			checkGIDs(t, c.tool(), s.out, v.guest, v.host)
		}))
		t.Run(v.name+"/goroce-server", onGuest(g, nil, func(t testing.TB) {
			port := 19216 + 2*i
			args := []string{"pingpong", "-g", "1", "-a", v.host.String(), "-p", strconv.Itoa(port), "-timeout", "90s"}
			sout, waited := startGoroce(ctx, t, "local address", append(args, c.flags()...))
			out, cerr := g.Exec(ctx, fmt.Sprintf("timeout 90 %s -d rxe0 -g %d -p %d %s %s", c.tool(), v.guestGIDIndex, port, strings.Join(c.flags(), " "), lab.HostIP))
			serr := <-waited
			t.Logf("goroce pingpong (server):\n%s", sout.String())
			t.Logf("%s (client):\n%s", c.tool(), out)
			if serr != nil || cerr != nil {
				t.Fatalf("goroce pingpong: %v; %s: %v", serr, c.tool(), cerr)
			}
			checkGIDs(t, "goroce pingpong", sout.String(), v.host, v.guest)
			checkGIDs(t, c.tool(), out, v.guest, v.host)
		}))
	}
	if n := udp6CsumErrors(ctx, t); n != 0 {
		t.Errorf("the namespace's kernel dropped %d IPv6 datagrams for their checksum (Udp6InCsumErrors)", n)
	}
}

// udp6CsumErrors returns the namespace's Udp6InCsumErrors counter.
func udp6CsumErrors(ctx context.Context, t testing.TB) int {
	out, err := lab.NSCommand(ctx, "cat", "/proc/net/snmp6").CombinedOutput()
	if err != nil {
		t.Fatalf("snmp6: %v", err)
	}
	m := regexp.MustCompile(`(?m)^Udp6InCsumErrors\s+(\d+)$`).FindSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestIPv6Perftest: ib_write_bw and ib_read_bw over the IPv6 GID (-x), goroce as client and server.
func TestIPv6Perftest(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	gix := guestGIDIndex(ctx, t, g, lab.GuestIP6(g.N))
	for i, test := range []string{"write_bw", "read_bw"} {
		args := "-s 65536 -n 30 -m 4096"
		t.Run(test+"/goroce-client", onGuest(g, nil, func(t testing.TB) {
			port := 19315 + 2*i
			srv := execBackground(ctx, g, fmt.Sprintf("timeout 90 ib_%s -d rxe0 -x %d -p %d %s", test, gix, port, args))
			if err := waitListen(ctx, g, port); err != nil {
				t.Fatalf("ib_%s does not listen: %v", test, err)
			}
			cmd := append([]string{"perf", test, "-x", "1", "-addr", lab.HostIP6, "-p", strconv.Itoa(port), "-timeout", "90s"}, strings.Fields(args)...)
			cout, cerr := lab.NSCommand(ctx, goroceBin, append(cmd, g.IP.String())...).CombinedOutput()
			s := <-srv
			t.Logf("goroce perf %s (client):\n%s", test, cout)
			t.Logf("ib_%s (server):\n%s", test, s.out)
			if cerr != nil || s.err != nil {
				t.Fatalf("goroce perf: %v; ib_%s: %v", cerr, test, s.err)
			}
			if !perftestBWResult.MatchString(string(cout)) || !perftestBWResult.MatchString(s.out) {
				t.Fatal("a side printed no result line")
			}
		}))
		t.Run(test+"/goroce-server", onGuest(g, nil, func(t testing.TB) {
			port := 19316 + 2*i
			sout, waited := startGoroce(ctx, t, "Waiting for client",
				append([]string{"perf", test, "-x", "1", "-addr", lab.HostIP6, "-p", strconv.Itoa(port), "-timeout", "90s"}, strings.Fields(args)...))
			out, cerr := g.Exec(ctx, fmt.Sprintf("timeout 90 ib_%s -d rxe0 -x %d -p %d %s %s", test, gix, port, args, lab.HostIP))
			serr := <-waited
			t.Logf("goroce perf %s (server):\n%s", test, sout.String())
			t.Logf("ib_%s (client):\n%s", test, out)
			if serr != nil || cerr != nil {
				t.Fatalf("goroce perf: %v; ib_%s: %v", serr, test, cerr)
			}
			if !perftestBWResult.MatchString(out) {
				t.Fatal("ib_" + test + " printed no result line")
			}
		}))
	}
}

// TestIPv6Rdmacheck: the rdmacheck checks (SEND with immediate, WRITE, WRITE with immediate, READ, both
// atomics, every byte checked on both sides) over IPv6 GIDs, global and link-local, goroce as client
// and as server.
func TestIPv6Rdmacheck(t *testing.T) {
	l, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	install := func(t testing.TB) { installRdmacheck(t, g) }
	install(t)
	port := 19415
	for _, v := range ipv6Cases(ctx, t, l, g) {
		for _, role := range []string{"goroce-client", "goroce-server"} {
			port++
			t.Run(v.name+"/"+role, onGuest(g, install, func(t testing.TB) {
				runRdmacheckGID(t, g, role, 4096, port, 90*time.Second, v.host, v.guestGIDIndex)
			}))
		}
	}
	if n := udp6CsumErrors(ctx, t); n != 0 {
		t.Errorf("the namespace's kernel dropped %d IPv6 datagrams for their checksum (Udp6InCsumErrors)", n)
	}
}
