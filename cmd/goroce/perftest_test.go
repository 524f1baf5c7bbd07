package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/perftest"
)

// TestPerftestFlags checks that perftest's options reach package perftest's options as perftest reads
// them (getopt_long: clustered, attached and separate values, long names with = or not, unique
// prefixes, the host anywhere); the runs themselves are package perftest's tests.
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
		{perftest.SendLat, []string{"-a", "-t", "4", "-r", "8", "-F", "-e"}, "", 18515, false,
			mod(perftest.SendLat, func(o *perftest.Options) { o.All, o.TxDepth, o.RxDepth = true, 4, 8 })},
		{perftest.WriteBW, []string{"-q", "4", "-b", "-D", "10", "-f", "2", "--report_gbits", "-N", "-l8", "-I", "64", "-u15", "--tclass=96",
			"--mr_per_qp", "--perform_warm_up", "--report-both", "-w", "1.5", "-y0.2", "-S", "3", "--use_old_post_send", "-timeout=1m", "host"},
			"host", 18515, false, mod(perftest.WriteBW, func(o *perftest.Options) {
				o.QPs, o.Bidirectional, o.Duration, o.Margin, o.ReportGbits, o.NoPeak = 4, true, 10*time.Second, 2*time.Second, true, true
				o.PostList, o.InlineSize, o.Timeout, o.TrafficClass, o.MRPerQP, o.WarmUp, o.ReportBoth = 8, 64, 15, 96, true, true, true
				o.LimitBW, o.LimitMsgRate = 1.5, 0.2
			})},
		// Clustered switches, a unique prefix, a value in hex as strtol reads it.
		{perftest.SendBW, []string{"-abF", "--bidir", "-n", "0x10", "--recv_post_list", "4", "--source_ip", "10.0.0.2", "--dont_xchg_versions"}, "", 18515, false,
			mod(perftest.SendBW, func(o *perftest.Options) {
				o.All, o.Bidirectional, o.Iters, o.RecvPostList, o.NoVersionExchange = true, true, 16, 4, true
				o.SourceIP = netip.MustParseAddr("10.0.0.2")
			})},
		{perftest.ReadBW, []string{"--run_inf", "-D", "3"}, "", 18515, false,
			mod(perftest.ReadBW, func(o *perftest.Options) { o.RunInfinitely, o.Duration = true, 3*time.Second })},
		{perftest.ReadLat, []string{"-U", "-H", "--retry_count", "5", "-L", "64", "--pkey_index=0", "--force-link=Ethernet", "-c", "RC"}, "", 18515, false,
			mod(perftest.ReadLat, func(o *perftest.Options) { o.Histogram, o.Unsorted = true, true })},
	} {
		a, err := parsePerftest(c.test, c.args)
		if err != nil {
			t.Errorf("%s %q: %v", c.test, c.args, err)
			continue
		}
		if a.host != c.host || a.port != c.port || a.stats != c.stats || a.opts != c.opts {
			t.Errorf("%s %q: host %q port %d stats %v options\n%+v; want %q, %d, %v,\n%+v",
				c.test, c.args, a.host, a.port, a.stats, a.opts, c.host, c.port, c.stats, c.opts)
		}
	}
	if a, err := parsePerftest(perftest.WriteBW, []string{"-timeout", "90s", "-p", "9"}); err != nil || a.timeout != 90*time.Second || a.port != 9 {
		t.Errorf("-timeout 90s: %+v, %v", a, err)
	}
	if _, err := parsePerftest(perftest.WriteBW, []string{"-h"}); !errors.Is(err, errHelp) {
		t.Errorf("-h: %v", err)
	}
	if _, err := parsePerftest(perftest.WriteBW, []string{"--version"}); !errors.Is(err, errVersion) {
		t.Errorf("--version: %v", err)
	}
	if findPerftest("ib_send_bw") == nil || *findPerftest("send_bw") != perftest.SendBW || findPerftest("atomic_lat") == nil || findPerftest("loopback") != nil {
		t.Error("findPerftest")
	}
}

// TestPerftestFlagErrors: every option goroce does not take fails with one line that names it and
// says why, never Go's "flag provided but not defined".
func TestPerftestFlagErrors(t *testing.T) {
	for _, c := range []struct {
		test perftest.Test
		args []string
		want string // in the message
	}{
		{perftest.WriteBW, []string{"-Z"}, "unknown flag -Z"},
		{perftest.WriteBW, []string{"--frobnicate"}, "unknown flag --frobnicate"},
		{perftest.WriteBW, []string{"--use"}, "ambiguous"},
		{perftest.WriteBW, []string{"-z"}, "-z (--com_rdma_cm) is not supported"},
		{perftest.WriteBW, []string{"-O"}, "-O (--dualport) is not supported"},
		{perftest.WriteBW, []string{"-T", "3"}, "-T (--tos) is not supported: TOS only valid for rdma_cm"},
		{perftest.WriteBW, []string{"-W", "x"}, "-W (--report-counters) is not supported"},
		{perftest.WriteBW, []string{"--odp"}, "--odp is not supported"},
		{perftest.WriteBW, []string{"--out_json"}, "--out_json is not supported"},
		{perftest.WriteBW, []string{"--rate_limit=5"}, "--rate_limit is not supported"},
		{perftest.WriteBW, []string{"--ipv6"}, "--ipv6 is not supported"},
		{perftest.WriteBW, []string{"-H"}, "-H (--report-histogram) is not an option of ib_write_bw: latency tests only"},
		{perftest.WriteBW, []string{"-o", "4"}, "-o (--outs) is not an option of ib_write_bw"},
		{perftest.ReadBW, []string{"-I", "64"}, "-I (--inline_size) is not an option of ib_read_bw"},
		{perftest.SendLat, []string{"-q", "2"}, "-q (--qp) is not an option of ib_send_lat: bandwidth tests only"},
		{perftest.ReadLat, []string{"-b"}, "-b (--bidirectional) is not an option of ib_read_lat"},
		{perftest.ReadLat, []string{"-C"}, "-C (--report-cycles) is not supported"},
		{perftest.ReadLat, []string{"--latency_gap=5"}, "--latency_gap is not supported"},
		{perftest.SendBW, []string{"--use-srq"}, "--use-srq is not supported"},
		{perftest.SendBW, []string{"-g"}, "-g (--mcg) is not supported"},
		{perftest.WriteBW, []string{"-c", "UC"}, "-c (--connection) UC: goroce perf runs RC QPs"},
		{perftest.WriteBW, []string{"-L", "10"}, "TTL 64"},
		{perftest.WriteBW, []string{"--pkey_index", "1"}, "index 0"},
		{perftest.WriteBW, []string{"--force-link", "IB"}, "Ethernet"},
		{perftest.WriteBW, []string{"-m", "1000"}, "256, 512, 1024, 2048 or 4096"},
		{perftest.WriteBW, []string{"-n", "1"}, "between 5 and"},
		{perftest.WriteBW, []string{"-s", "0"}, "-s (--size)"},
		{perftest.WriteBW, []string{"-q", "0"}, "-q (--qp)"},
		{perftest.WriteBW, []string{"-u", "40"}, "-u (--qp-timeout)"},
		{perftest.WriteBW, []string{"-o"}, "not an option"},
		{perftest.ReadBW, []string{"-o"}, "-o (--outs) needs a value"},
		{perftest.WriteBW, []string{"--all=1"}, "takes no value"},
		{perftest.WriteBW, []string{"-A", "SWAP"}, "not an option of ib_write_bw"},
		{perftest.AtomicBW, []string{"-A", "SWAP"}, "CMP_AND_SWAP or FETCH_AND_ADD"},
		{perftest.AtomicBW, []string{"-a"}, "message size cannot be changed for Atomic tests"},
		{perftest.AtomicLat, []string{"-a"}, "message size cannot be changed for Atomic tests"},
		{perftest.WriteBW, []string{"-D", "5", "-a"}, "duration mode currently doesn't support running on all sizes"},
		{perftest.WriteBW, []string{"-D", "2", "-f", "1"}, "DURATION > 2*MARGIN"},
		{perftest.WriteLat, []string{"--run_infinitely"}, "--run_infinitely is not an option of ib_write_lat"},
		{perftest.WriteBW, []string{"-addr", "x"}, "-addr"},
		{perftest.WriteBW, []string{"-timeout", "soon"}, "-timeout"},
		{perftest.WriteBW, []string{"a", "b"}, `unexpected argument "b"`},
	} {
		_, err := parsePerftest(c.test, c.args)
		var fe *flagError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s %q: %v; want one line with %q", c.test, c.args, err, c.want)
		}
	}
}

// perftestRunCase is one goroce perf server and client run through the command line: the options
// both take (flags), those of one side (srvFlags, cliFlags), and what the client's report holds
// (want) or, for a mismatch, what both sides' errors hold (fail).
type perftestRunCase struct {
	name               string
	test               perftest.Test
	flags              string
	srvFlags, cliFlags string
	want               []string
	lines              int // result lines the client prints
	fail               string
	// measured: in a mismatch, the client's own traffic succeeds and its result line stands; the
	// difference shows only at the end (a unidirectional send_bw client against a -b server).
	measured bool
	// pcap: the client writes its packets with -pcap; every one must be in the file, ICRC verified.
	pcap bool
}

// perftestGarbage matches a result line whose size or count no run has: what perftest prints when
// it reads a key message as a report.
var perftestGarbage = regexp.MustCompile(`(?m)^ \d{10,}\s+\d+|^ \d+\s+\d{11,}\s`)

// perftestResultLine matches a bandwidth, latency or timed latency result line.
var perftestResultLine = regexp.MustCompile(`(?m)^ \d+ +\d+ +\d+\.\d{2}`)

// TestPerftestCommand runs goroce perf <test> against itself over loopback sockets, each new mode of
// issue 16 through perftest's command line: the client's report says what the flags asked for, and a
// setting that differs ends both sides with an error that names it and prints no result.
func TestPerftestCommand(t *testing.T) {
	listening := make(map[string]chan net.Addr)
	var mu sync.Mutex
	perftestListening = func(a net.Addr) {
		mu.Lock()
		ch := listening[a.(*net.TCPAddr).IP.String()]
		mu.Unlock()
		ch <- a
	}
	t.Cleanup(func() { perftestListening = nil })
	cases := []perftestRunCase{
		{name: "write_bw-q2-b-gbits", test: perftest.WriteBW,
			flags: "-s 4096 -n 20 -m 1024 -x 1 -q 2 -b --report_gbits -N -l 4 -I 64 --tclass 96 -u 18 --mr_per_qp --use_old_post_send -S 3 -L 64 -F",
			want:  []string{"RDMA_Write Bidirectional BW Test", " Number of qps   : 2", "BW average[Gb/sec]", " Max inline data : 64[B]"}, lines: 1},
		{name: "send_bw-a", test: perftest.SendBW, flags: "-a -n 5 -m 4096", want: []string{"Send BW Test", " 8388608    5 "}, lines: 23},
		{name: "read_bw-a-q2", test: perftest.ReadBW, flags: "-a -n 5 -q 2 -o 16", want: []string{"RDMA_Read BW Test", " Outstand reads  : 16"}, lines: 23},
		{name: "atomic_lat-cas", test: perftest.AtomicLat, flags: "-n 20 -A CMP_AND_SWAP", want: []string{"Atomic CMP_AND_SWAP Latency Test", " 8       20 "}, lines: 1},
		{name: "read_bw-D1", test: perftest.ReadBW, flags: "-D 1 -s 4096", want: []string{"RDMA_Read BW Test", "0.00               "}, lines: 1},
		{name: "read_lat-H-U", test: perftest.ReadLat, flags: "-n 10 -s 64 -H -U", want: []string{"#, usec"}, lines: 1},
		{name: "write_bw-q-mismatch", test: perftest.WriteBW, flags: "-s 4096 -n 20", cliFlags: "-q 2", fail: "-q differs"},
		{name: "send_bw-b-mismatch", test: perftest.SendBW, flags: "-s 4096 -n 20", srvFlags: "-b", fail: "-b differs", measured: true},
		{name: "write_bw-s-mismatch", test: perftest.WriteBW, flags: "-n 20", srvFlags: "-s 4096", cliFlags: "-s 8192", fail: "-s or -a differ"},
		{name: "write_bw-pcap", test: perftest.WriteBW, flags: "-s 65536 -n 10 -m 4096", pcap: true,
			want: []string{"RDMA_Write BW Test"}, lines: 1},
	}
	for i, c := range cases {
		srvIP := fmt.Sprintf("127.0.%d.1", 160+i)
		cliIP := fmt.Sprintf("127.0.%d.2", 160+i)
		ch := make(chan net.Addr, 1)
		mu.Lock()
		listening[srvIP] = ch
		mu.Unlock()
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			port := freePort(t, srvIP)
			common := append([]string{"-p", strconv.Itoa(port), "-timeout", "30s"}, strings.Fields(c.flags)...)
			srvArgs := append(append(slices.Clone(common), "--source_ip", srvIP), strings.Fields(c.srvFlags)...)
			cliArgs := append(append(slices.Clone(common), "--source_ip", cliIP, srvIP), strings.Fields(c.cliFlags)...)
			pcap := filepath.Join(t.TempDir(), "client.pcapng")
			if c.pcap {
				cliArgs = append(cliArgs, "-pcap", pcap)
			}
			var sout, serr, cout, cerr bytes.Buffer
			done := make(chan error, 1)
			go func() { done <- perftestMain(ctx, c.test, srvArgs, &sout, &serr) }()
			select {
			case <-ch:
			case err := <-done:
				t.Fatalf("the server ended before it listened: %v\n%s%s", err, sout.String(), serr.String())
			}
			cerrV := perftestMain(ctx, c.test, cliArgs, &cout, &cerr)
			serrV := <-done
			out := "client:\n" + cout.String() + cerr.String() + "\nserver:\n" + sout.String() + serr.String()
			if c.fail != "" {
				if cerrV == nil || serrV == nil {
					t.Fatalf("client %v, server %v: want both to fail\n%s", cerrV, serrV, out)
				}
				if !strings.Contains(cerr.String()+serr.String(), c.fail) {
					t.Errorf("neither side says %q:\n%s", c.fail, out)
				}
				for _, e := range []string{cerr.String(), serr.String()} {
					if strings.Count(e, "\n") != 1 {
						t.Errorf("the error is not one line: %q", e)
					}
				}
				if !c.measured && (perftestResultLine.MatchString(cout.String()) || perftestResultLine.MatchString(sout.String())) {
					t.Errorf("a result line was printed:\n%s", out)
				}
				if m := perftestGarbage.FindString(cout.String() + sout.String()); m != "" {
					t.Errorf("garbage result line %q:\n%s", m, out)
				}
				return
			}
			if cerrV != nil || serrV != nil {
				t.Fatalf("client %v, server %v\n%s", cerrV, serrV, out)
			}
			for _, w := range c.want {
				if !strings.Contains(cout.String(), w) {
					t.Errorf("the client's report lacks %q:\n%s", w, out)
				}
			}
			if n := len(perftestResultLine.FindAllString(cout.String(), -1)); n != c.lines {
				t.Errorf("the client printed %d result lines, want %d:\n%s", n, c.lines, out)
			}
			if c.pcap {
				var dumped bytes.Buffer
				total, ok := dump(&dumped, dumpOptions{}, pcap)
				// 10 WRITEs of 16 packets and the exchange's ACKs at least, every ICRC verified.
				if !ok || total.roce < 10*16 || total.icrcOK != total.roce || !strings.Contains(cerr.String(), "wrote ") {
					t.Errorf("-pcap: %s\n%s\n%s", total.line(), lastLines(dumped.String(), 5), cerr.String())
				}
			}
		})
	}
}

// freePort returns a TCP port free on ip at the time of the call.
func freePort(t *testing.T, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp4", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
