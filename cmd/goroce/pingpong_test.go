package main

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/pingpong"
)

// TestPingpongFlags checks that rc_pingpong's flags reach package pingpong's options as the C tools
// read them; the runs themselves are package pingpong's tests.
func TestPingpongFlags(t *testing.T) {
	rc := pingpong.DefaultOptions(goroce.RC)
	withRC := func(f func(*pingpong.Options)) pingpong.Options { o := rc; f(&o); return o }
	ud := pingpong.DefaultOptions(goroce.UD)
	for _, c := range []struct {
		args []string
		host string
		port int
		opts pingpong.Options
	}{
		{nil, "", 18515, rc},
		{[]string{"-p", "9999", "10.0.0.1"}, "10.0.0.1", 9999, rc},
		// The host may stand among the flags, as getopt allows.
		{[]string{"-s", "1", "127.0.0.1", "-n", "7", "-c"}, "127.0.0.1", 18515,
			withRC(func(o *pingpong.Options) { o.Size, o.Iters, o.Check = 1, 7, true })},
		{[]string{"--size", "65536", "--mtu", "4096", "--rx-depth", "16", "-g", "1", "-a", "::ffff:127.0.0.5"}, "", 18515,
			withRC(func(o *pingpong.Options) {
				o.Size, o.MTU, o.RxDepth, o.Addr = 65536, goroce.MTU4096, 16, netip.MustParseAddr("127.0.0.5")
			})},
		{[]string{"-qp-type", "uc"}, "", 18515, pingpong.DefaultOptions(goroce.UC)},
		// ud_pingpong's defaults: 2048-byte datagrams on a 2048-byte MTU, unless the flags say otherwise.
		{[]string{"-qp-type", "ud"}, "", 18515, ud},
		{[]string{"-qp-type", "UD", "-s", "512", "-m", "1024"}, "", 18515,
			func() pingpong.Options { o := ud; o.Size, o.MTU = 512, goroce.MTU1024; return o }()},
	} {
		a, err := parsePingpong(c.args)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if a.host != c.host || a.port != c.port || a.opts != c.opts {
			t.Errorf("%q: host %q port %d options %+v; want %q, %d, %+v", c.args, a.host, a.port, a.opts, c.host, c.port, c.opts)
		}
	}
	if a, err := parsePingpong([]string{"-timeout", "90s"}); err != nil || a.timeout != 90*time.Second {
		t.Errorf("-timeout 90s: %v, %v", a.timeout, err)
	}
	for _, bad := range [][]string{{"-r", "1"}, {"-n", "0"}, {"-s", "0"}, {"-m", "1000"}, {"-p", "70000"}, {"a", "b"}} {
		if _, err := parsePingpong(bad); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want the usage", bad, err)
		}
	}
	for _, bad := range [][]string{{"-odp"}, {"-t"}, {"-qp-type", "xrc"}, {"-qp-type", "ud", "-s", "4096"}, {"-a", "nowhere"}} {
		if _, err := parsePingpong(bad); err == nil || errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want an error", bad, err)
		} else if strings.TrimSpace(err.Error()) == "" {
			t.Errorf("%q: empty error", bad)
		}
	}
}
