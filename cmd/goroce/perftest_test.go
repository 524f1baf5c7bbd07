package main

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/perftest"
)

// TestPerftestFlags checks that perftest's flags reach package perftest's options as perftest reads
// them; the runs themselves are package perftest's tests.
func TestPerftestFlags(t *testing.T) {
	mod := func(test perftest.Test, f func(*perftest.Options)) perftest.Options {
		o := perftest.DefaultOptions(test)
		f(&o)
		return o
	}
	for _, c := range []struct {
		test  perftest.Test
		args  []string
		host  string
		port  int
		stats bool
		opts  perftest.Options
	}{
		{perftest.WriteBW, nil, "", 18515, false, perftest.DefaultOptions(perftest.WriteBW)},
		{perftest.ReadLat, []string{"-x", "1", "-p", "9000", "10.77.0.11", "-s", "8192", "-n", "50", "-m", "1024", "-stats"}, "10.77.0.11", 9000, true,
			mod(perftest.ReadLat, func(o *perftest.Options) { o.GIDIndex, o.Size, o.Iters, o.MTU = 1, 8192, 50, goroce.MTU1024 })},
		{perftest.AtomicBW, []string{"-A", "CMP_AND_SWAP", "-o", "16", "--addr", "127.0.0.9"}, "", 18515, false,
			mod(perftest.AtomicBW, func(o *perftest.Options) {
				o.AtomicCAS, o.OutReads, o.Addr = true, 16, netip.MustParseAddr("127.0.0.9")
			})},
		{perftest.SendLat, []string{"-a", "-t", "4", "-r", "8", "-Q", "2", "-F", "-e"}, "", 18515, false,
			mod(perftest.SendLat, func(o *perftest.Options) { o.All, o.TxDepth, o.RxDepth, o.CQMod = true, 4, 8, 2 })},
	} {
		a, err := parsePerftest(c.test, c.args)
		if err != nil {
			t.Errorf("%s %q: %v", c.test, c.args, err)
			continue
		}
		if a.host != c.host || a.port != c.port || a.stats != c.stats || a.opts != c.opts {
			t.Errorf("%s %q: host %q port %d stats %v options %+v; want %q, %d, %v, %+v",
				c.test, c.args, a.host, a.port, a.stats, a.opts, c.host, c.port, c.stats, c.opts)
		}
		if err := a.opts.Validate(); err != nil {
			t.Errorf("%s %q: the package refuses the options: %v", c.test, c.args, err)
		}
	}
	for _, bad := range [][]string{{"-n", "1"}, {"-o", "129"}, {"-s", "0"}, {"-t", "0"}} {
		if _, err := parsePerftest(perftest.WriteBW, bad); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want the usage", bad, err)
		}
	}
	for _, bad := range [][]string{{"-R"}, {"-D", "5"}, {"-q", "2"}, {"-c", "UD"}, {"-A", "SWAP"}, {"-m", "1000"}, {"-addr", "x"}} {
		if _, err := parsePerftest(perftest.WriteBW, bad); err == nil || errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want an error", bad, err)
		}
	}
	if _, err := parsePerftest(perftest.AtomicBW, []string{"-a"}); err == nil {
		t.Error("-a accepted for atomic_bw")
	}
	if findPerftest("ib_send_bw") == nil || *findPerftest("send_bw") != perftest.SendBW || findPerftest("loopback") != nil {
		t.Error("findPerftest")
	}
}
