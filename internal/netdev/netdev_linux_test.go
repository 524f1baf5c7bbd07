//go:build linux

package netdev

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/goroce/goroce/internal/netnstest"
	"golang.org/x/sys/unix"
)

func TestEgressLoopback4(t *testing.T) {
	d, err := Egress(netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	checkLoopback(t, d)
}

func TestEgressLoopback6(t *testing.T) {
	if !hasLoopback6() {
		t.Skip("lo has no ::1")
	}
	d, err := Egress(netip.IPv6Loopback())
	if err != nil {
		t.Fatal(err)
	}
	checkLoopback(t, d)
}

// An IPv4-mapped IPv6 address routes as the IPv4 address it maps.
func TestEgressMapped(t *testing.T) {
	d, err := Egress(netip.MustParseAddr("::ffff:127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	checkLoopback(t, d)
}

func checkLoopback(t *testing.T, d Device) {
	t.Helper()
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "lo" || d.Index != lo.Index {
		t.Fatalf("egress device %+v, want lo (index %d)", d, lo.Index)
	}
	if d.Hardware {
		t.Errorf("lo reported as hardware: %+v", d)
	}
	if !d.SegmentsInSoftware() {
		t.Errorf("lo reported as segmenting in hardware: %+v", d)
	}
	// lo has carried tx-udp-segmentation, in NETIF_F_GSO_SOFTWARE, since UDP GSO appeared (4.18).
	if !d.USO {
		t.Errorf("lo without tx-udp-segmentation active: %+v", d)
	}
	names, _, err := features("lo")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, featureUSO) || !slices.Contains(names, "tx-scatter-gather") {
		t.Fatalf("lo's %d feature names lack %q or tx-scatter-gather: %q", len(names), featureUSO, names)
	}
}

func hasLoopback6() bool {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return false
	}
	addrs, err := lo.Addrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(net.IPv6loopback) {
			return true
		}
	}
	return false
}

func TestEgressInvalid(t *testing.T) {
	_, err := Egress(netip.Addr{})
	if !errors.Is(err, ErrInvalidAddr) {
		t.Fatalf("zero address: %v, want ErrInvalidAddr", err)
	}
	_, err = Egress(netip.MustParseAddr("fe80::1%no-such-if0"))
	if !errors.Is(err, ErrInvalidAddr) {
		t.Fatalf("unknown zone: %v, want ErrInvalidAddr", err)
	}
}

// Every device of the test's namespace: the parent that rtnetlink reports agrees with sysfs (which
// is this namespace's here), and the feature read works.
func TestDevicesAgreeWithSysfs(t *testing.T) {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifi := range ifs {
		d, err := byIndex(ifi.Index)
		if err != nil {
			t.Errorf("%s: %v", ifi.Name, err)
			continue
		}
		name, parent, err := link(ifi.Index)
		if err != nil {
			t.Fatal(err)
		}
		_, statErr := os.Stat("/sys/class/net/" + ifi.Name + "/device")
		sysfs := statErr == nil
		t.Logf("%+v (netlink parent %v, sysfs device %v, software segmentation %v)", d, parent, sysfs, d.SegmentsInSoftware())
		if d.Name != ifi.Name || name != ifi.Name {
			t.Errorf("index %d: names %q, %q, want %q", ifi.Index, d.Name, name, ifi.Name)
		}
		if d.Hardware != sysfs {
			t.Errorf("%s: Hardware %v, sysfs device link %v", ifi.Name, d.Hardware, sysfs)
		}
	}
}

// A veth in a namespace of the test's own: routes through it, to a local address (lo), and the
// errors for destinations without a usable route.
func TestEgressNetns(t *testing.T) {
	// A kernel without veth skips the test; any other command that fails fails it.
	ns := netnstest.NewOrSkip(t, []string{"ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"})
	for _, args := range [][]string{
		{"addr", "add", "10.99.0.1/24", "dev", "veth0"},
		{"-6", "addr", "add", "fd00:99::1/64", "dev", "veth0", "nodad"},
		{"link", "set", "veth0", "up"},
		{"link", "set", "veth1", "up"},
		{"route", "add", "10.98.0.0/24", "via", "10.99.0.2", "dev", "veth0"},
		{"route", "add", "blackhole", "10.97.0.0/24"},
		{"route", "add", "prohibit", "10.96.0.0/24"},
		{"-6", "route", "add", "unreachable", "2001:db8:2::/48"},
	} {
		ns.Run(t, append([]string{"ip"}, args...)...)
	}
	ns.Do(func() {
		veth0, err := net.InterfaceByName("veth0")
		if err != nil {
			t.Error(err)
			return
		}
		for _, dst := range []string{"10.99.0.2", "10.98.0.7", "::ffff:10.99.0.2", "fd00:99::2", "fe80::1%veth0"} {
			d, err := Egress(netip.MustParseAddr(dst))
			if err != nil {
				t.Errorf("%s: %v", dst, err)
				continue
			}
			t.Logf("%s: %+v", dst, d)
			if d.Name != "veth0" || d.Index != veth0.Index || d.Hardware || !d.SegmentsInSoftware() {
				t.Errorf("%s: %+v, want veth0 (index %d), not hardware, software segmentation", dst, d, veth0.Index)
			}
		}
		d, err := Egress(netip.MustParseAddr("10.99.0.1"))
		if err != nil || d.Name != "lo" || d.Hardware {
			t.Errorf("local address 10.99.0.1: %+v, %v; want lo", d, err)
		}
		for dst, errno := range map[string]error{
			"192.0.2.1":        unix.ENETUNREACH, // no route at all: the namespace has no default
			"2001:db8::1":      unix.ENETUNREACH,
			"2001:db8:2::1":    unix.EHOSTUNREACH, // unreachable route
			"10.97.0.1":        unix.EINVAL,       // blackhole route
			"10.96.0.1":        unix.EACCES,       // prohibit route
			"::ffff:10.97.0.1": unix.EINVAL,
		} {
			_, err := Egress(netip.MustParseAddr(dst))
			if !errors.Is(err, ErrNoRoute) || !errors.Is(err, errno) {
				t.Errorf("%s: %v, want ErrNoRoute and %v", dst, err, errno)
			} else if !strings.HasPrefix(err.Error(), "netdev: egress device for "+dst+": ") {
				t.Errorf("%s: error %q", dst, err)
			}
		}
	})
}

// The ethtool replies, built by hand: string set count, names, feature words.
func TestParseEthtool(t *testing.T) {
	ne := binary.NativeEndian

	info := make([]byte, ssetInfoSize)
	ne.PutUint64(info[8:], 1<<ethSSFeatures)
	ne.PutUint32(info[16:], 3)
	if n, err := parseSsetInfo(info); err != nil || n != 3 {
		t.Fatalf("sset info: %d, %v", n, err)
	}
	ne.PutUint64(info[8:], 0) // the kernel cleared the bit: no such set
	if _, err := parseSsetInfo(info); err == nil {
		t.Fatal("sset info without the features bit accepted")
	}
	ne.PutUint64(info[8:], 1<<ethSSFeatures)
	ne.PutUint32(info[16:], 0)
	if _, err := parseSsetInfo(info); err == nil {
		t.Fatal("zero feature count accepted")
	}

	full := strings.Repeat("x", ethGStringLen) // a name filling its slot has no NUL
	strs := make([]byte, gstringsHeader+3*ethGStringLen)
	ne.PutUint32(strs[0:], unix.ETHTOOL_GSTRINGS)
	ne.PutUint32(strs[4:], ethSSFeatures)
	ne.PutUint32(strs[8:], 3)
	copy(strs[gstringsHeader:], "tx-scatter-gather")
	copy(strs[gstringsHeader+ethGStringLen:], featureUSO)
	copy(strs[gstringsHeader+2*ethGStringLen:], full)
	names, err := parseStrings(strs, 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"tx-scatter-gather", featureUSO, full}; !slices.Equal(names, want) {
		t.Fatalf("names %q, want %q", names, want)
	}
	if _, err := parseStrings(strs, 4); err == nil {
		t.Fatal("names with a changed count accepted")
	}
	ne.PutUint32(strs[8:], 4)
	if _, err := parseStrings(strs, 4); err == nil {
		t.Fatal("names past the buffer accepted")
	}

	// Two blocks; feature 37 (block 1, bit 5) active, feature 36 available but not active, and
	// feature 5 set in every word but the active one.
	gf := make([]byte, gfeaturesHeader+2*featureBlock)
	ne.PutUint32(gf[0:], unix.ETHTOOL_GFEATURES)
	ne.PutUint32(gf[4:], 2)
	ne.PutUint32(gf[gfeaturesHeader+featureBlock+activeOffset:], 1<<5)
	ne.PutUint32(gf[gfeaturesHeader+featureBlock:], 1<<4)
	ne.PutUint32(gf[gfeaturesHeader:], 1<<5)
	ne.PutUint32(gf[gfeaturesHeader+4:], 1<<5)
	ne.PutUint32(gf[gfeaturesHeader+12:], 1<<5)
	for bit, want := range map[int]bool{37: true, 36: false, 5: false, 0: false, 63: false} {
		if got, err := activeBit(gf, bit); err != nil || got != want {
			t.Errorf("bit %d: %v, %v; want %v", bit, got, err, want)
		}
	}
	for _, bit := range []int{64, -1} {
		if _, err := activeBit(gf, bit); err == nil {
			t.Errorf("bit %d beyond the reply accepted", bit)
		}
	}
	ne.PutUint32(gf[4:], 1) // the kernel has one block only: the second is not its answer
	if _, err := activeBit(gf, 37); err == nil {
		t.Error("bit in a block the kernel did not fill accepted")
	}
	ne.PutUint32(gf[4:], 9) // the kernel has more blocks than were asked for
	if got, err := activeBit(gf, 37); err != nil || !got {
		t.Errorf("bit 37 with a larger kernel count: %v, %v", got, err)
	}

	// No input, however short, panics.
	for _, b := range [][]byte{info, strs, gf} {
		for i := range b {
			parseSsetInfo(b[:i])
			parseStrings(b[:i], 3)
			activeBit(b[:i], 37)
		}
	}
}

// The netlink replies, built by hand.
func TestParseNetlink(t *testing.T) {
	ne := binary.NativeEndian
	msg := func(typ uint16, seq uint32, body []byte) []byte {
		b := ne.AppendUint32(nil, uint32(unix.SizeofNlMsghdr+len(body)))
		b = ne.AppendUint16(b, typ)
		b = ne.AppendUint16(b, 0)
		b = ne.AppendUint32(b, seq)
		b = ne.AppendUint32(b, 0)
		b = append(b, body...)
		return append(b, make([]byte, align4(len(b))-len(b))...)
	}

	route := make([]byte, unix.SizeofRtMsg)
	route[0], route[1], route[7] = unix.AF_INET, 32, unix.RTN_UNICAST
	route = appendAttr(route, unix.RTA_TABLE, ne.AppendUint32(nil, 254))
	route = appendAttr(route, unix.RTA_DST, []byte{10, 0, 0, 1})
	route = appendAttr(route, unix.RTA_OIF, ne.AppendUint32(nil, 7))
	dgram := append(msg(unix.RTM_NEWROUTE, 9, nil), msg(unix.RTM_NEWROUTE, 1, route)...)
	body, found, err := findReply(dgram, 1, unix.RTM_NEWROUTE)
	if err != nil || !found {
		t.Fatalf("reply: found %v, %v", found, err)
	}
	if oif, err := parseRoute(body); err != nil || oif != 7 {
		t.Fatalf("output interface %d, %v; want 7", oif, err)
	}
	if _, found, _ := findReply(msg(unix.RTM_NEWROUTE, 2, route), 1, unix.RTM_NEWROUTE); found {
		t.Fatal("reply to another request taken")
	}

	code := -int32(unix.ENETUNREACH)
	nack := msg(unix.NLMSG_ERROR, 1, ne.AppendUint32(make([]byte, 0, 20), uint32(code)))
	if _, found, err := findReply(nack, 1, unix.RTM_NEWROUTE); !found || !errors.Is(err, unix.ENETUNREACH) {
		t.Fatalf("error reply: found %v, %v", found, err)
	}

	black := slices.Clone(route)
	black[7] = unix.RTN_BLACKHOLE
	if _, err := parseRoute(black); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("blackhole route: %v", err)
	}
	noOIF := make([]byte, unix.SizeofRtMsg)
	if _, err := parseRoute(noOIF); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("route without output interface: %v", err)
	}

	lnk := make([]byte, unix.SizeofIfInfomsg)
	ne.PutUint32(lnk[4:], 4)
	lnk = appendAttr(lnk, unix.IFLA_IFNAME, []byte("eth0\x00"))
	lnk = appendAttr(lnk, unix.IFLA_PARENT_DEV_BUS_NAME, []byte("virtio\x00"))
	lnk = appendAttr(lnk, unix.IFLA_PARENT_DEV_NAME, []byte("virtio2\x00"))
	if name, parent, err := parseLink(lnk, 4); err != nil || name != "eth0" || !parent {
		t.Fatalf("link: %q, %v, %v", name, parent, err)
	}
	if _, _, err := parseLink(lnk, 5); err == nil {
		t.Fatal("link reply for another interface accepted")
	}

	if _, err := parseAttrs([]byte{2, 0, 1, 0}); err == nil {
		t.Fatal("attribute shorter than its header accepted")
	}

	// No input, however short or corrupt, panics.
	for _, b := range [][]byte{dgram, nack, lnk} {
		for i := range b {
			findReply(b[:i], 1, unix.RTM_NEWROUTE)
			parseRoute(b[:i])
			parseLink(b[:i], 4)
			c := slices.Clone(b)
			c[i] ^= 0xff
			if _, _, err := findReply(c, 1, unix.RTM_NEWROUTE); err == nil {
				if body, _, _ := findReply(c, 1, unix.RTM_NEWROUTE); body != nil {
					parseRoute(body)
				}
			}
			parseLink(c, 4)
		}
	}
}
