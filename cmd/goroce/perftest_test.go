package main

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// A key message ib_write_bw -x 1 sent in the rxe-lab capture write_bw_oob.pcap.
const perftestGoldenKey = "0000:0001:000012:f73ab6:000003cd:0000562c8ac9c000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:"

func TestPerftestKeyMessage(t *testing.T) {
	b := make([]byte, perftestKeyLen)
	copy(b, perftestGoldenKey)
	d, err := parsePerftestDest(b)
	if err != nil {
		t.Fatal(err)
	}
	want := perftestDest{outReads: 1, qpn: 0x12, psn: 0xf73ab6, rkey: 0x3cd, vaddr: 0x562c8ac9c000,
		gid: goroce.GIDFromAddr(netip.MustParseAddr("::ffff:10.77.0.12"))}
	if d != want {
		t.Fatalf("parsed %+v, want %+v", d, want)
	}
	if got := d.encode(); string(got) != string(b) {
		t.Fatalf("encode = %q, want %q", got, b)
	}
}

func TestPerftestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v, min string
		want   bool
	}{{"6.06", "5.32", true}, {"5.31", "5.32", false}, {"5.4", "5.31", false}, {"5.1", "5.1", true}, {"6.06", "5.33", true}} {
		if got := perftestVersionAtLeast(c.v, c.min); got != c.want {
			t.Errorf("perftestVersionAtLeast(%q, %q) = %v", c.v, c.min, got)
		}
	}
}

func TestCAltHex(t *testing.T) {
	// As perftest prints them: "LID 0000 QPN 0x0011 PSN 0x7ce18e RKey 0x00021c VAddr 0x0055e66e476000".
	for _, c := range []struct {
		v     uint64
		width int
		want  string
	}{{0, 4, "0000"}, {0x11, 6, "0x0011"}, {0x7ce18e, 6, "0x7ce18e"}, {0x21c, 8, "0x00021c"}, {0x55e66e476000, 16, "0x0055e66e476000"}} {
		if got := cAltHex(c.v, c.width); got != c.want {
			t.Errorf("cAltHex(%#x, %d) = %q, want %q", c.v, c.width, got, c.want)
		}
	}
}

var (
	perftestBWLine  = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+(\d+\.\d{6})$`)
	perftestLatLine = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)(\s+\d+\.\d\d){7}\s*$`)
)

// runPerftestPair runs goroce perf <test> as server and client against each other on loopback.
func runPerftestPair(t *testing.T, name string, o perftestOptions) (srvOut, cliOut string) {
	t.Helper()
	test := findPerftest(name)
	if test == nil {
		t.Fatalf("no test %s", name)
	}
	port := freeTCPPort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, cli := o, o
	srv.port, cli.port = port, port
	srv.addr, cli.addr = "127.0.78.1", "127.0.78.2"
	cli.host = "127.0.0.1"
	var sout, cout lockedBuffer
	errc := make(chan error, 1)
	go func() { errc <- perftest(ctx, &sout, test, srv) }()
	for !strings.Contains(sout.String(), "Waiting for client") {
		time.Sleep(5 * time.Millisecond)
	}
	cerr := perftest(ctx, &cout, test, cli)
	serr := <-errc
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v\n%s\nserver: %v\n%s", cerr, cout.String(), serr, sout.String())
	}
	return sout.String(), cout.String()
}

func perftestDefaults(size, iters int) perftestOptions {
	return perftestOptions{size: size, iters: iters, gidx: 1, txDepth: 128, rxDepth: 512, cqMod: 100, outReads: 128, mtu: 1024}
}

func TestPerftestLoopback(t *testing.T) {
	cases := []struct {
		name      string
		size      int
		cas, all  bool
		srvResult bool // the server prints a result line
		same      bool // ... and it is the client's (bandwidth reports)
	}{
		{name: "write_bw", size: 65536, srvResult: true, same: true},
		{name: "read_bw", size: 10000, srvResult: true, same: true},
		{name: "atomic_bw", size: 8, srvResult: true, same: true},
		{name: "atomic_bw", size: 8, cas: true, srvResult: true, same: true},
		{name: "send_bw", size: 4096, srvResult: true},
		{name: "read_lat", size: 64},
		{name: "send_lat", size: 3000, srvResult: true},
		{name: "write_bw", all: true, srvResult: true, same: true},
		{name: "send_lat", all: true, srvResult: true},
		{name: "write_lat", size: 64, srvResult: true},
	}
	for _, c := range cases {
		n := fmt.Sprintf("%s-%d", c.name, c.size)
		if c.cas {
			n += "-cas"
		}
		if c.all {
			n = c.name + "-all"
		}
		t.Run(n, func(t *testing.T) {
			if c.name == "write_lat" && perftestRace {
				t.Skip("write_lat polls memory the peer's WRITEs change, which the race detector reports")
			}
			o := perftestDefaults(c.size, 50)
			o.atomicCAS, o.all = c.cas, c.all
			if c.all {
				o.iters = 5
			}
			sout, cout := runPerftestPair(t, c.name, o)
			re := perftestBWLine
			if strings.HasSuffix(c.name, "_lat") {
				re = perftestLatLine
			}
			sizes := perftestSizes(o)
			cl := re.FindAllStringSubmatch(cout, -1)
			if len(cl) != len(sizes) {
				t.Fatalf("client printed %d result lines, want %d:\n%s", len(cl), len(sizes), cout)
			}
			for i, m := range cl {
				if m[1] != fmt.Sprint(sizes[i]) || m[2] != fmt.Sprint(o.iters) {
					t.Errorf("client result line %q: want size %d, %d iterations", m[0], sizes[i], o.iters)
				}
			}
			sl := re.FindAllStringSubmatch(sout, -1)
			switch {
			case !c.srvResult && len(sl) != 0:
				t.Errorf("server printed results:\n%s", sout)
			case c.srvResult && len(sl) == 0:
				t.Errorf("server printed no result:\n%s", sout)
			case c.same && sl[len(sl)-1][0] != cl[len(cl)-1][0]:
				t.Errorf("server printed %q, not the client's %q", sl[len(sl)-1][0], cl[len(cl)-1][0])
			}
			for _, out := range []string{sout, cout} {
				if !strings.Contains(out, findPerftest(c.name).title(c.cas)) || !strings.Contains(out, " Mtu             : 1024[B]") {
					t.Errorf("header block missing:\n%s", out)
				}
			}
		})
	}
}
